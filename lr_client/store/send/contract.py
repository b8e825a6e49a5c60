"""The send side's roles: the application's transmit path and the sessions' reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    Backlog,
    CascadeRoute,
    Cursor,
    EntryRef,
    Fence,
    LogRange,
    NewLogEntry,
    SendEntry,
)
from lr_client.store.watches import Watch


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

    @property
    def every_send_wakes(self) -> bool:
        """Whether that watch rings for every committed transmit, soon after its commit
        (SQLite: each write of the file is looked at), not for some of them only
        (PostgreSQL: a process notifies at most once per ``NOTIFY_INTERVAL``)."""

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

    def backlogs(self, streams: Sequence[tuple[str, str]]) -> list[Backlog]:
        """:meth:`backlog` of each (destination, client) stream, in their order: the
        queue sequenced once and one transaction for them all."""

    def log_streams(self, after: int = 0) -> tuple[set[tuple[str, str]], int]:
        """The (destination, client) pairs of the entries after ``after``, and the highest
        position read (``after`` if none): positions commit in order, so a caller can go
        on from there."""


__all__ = ["SendLog", "Shipping"]
