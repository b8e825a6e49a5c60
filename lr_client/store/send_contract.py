"""Part of the queue store contract, split by role: what each caller needs of the store.

Callers type against the role(s) they play (:class:`Shipping` for a sender session's
reads, :class:`Receiving` for a sink's receiver, :class:`Replays` for ``lr replay``, ...);
:class:`QueueStore` combines them all and is what :func:`~lr_client.store.open_store`
returns. Methods that take a ``conn`` run inside the caller's transaction (the
application's, or a subscriber's) and commit or roll back with it; the others run their
own short transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    Backlog,
    CascadeRoute,
    Cursor,
    DropRecord,
    EntryRef,
    Fence,
    LogRange,
    NewLogEntry,
    SendEntry,
    StreamStop,
)
from lr_client.store.watches import Watch


class Sites(Protocol):
    """The sites this database knows, by number: destinations and sources."""

    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        """Register sites as possible destinations; return {site_id: site number}."""

    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        """The registered sites."""

    def site_name(self, num: int) -> str:
        """The site id of a site number (``#<num>`` if it is not registered)."""


class SendLog(Protocol):
    """The application's transmit path: append entries in the caller's transaction."""

    def append_log_entries(
        self, conn: Connection, client_name: str, messages: Sequence[NewLogEntry]
    ) -> list[EntryRef]:
        """Append validated entries (payload, destination site numbers); one ref each.

        Positions are assigned in commit order, so a reader that has read up to
        position ``p`` never later finds a committed entry below ``p`` (I1).
        On PostgreSQL they are given after commit (the refs carry none).
        """

    def positions_of(self, refs: Sequence[EntryRef]) -> list[int | None]:
        """The positions of entries transmitted earlier; None where not known.

        SQLite knows a position at insert (the ref carries it). On PostgreSQL
        it is known once the transaction has committed and been sequenced:
        None before, for an entry whose transaction rolled back, and for one
        trim has removed since."""

    def sequence(self) -> int:
        """Give positions to what committed since the last call (PostgreSQL); how many.

        Readers call it themselves; SQLite assigns positions at insert (0).
        """

    def head_position(self, conn: Connection | None = None) -> int:
        """The highest position assigned so far (0 if none)."""

    def flow_state(self, client_name: str) -> tuple[bool, list[str]]:
        """(backpressure on, slow destinations) for a client, as retention set it."""

    def transmit_route(self, client_name: str) -> CascadeRoute | None:
        """Where a cascaded client may be transmitted here: its origin (the root), this
        node's role and the set's nodes as the root recorded them
        (:meth:`Cascading.apply_cascade_config`); None if it is not cascaded here."""

    def analyze(self) -> None:
        """Refresh the planner's statistics of the send queue (where the backend has them)."""


class Shipping(Protocol):
    """A sender session's reads of the send log, and its cursors."""

    def watch_sends(self, wake: Callable[[], None]) -> Watch | None:
        """Call ``wake`` (from a thread of its own) whenever entries may have come for the
        sender sessions (a transmit committed, snapshot entries or a snapshot's state
        written), until the watch is closed; None where the backend cannot tell (the
        sessions poll). A wake-up may be spurious or coalesced with others, never
        needed for correctness: see :mod:`lr_client.store.watches`."""

    def read_log_entries(
        self,
        destination: str,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
        up_to: int | None = None,
    ) -> list[SendEntry]:
        """Entries tagged ``lrq_logentry_<destination>`` after ``after``, in position order."""

    def read_client_log(
        self, client_name: str, after: int, limit: int, max_bytes: int | None = None
    ) -> LogRange:
        """Log entries of a client after ``after``, in order, for every destination.

        Like every read of entries, it returns at most ``limit`` entries and,
        past the first, no more than ``max_bytes`` (payloads plus a fixed
        overhead each), and loads no large payload of an entry beyond that.

        Each entry's ``destinations`` names the sites it was transmitted to. A
        reader shared by the sender sessions reads a range once with it and
        hands each session the entries addressed to its destination.
        """

    def oldest_position(self, client_name: str | None = None) -> int | None:
        """The lowest position still in the send queue, or None if it is empty."""

    def get_cursor(self, destination: str, client_name: str) -> Cursor:
        """The acknowledged position of one stream (0 if it never acked)."""

    def list_cursors(self) -> list[Cursor]:
        """All cursors."""

    def set_cursor(
        self,
        destination: str,
        client_name: str,
        position: int,
        *,
        needs_snapshot: bool | None = None,
        fence: Fence | None = None,
    ) -> None:
        """Record how far a destination has acknowledged (or where a full sync restarts it).

        With ``fence``, only while the fence's lease is still held: otherwise
        :class:`~lr_client.errors.FencedError` and nothing is written.
        """

    def backlog(self, destination: str, client_name: str) -> Backlog:
        """Unacknowledged log entries of one stream."""

    def log_streams(self, after: int = 0) -> tuple[set[tuple[str, str]], int]:
        """The (destination, client) pairs of the entries after ``after``, and the highest
        position read (``after`` if none): positions commit in order, so a caller can go
        on from there."""


class Retention(Protocol):
    """What the send queue keeps: trim, dropped and stopped streams, flow control."""

    #: PostgreSQL: seconds a send queue slot stays current before a trim closes it.
    rotation_period: float
    #: PostgreSQL: slots are added while the others are pinned, up to this many.
    max_slots: int

    def trim(
        self, batch_size: int = 5000, max_batches: int | None = None, fence: Fence | None = None
    ) -> int:
        """Delete entries every destination has acknowledged, and release the entries
        of ended snapshots still stored; return how many.

        With ``fence``, the trim runs only while its lease is held (else
        :class:`~lr_client.errors.FencedError` and nothing is deleted).

        SQLite deletes log entries as rows, at most ``batch_size`` per transaction
        and ``max_batches`` transactions. PostgreSQL retires every closed slot
        whose entries each destination has passed, whatever the batch bounds.

        A client this site is the root of a cascade of (``lrq_cascade``) is trimmed
        only at or below its stored global watermark
        (:meth:`CascadeReports.set_global_watermark`), whatever was acknowledged.
        """

    def drop_stream(
        self,
        destination: str,
        client_name: str,
        reason: str,
        first_dropped_position: int | None = None,
    ) -> DropRecord | None:
        """Release a destination's backlog (it will be re-synced by a full sync).

        The drop record's first dropped position is the cursor's successor
        unless ``first_dropped_position`` says otherwise.
        """

    def list_drops(self, destination: str | None = None) -> list[DropRecord]:
        """Current drop records (of one destination, if given)."""

    def clear_drop(self, destination: str, client_name: str) -> None:
        """Forget a drop record once the destination has been re-synced."""

    def trimmed_through(self, destination: str, client_name: str) -> int:
        """The highest position trim deleted among the stream's entries (0: none)."""

    def stop_stream(
        self, destination: str, client_name: str, reason: str, resume_after: int
    ) -> bool:
        """Record a stopped stream; False if it was already recorded."""

    def get_stream_stop(self, destination: str, client_name: str) -> StreamStop | None:
        """The stream's stop record, if it is stopped."""

    def list_stream_stops(self) -> list[StreamStop]:
        """Every stop record."""

    def accept_stream_loss(self, destination: str, client_name: str) -> StreamStop | None:
        """Mark a stopped stream's loss accepted (the session then resumes it)."""

    def mark_stream_resumed(self, destination: str, client_name: str) -> None:
        """The sink was told of an accepted loss; the stop record stays as a record."""

    def clear_stream_stop(self, destination: str, client_name: str) -> None:
        """Forget a stop record once the stream runs again."""

    def set_flow_state(self, client_name: str, backpressure: bool, slow: Sequence[str]) -> None:
        """Record a client's backpressure and slow destinations (the transmit path reads it)."""


__all__ = ["Retention", "SendLog", "Shipping", "Sites"]
