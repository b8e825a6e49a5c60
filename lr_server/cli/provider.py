"""``lr provider switch``: a cascaded client's provider at this node (docs/cascading.md)."""

from __future__ import annotations

from pathlib import Path

import click

from lr_client.errors import LRError
from lr_server.cli.database import open_site_store
from lr_server.cli.errors import EXIT_FAILED, fail, first_line
from lr_server.cli.options import config_option, json_option
from lr_server.cli.render import print_json
from lr_server.config import CascadeRole, SiteConfig, load_config


@click.group()
def provider() -> None:
    """A cascaded client's provider at this node (docs/cascading.md)."""


def check_switch(config: SiteConfig, client: str, to: str) -> str:
    """The set's current configured provider of this site, or a usage error naming the
    option: the client must be cascaded here, this site not its root, ``to`` a node of
    the set other than this site and not below it (no cycle), and in ``[[sources]]``
    with an ``address``."""
    cascade = config.cascade(client)
    if cascade is None:
        raise click.BadParameter(
            f"{client!r} is not a cascaded client of this site (no [cascade.{client}])",
            param_hint="--client",
        )
    if config.id == cascade.root:
        raise click.BadParameter(
            f"{config.id} is the root of {client}: it has no provider", param_hint="--client"
        )
    members = cascade.members()
    if to not in members:
        raise click.BadParameter(
            f"{to!r} is not a node of the set of {client} (nodes: {', '.join(members)})",
            param_hint="--to",
        )
    if to == config.id:
        raise click.BadParameter(f"{to} cannot be its own provider", param_hint="--to")
    at = to
    while at != cascade.root:
        at = cascade.nodes[at]
        if at == config.id:
            raise click.BadParameter(
                f"{to} receives {client} through {config.id}: switching to it would make a cycle",
                param_hint="--to",
            )
    if cascade.role_of(to) is CascadeRole.LEAF:
        raise click.BadParameter(
            f"{to} is a leaf of {client}: it keeps no copy to provide from (name it in "
            f"cascade.{client}.branches)",
            param_hint="--to",
        )
    source = config.source(to)
    if source is None or not source.address:
        raise click.BadParameter(
            f"{to} must be in [[sources]] with its address (sources.address) to provide "
            f"{client} here",
            param_hint="--to",
        )
    return cascade.provider_of(config.id)


@provider.command("switch")
@config_option
@click.option("--client", required=True, help="The cascaded client.")
@click.option("--to", "to", required=True, help="The node to receive it from.")
@json_option
def provider_switch(config_path: Path, client: str, to: str, as_json: bool) -> None:
    """Receive CLIENT from the node TO from now on (epoch + 1), and tell TO.

    Recorded in the database: it survives restarts (until the configuration names
    another provider). TO adopts this node when it gets the report (the running
    server repeats it every replication.cascade_report_interval) and resumes the
    stream after this node's position, or sends a full sync if it no longer holds
    the entries after it. The old provider, if alive, is refused and lets go.
    """
    from lr_server.cascade_control import make_report
    from lr_server.transport.grpc_client import call_cascade

    config = load_config(config_path)
    check_switch(config, client, to)
    with open_site_store(config) as store:
        before = store.cascade_node(client)
        if before is None:
            fail(f"{client} is not cascaded in the database yet: start `lr server` once first")
        if before.provider_id == to:
            fail(f"{to} already provides {client} here (epoch {before.epoch})")
        epoch = store.switch_cascade_provider(client, to)
        node = store.cascade_node(client)
        assert epoch is not None and node is not None
        report = make_report(store, config.id, node, config.replication.cascade_grace)
    source = config.source(to)
    assert source is not None
    told = ""
    try:
        reply = call_cascade(config.id, source, config.security, report, timeout=10.0)
    except LRError as exc:
        told = first_line(exc)
        reply = None
    result = {
        "client": client,
        "provider": to,
        "previous_provider": before.provider_id,
        "epoch": epoch,
        "local_watermark": report.local_watermark,
        "adopted": reply is not None,
        "global_watermark": None if reply is None else reply.global_watermark,
        "error": told or None,
    }
    if as_json:
        print_json(result)
    else:
        click.echo(
            f"{client}: provider {before.provider_id} -> {to} (epoch {epoch}); "
            + (
                f"{to} adopted this node at position {report.applied_position}"
                if reply is not None
                else f"{to} did not answer ({told}); the running server reports to it"
            )
        )
    if reply is None:
        raise click.exceptions.Exit(EXIT_FAILED)
