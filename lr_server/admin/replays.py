"""Replays: a stream's retained entries shipped again to one destination (``lr replay``),
or delivered again from a sink's receive queue (``lr rewind``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lr_server.admin.checks import check_stream
from lr_server.admin.errors import AdminInputError, FullSyncNeededError, StateError
from lr_server.sending.replay import trimmed_message

if TYPE_CHECKING:
    from lr_client.store import QueueStore
    from lr_client.store.recv.replay_contract import ReplayRequest, Rewind
    from lr_server.config import SiteConfig


def replay(
    config: SiteConfig, store: QueueStore, destination: str, client: str, from_position: int
) -> ReplayRequest:
    """Ask the running server to ship ``client``'s entries to ``destination`` again, from
    ``from_position`` (inclusive) through the position the destination has acknowledged
    when the server picks the request up (``lr replay``); the request as recorded.

    The sink queues them again and its listener gets them with ``message.replayed``
    True; other destinations and clients are not touched. The request is a row of
    ``lrq_replays``: it survives a restart, and ``lr status`` shows it until it is
    done or refused.

    Raises :class:`AdminInputError` if the site does not replicate ``client`` to
    ``destination`` or ``from_position`` is below 1 or past what the destination
    acknowledged, :class:`FullSyncNeededError` if trim deleted entries at or after
    ``from_position`` (a full sync is needed: ``lr snapshot request``).
    """
    check_stream(config, destination, client)
    if isinstance(from_position, bool) or not isinstance(from_position, int) or from_position < 1:
        raise AdminInputError(f"position must be 1 or more, not {from_position!r}", "from")
    trimmed = store.retention.trimmed_through(destination, client)
    if trimmed >= from_position:
        raise FullSyncNeededError(trimmed_message(destination, client, from_position, trimmed))
    acked = store.shipping.get_cursor(destination, client).position
    if from_position > acked:
        raise AdminInputError(
            f"{destination} acknowledged {client} through position {acked}; entries from "
            f"{from_position} on are shipped to it in their turn, once",
            "from",
        )
    return store.replays.request_replay(destination, client, from_position)


def list_replays(store: QueueStore, open_only: bool = True) -> list[ReplayRequest]:
    """The replay requests (``open_only``: those not done or refused yet), oldest first."""
    return store.replays.list_replays(open_only=open_only)


def rewind(
    config: SiteConfig, store: QueueStore, source: str, client: str, to_position: int
) -> Rewind:
    """At a sink: deliver again the log entries of ``client`` from ``source`` that were
    delivered from ``to_position`` on (``lr rewind``), flagged replayed; what it did.

    Only what the receive queue still holds can be delivered again: SQLite deletes
    entries as it delivers them (nothing to rewind, unless the queue is relayed),
    PostgreSQL keeps them until rotation retires their partition
    (``receiver.rotation_period``). Other queues are not touched.

    Raises :class:`AdminInputError` if the site does not accept ``source`` or
    ``to_position`` is below 1, :class:`StateError` if the queue does not hold every
    delivered entry from ``to_position`` on (the source can still ship them again:
    ``lr replay`` there), a full sync or drop notice lies in the range, or the queue is
    delivered by partition or in the middle of a full sync.
    """
    if config.source(source) is None:
        known = ", ".join(s.id for s in config.sources) or "none"
        raise AdminInputError(
            f"{source!r} is not a source of site {config.id} (configured: {known})", "source"
        )
    if isinstance(to_position, bool) or not isinstance(to_position, int) or to_position < 1:
        raise AdminInputError(f"position must be 1 or more, not {to_position!r}", "to")
    done = store.replays.rewind_receive_queue(source, client, to_position)
    if done.refused:
        raise StateError(f"{done.refused}; the source can ship it again: lr replay")
    return done
