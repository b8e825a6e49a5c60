"""The queue store contract: what sessions, receivers and subscribers need.

Methods that take a ``conn`` run inside the caller's transaction (the
application's, or a subscriber's) and commit or roll back with it; the others
run their own short transactions.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from sqlalchemy.engine import Connection, Engine

from lr_client.records import (
    Backlog,
    Cursor,
    DropRecord,
    QueueInfo,
    RecvEntry,
    SendEntry,
    SinkDrop,
    SinkProgress,
    SnapshotRequest,
    SnapshotStatus,
    StreamStop,
    WireEntry,
)


class QueueStore(abc.ABC):
    """Routing queues, stream tags and replication metadata in one database."""

    engine: Engine
    dialect: str

    # -- schema and sites -------------------------------------------------
    @abc.abstractmethod
    def create_schema(self) -> None:
        """Create every table (idempotent)."""

    @abc.abstractmethod
    def check_schema(self) -> None:
        """Raise :class:`~lr_client.errors.SchemaError` unless the schema is ours and current."""

    @abc.abstractmethod
    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        """Register sites as possible destinations; return {site_id: site number}."""

    @abc.abstractmethod
    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        """The registered sites."""

    # -- send side ------------------------------------------------------------
    @abc.abstractmethod
    def append_log_entries(
        self, conn: Connection, client_name: str, messages: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[int]:
        """Append validated entries (payload, destination site numbers); return positions.

        Positions are assigned in commit order, so a reader that has read up to
        position ``p`` never later finds a committed entry below ``p`` (I1).
        """

    @abc.abstractmethod
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

    @abc.abstractmethod
    def head_position(self, conn: Connection | None = None) -> int:
        """The highest position assigned so far (0 if none)."""

    @abc.abstractmethod
    def read_client_log(
        self, client_name: str, after: int, limit: int, max_bytes: int | None = None
    ) -> list[SendEntry]:
        """Log entries of a client after ``after``, in order, for every destination.

        Like every read of entries, it returns at most ``limit`` entries and,
        past the first, no more than ``max_bytes`` (payloads plus a fixed
        overhead each), and loads no large payload of an entry beyond that.

        Each entry's ``destinations`` names the sites it was transmitted to. A
        reader shared by the sender sessions reads a range once with it and
        hands each session the entries addressed to its destination.
        """

    @abc.abstractmethod
    def oldest_position(self, client_name: str | None = None) -> int | None:
        """The lowest position still in the send queue, or None if it is empty."""

    @abc.abstractmethod
    def get_cursor(self, destination: str, client_name: str) -> Cursor:
        """The acknowledged position of one stream (0 if it never acked)."""

    @abc.abstractmethod
    def list_cursors(self) -> list[Cursor]:
        """All cursors."""

    @abc.abstractmethod
    def set_cursor(
        self,
        destination: str,
        client_name: str,
        position: int,
        *,
        needs_snapshot: bool | None = None,
    ) -> None:
        """Record how far a destination has acknowledged (or where a full sync restarts it)."""

    @abc.abstractmethod
    def backlog(self, destination: str, client_name: str) -> Backlog:
        """Unacknowledged log entries of one stream."""

    # -- snapshots ------------------------------------------------------------
    @abc.abstractmethod
    def request_snapshot(
        self, conn: Connection | None, destination: str, client_name: str, reason: str = ""
    ) -> str:
        """Record a snapshot request (cancelling any open one of the stream); return its id."""

    @abc.abstractmethod
    def get_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        """One snapshot request."""

    @abc.abstractmethod
    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
    ) -> list[SnapshotRequest]:
        """Snapshot requests, newest first."""

    @abc.abstractmethod
    def open_snapshots(
        self, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        """The open (requested, running or ready) request of each client that has one."""

    @abc.abstractmethod
    def update_snapshot(
        self,
        snapshot_id: str,
        *,
        expect: Sequence[SnapshotStatus] | None = None,
        **values: object,
    ) -> bool:
        """Update a request if its status is in ``expect``; return whether it was updated."""

    @abc.abstractmethod
    def start_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        """REQUESTED -> RUNNING, fixing ``base_position``; None if no longer requested."""

    @abc.abstractmethod
    def heartbeat_snapshot(self, snapshot_id: str) -> bool:
        """Record that the worker of a RUNNING request is alive; False if it is not running."""

    @abc.abstractmethod
    def fail_stalled_snapshot(self, snapshot_id: str, silent_since: float, reason: str) -> bool:
        """RUNNING -> FAILED if its worker was last heard of before ``silent_since``.

        ``silent_since`` is a wall-clock time (``time.time()``). Entries the
        worker wrote are released. Returns whether the request was failed.
        """

    @abc.abstractmethod
    def write_snapshot_entries(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        payloads: Sequence[bytes],
        first_seq: int = 0,
    ) -> int:
        """Write one part of a snapshot idempotently (re-writing a part replaces it)."""

    @abc.abstractmethod
    def finish_snapshot(self, snapshot_id: str) -> int:
        """Write the end marker with the entry count and mark the snapshot READY."""

    @abc.abstractmethod
    def cancel_snapshot(self, snapshot_id: str, reason: str = "cancelled") -> bool:
        """Cancel an open snapshot and release its entries."""

    @abc.abstractmethod
    def read_snapshot_entries(
        self, snapshot_id: str, after: int, limit: int, max_bytes: int | None = None
    ) -> list[SendEntry]:
        """Entries of a READY snapshot after ``after`` (ordinal positions), end marker last."""

    # -- trim and retention ------------------------------------------------
    @abc.abstractmethod
    def trim(self, batch_size: int = 5000, max_batches: int | None = None) -> int:
        """Delete entries every destination has acknowledged; return how many."""

    @abc.abstractmethod
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

    @abc.abstractmethod
    def list_drops(self, destination: str | None = None) -> list[DropRecord]:
        """Current drop records (of one destination, if given)."""

    @abc.abstractmethod
    def clear_drop(self, destination: str, client_name: str) -> None:
        """Forget a drop record once the destination has been re-synced."""

    @abc.abstractmethod
    def trimmed_through(self, destination: str, client_name: str) -> int:
        """The highest position trim deleted among the stream's entries (0: none)."""

    @abc.abstractmethod
    def stop_stream(
        self, destination: str, client_name: str, reason: str, resume_after: int
    ) -> bool:
        """Record a stopped stream; False if it was already recorded."""

    @abc.abstractmethod
    def get_stream_stop(self, destination: str, client_name: str) -> StreamStop | None:
        """The stream's stop record, if it is stopped."""

    @abc.abstractmethod
    def list_stream_stops(self) -> list[StreamStop]:
        """Every stop record."""

    @abc.abstractmethod
    def accept_stream_loss(self, destination: str, client_name: str) -> StreamStop | None:
        """Mark a stopped stream's loss accepted (the session then resumes it)."""

    @abc.abstractmethod
    def mark_stream_resumed(self, destination: str, client_name: str) -> None:
        """The sink was told of an accepted loss; the stop record stays as a record."""

    @abc.abstractmethod
    def clear_stream_stop(self, destination: str, client_name: str) -> None:
        """Forget a stop record once the stream runs again."""

    # -- receive side ---------------------------------------------------------
    @abc.abstractmethod
    def apply_drop_notice(
        self,
        source_id: str,
        client_name: str,
        notice_id: str,
        first_dropped_position: int,
        reason: str,
    ) -> bool:
        """Queue a drop notice for the listener once per ``notice_id``; False if a repeat."""

    @abc.abstractmethod
    def list_sink_drops(self) -> list[SinkDrop]:
        """The last drop notice received per (source, client)."""

    @abc.abstractmethod
    def sink_progress(self, source_id: str, client_name: str) -> SinkProgress:
        """What this sink has received from one (source, client)."""

    @abc.abstractmethod
    def list_sink_progress(self) -> list[SinkProgress]:
        """Every (source, client) this sink has heard of."""

    @abc.abstractmethod
    def apply_log_batch(
        self,
        source_id: str,
        client_name: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        """Append log entries to the receive queue in one transaction.

        Entries at or below the recorded position are skipped; a batch whose
        ``previous_position`` is past the recorded one is a gap
        (:class:`~lr_client.errors.ProtocolError`). Returns (anything applied,
        last applied position).
        """

    @abc.abstractmethod
    def apply_snapshot_batch(
        self,
        source_id: str,
        client_name: str,
        snapshot_id: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        """Append snapshot entries; a new snapshot id supersedes the previous one."""

    # -- subscriber -----------------------------------------------------------
    @abc.abstractmethod
    def list_queues(self, client_name: str | None = None) -> list[QueueInfo]:
        """Registered receive queues."""

    @abc.abstractmethod
    def read_queue(self, conn: Connection, queue_id: int, limit: int) -> list[RecvEntry]:
        """The oldest entries of a receive queue."""

    @abc.abstractmethod
    def delete_entries(self, conn: Connection, seqs: Sequence[int]) -> int:
        """Delete delivered entries (inside the delivering transaction)."""
