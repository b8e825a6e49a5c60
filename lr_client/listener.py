"""What the sink application implements: a listener and the messages it receives."""

from __future__ import annotations

import abc
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lr_client.headers import EMPTY
from lr_client.records import ReplicationType

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger("lr_client.subscriber")


@dataclass(frozen=True, slots=True)
class RoutingQueueMessage:
    """One replicated entry as the listener sees it.

    ``source_position`` is the entry's position in the source's log (for a
    snapshot entry: its ordinal in the snapshot ``snapshot_id``); together with
    ``source_id`` and ``client_name`` it identifies the entry.
    """

    payload: bytes
    source_id: str
    client_name: str
    source_position: int
    type: ReplicationType
    snapshot_id: str = ""
    #: The partition key the source gave the entry (None: none).
    key: bytes | None = None
    #: The headers the source gave the entry: a read-only mapping, empty when none.
    headers: Mapping[str, str] = field(default_factory=lambda: EMPTY, hash=False)
    #: Delivered again on an operator's request (``lr replay`` at the source, ``lr
    #: rewind`` here): the listener applied it before. False for every other entry.
    replayed: bool = False


class RoutingQueueListener(abc.ABC):
    """Receives one client's entries from every source, in order, exactly once.

    Each callback gets ``session``, an ORM session joined to the transaction
    that marks the delivered entries delivered: whatever the listener writes
    with it commits together with that mark, or not at all. ``session.commit()``
    inside a callback does not commit early (it only flushes); the subscriber
    commits after the callbacks return.

    Per source, the listener sees ``on_full_sync_start``, any number of
    ``process_full_sync`` batches, ``on_full_sync_end``, then
    ``process_log_entries`` batches, each in source order; a batch holds one
    type only. ``on_stream_dropped`` comes first when the source dropped the
    stream (a full sync, or after an accepted loss a gap, follows). A second
    ``on_full_sync_start`` without an ``on_full_sync_end``
    means the earlier snapshot was superseded: the listener should discard
    what it staged for it. Snapshot entries may overlap log entries delivered
    later (the source replays from the snapshot's base position), so applying
    an entry must be idempotent per key.

    Returning False from ``process_*`` (or raising from any callback) rolls
    the whole transaction back; the same entries come again after a backoff
    and :meth:`on_error` is told why.

    ``on_full_sync_start`` and ``on_full_sync_end`` are told the snapshot's
    ``base_position`` when their override takes a parameter of that name (or
    ``**kwargs``); an override with the older signature
    ``(session, source_id, snapshot_id)`` is called as before.
    """

    def on_full_sync_start(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        """A full sync from ``source_id`` begins (no-op by default).

        ``base_position``: the source position the snapshot reflects; the log
        entries that follow it start after it. None when it is not known: a
        snapshot delivered as it arrives (``snapshot_delivery="streaming"``)
        whose entries do not carry it (a source of an earlier release, or a
        base of 0) and whose end has not arrived, or entries queued before
        this release. :meth:`on_full_sync_end` is told it but in the last case.
        """
        return None

    @abc.abstractmethod
    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        """Apply one batch of snapshot entries; return True to commit it."""

    def on_full_sync_end(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        """The full sync ``snapshot_id`` is complete (no-op by default).

        ``base_position``: as for :meth:`on_full_sync_start`; the next log
        entries of ``source_id`` come from after it.
        """
        return None

    @abc.abstractmethod
    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        """Apply one batch of log entries; return True to commit it."""

    def on_stream_dropped(
        self, session: Session, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        """Entries of ``source_id`` from ``first_dropped_position`` on may never arrive.

        The source dropped this stream: it fell behind what the source still
        holds, or the source was restored to an older state. A full sync
        usually follows (``on_full_sync_start``); without a snapshot provider,
        log entries resume after an operator accepted the loss. Delivered once,
        in the stream's order, in the delivery transaction (no-op by default).
        """
        return None

    def on_error(self, error: BaseException) -> None:
        """A delivery failed and will be retried (logs a warning by default).

        Called outside the delivery transaction, after its rollback.
        """
        log.warning("routing queue delivery failed: %s", error)


def takes_base_position(callback: Callable[..., object]) -> bool:
    """Whether a listener callback accepts ``base_position`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it the older way
        return False
    return any(p.name == "base_position" or p.kind is p.VAR_KEYWORD for p in params)


__all__ = ["RoutingQueueListener", "RoutingQueueMessage", "takes_base_position"]
