"""Replays: a stream's retained entries shipped again to one destination (``lr replay``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lr_server.admin.checks import check_stream
from lr_server.admin.errors import AdminInputError, FullSyncNeededError
from lr_server.replay import trimmed_message

if TYPE_CHECKING:
    from lr_client.store import QueueStore
    from lr_client.store.replay_contract import ReplayRequest
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
    trimmed = store.trimmed_through(destination, client)
    if trimmed >= from_position:
        raise FullSyncNeededError(trimmed_message(destination, client, from_position, trimmed))
    acked = store.get_cursor(destination, client).position
    if from_position > acked:
        raise AdminInputError(
            f"{destination} acknowledged {client} through position {acked}; entries from "
            f"{from_position} on are shipped to it in their turn, once",
            "from",
        )
    return store.request_replay(destination, client, from_position)


def list_replays(store: QueueStore, open_only: bool = True) -> list[ReplayRequest]:
    """The replay requests (``open_only``: those not done or refused yet), oldest first."""
    return store.list_replays(open_only=open_only)
