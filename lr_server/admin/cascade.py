"""A cascaded client's provider at this node switched (``lr provider switch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lr_client.errors import LRError
from lr_server.admin.checks import check_switch
from lr_server.admin.errors import NotFoundError, StateError
from lr_server.admin.records import ProviderSwitch

if TYPE_CHECKING:
    from lr_client.store import QueueStore
    from lr_server.config import SiteConfig


def switch_provider(
    config: SiteConfig, store: QueueStore, client: str, to: str, *, timeout: float = 10.0
) -> ProviderSwitch:
    """Receive ``client`` from the node ``to`` from now on (epoch + 1), and tell ``to``.

    Recorded in the database first: it survives restarts (until the config names
    another provider). ``to`` is then sent this node's report (gRPC, up to
    ``timeout`` seconds); ``adopted`` says whether it answered, ``error`` why not
    (the running server repeats the report every
    ``replication.cascade_report_interval``).

    Raises :class:`AdminInputError` for a switch the config forbids,
    :class:`NotFoundError` if the client is not cascaded in the database yet,
    :class:`StateError` if ``to`` already provides it here.
    """
    from lr_server.cascade.control import make_report
    from lr_server.transport.grpc_client import call_cascade

    check_switch(config, client, to)
    before = store.cascade.cascade_node(client)
    if before is None:
        raise NotFoundError(
            f"{client} is not cascaded in the database yet: start `lr server` once first"
        )
    if before.provider_id == to:
        raise StateError(f"{to} already provides {client} here (epoch {before.epoch})")
    epoch = store.cascade_reports.switch_cascade_provider(client, to)
    node = store.cascade.cascade_node(client)
    if epoch is None or node is None:
        raise NotFoundError(f"{client} is no longer cascaded in the database")
    report = make_report(store, config.id, node, config.replication.cascade_grace)
    source = config.source(to)
    assert source is not None  # check_switch
    error = ""
    try:
        reply = call_cascade(config.id, source, config.security, report, timeout=timeout)
    except LRError as exc:
        error = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        reply = None
    return ProviderSwitch(
        client=client,
        provider=to,
        previous_provider=before.provider_id,
        epoch=epoch,
        local_watermark=report.local_watermark,
        adopted=reply is not None,
        global_watermark=None if reply is None else reply.global_watermark,
        error=error or None,
        applied_position=report.applied_position,
    )
