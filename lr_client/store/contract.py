"""The queue store contract, split by role: what each caller needs of the store.

Callers type against the role(s) they play (:class:`Shipping` for a sender session's reads,
:class:`Receiving` for a sink's receiver, ...); :class:`QueueStore` combines them all and is
what :func:`~lr_client.store.open_store` returns. Methods that take a ``conn`` run inside the
caller's transaction and commit or roll back with it; the others run their own."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    Backlog,
    CascadeChild,
    CascadeNode,
    CascadeRoute,
    Cursor,
    DropRecord,
    EntryRef,
    Fence,
    HeadEntry,
    LogRange,
    Member,
    NewLogEntry,
    QueueInfo,
    QueueSlot,
    RecvEntry,
    SendEntry,
    SinkDrop,
    SinkProgress,
    SnapshotRequest,
    SnapshotStatus,
    StoredEntry,
    StreamStop,
    SubscriberState,
    UnitLease,
    WireEntry,
)
from lr_client.store.latency import StageLatencies
from lr_client.store.lifecycle import SchemaStatus
from lr_client.store.replay_contract import Replays
from lr_client.store.watches import Watch


class Transactions(Protocol):
    """The store's own transactions, for the methods that take a ``conn``."""

    def write(self, consistent: bool = False) -> AbstractContextManager[Connection]:
        """A read-write transaction on the store's connection, in the caller's scope."""

    def read(self) -> AbstractContextManager[Connection]:
        """A read-only transaction."""

    def read_statements(self) -> AbstractContextManager[Connection]:
        """Reads that need no snapshot across their statements: each sees at least what
        was committed before the block began. PostgreSQL: no transaction (no ``BEGIN``
        and ``COMMIT`` round trips), each statement what was committed before it began;
        SQLite: :meth:`read`, one snapshot."""

    def late_write(
        self, turn: AbstractContextManager[object]
    ) -> AbstractContextManager[Connection]:
        """A read-write transaction that takes the write lock at its first statement
        (after ``turn``, a lock of the process's writers), not at BEGIN (SQLite)."""

    def pinned(self) -> AbstractContextManager[None]:
        """Run the calling thread's transactions on one connection of its own until the
        block ends (a worker running transactions back to back)."""


class Sites(Protocol):
    """Schema, registered sites and the connection: what every other role stands on."""

    #: The backend: ``"sqlite"`` or ``"postgresql"``.
    dialect: str

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade every table (idempotent); the schema's status before."""

    def check_schema(self) -> None:
        """Raise :class:`~lr_client.errors.SchemaError` unless the schema is ours and current."""

    def schema_status(self) -> SchemaStatus:
        """Where the database's schema stands against this version's."""

    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        """Register sites as possible destinations; return {site_id: site number}."""

    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        """The registered sites."""

    def site_name(self, num: int) -> str:
        """The site id of a site number (``#<num>`` if it is not registered)."""

    def analyze(self) -> None:
        """Refresh the planner's statistics of the send queue (where the backend has them)."""

    def close(self) -> None:
        """Close the store's connections (again: a no-op); a later call reconnects."""


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


class Snapshots(Transactions, Protocol):
    """Snapshot requests, the providers that write them, and the snapshot queue."""

    def request_snapshot(
        self, conn: Connection | None, destination: str, client_name: str, reason: str = ""
    ) -> str:
        """Join the client's shared snapshot the destination may join, or ask for the next;
        return its id.

        The destination leaves its open one first (superseded; it goes on for
        the others). It joins the oldest open snapshot that is REQUESTED, or
        RUNNING or READY with a base position at or above the destination's
        cursor when it has a cursor and no drop record; else a new one is
        REQUESTED. With ``conn`` (the caller's transaction) the entries of a
        snapshot left with no destination are released by the next
        :meth:`Retention.trim`."""

    def get_snapshot(
        self, snapshot_id: str, destination: str | None = None
    ) -> SnapshotRequest | None:
        """A destination's view of a snapshot; without one, the snapshot's own."""

    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
        limit: int | None = None,
    ) -> list[SnapshotRequest]:
        """Each destination's view of the snapshots it is in, newest first (``limit`` at most)."""

    def open_snapshots(
        self, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        """The open (requested, running or ready) request of each client that has one."""

    def send_checks(
        self, destination: str, client_names: Sequence[str]
    ) -> tuple[dict[str, SnapshotRequest], dict[str, DropRecord]]:
        """What a sender looks up after reading entries, before it sends them, on one
        connection: :meth:`open_snapshots` of ``client_names`` and the destination's
        drop records (:meth:`Retention.list_drops`) by client, each as committed when
        its statement began."""

    def update_snapshot(
        self,
        snapshot_id: str,
        *,
        expect: Sequence[SnapshotStatus] | None = None,
        destination: str | None = None,
        **values: object,
    ) -> bool:
        """Update a snapshot if its status is in ``expect``; return whether it was updated.

        With ``destination``: that destination's view only (``status``,
        ``reason``, ``shipped_position``); a snapshot left with no open
        destination ends. Without: the snapshot, a new status going to its
        open destinations too."""

    def start_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        """REQUESTED -> RUNNING, fixing ``base_position``; None if no longer requested."""

    def snapshot_base_applied(self, snapshot_id: str) -> bool:
        """Whether this node's own data covers the base of a started snapshot, so that its
        provider may read: at once where the node originates the client; at a branch once
        its subscriber has delivered the relayed entries through the base."""

    def heartbeat_snapshot(self, snapshot_id: str) -> bool:
        """Record that the worker of a RUNNING request is alive; False if it is not running."""

    def fail_stalled_snapshot(self, snapshot_id: str, silent_since: float, reason: str) -> bool:
        """RUNNING -> FAILED if its worker was last heard of before ``silent_since``.

        ``silent_since`` is a wall-clock time (``time.time()``). Entries the
        worker wrote are released. Returns whether the request was failed.
        """

    def write_snapshot_entries(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        payloads: Sequence[bytes],
        first_seq: int = 0,
        keys: Sequence[bytes | None] | None = None,
    ) -> int:
        """Write one part of a snapshot idempotently (re-writing a part replaces it);
        ``keys``: each payload's partition key (None: none)."""

    def write_snapshot_part(
        self,
        snapshot_id: str,
        part: int,
        payloads: Iterable[bytes | tuple[bytes, bytes | None]],
        chunk_rows: int,
        *,
        bulk: bool = True,
    ) -> int:
        """Write a whole part idempotently, ``chunk_rows`` entries per transaction.

        Entries past the part's end (an earlier attempt's) are deleted; ``bulk``
        lets a backend stream the rows in. Returns the part's entry count.
        """

    def drop_unwritten_parts(self, snapshot_id: str, written: Mapping[int, int]) -> None:
        """Delete the entries of every part not in ``written`` (part -> entry count)."""

    def snapshot_rows_committed(self, snapshot_id: str, parts: int) -> int:
        """Entries committed so far by parts ``0 .. parts - 1`` (for progress)."""

    def count_snapshot_entries(self, snapshot_id: str) -> int:
        """How many entries (end marker aside) a snapshot has written."""

    def set_snapshot_progress(self, snapshot_id: str, rows_written: int) -> None:
        """Record a RUNNING snapshot's progress (and that its worker is alive)."""

    def finish_snapshot(self, snapshot_id: str) -> int:
        """Write the end marker with the entry count and mark the snapshot READY."""

    def cancel_snapshot(
        self, snapshot_id: str, reason: str = "cancelled", destination: str | None = None
    ) -> bool:
        """Cancel an open snapshot and release its entries (also retries an ended one's).

        With ``destination``: cancel it for that destination only; the others
        keep it, and its entries are released once none is left.

        Entries in use by a reader that cannot be released at once are
        released by the next :meth:`Retention.trim`; the slot stays theirs till then.
        """

    def complete_snapshot(
        self, snapshot_id: str, destination: str | None = None, fence: Fence | None = None
    ) -> bool:
        """READY -> COMPLETED for ``destination`` (None: every one): its sink has it all.

        The entries are released when the last destination in the snapshot
        is done with it (completed it or left). With ``fence``, only while
        its lease is held (else :class:`~lr_client.errors.FencedError`).
        """

    def read_snapshot_entries(
        self, snapshot_id: str, after: int, limit: int, max_bytes: int | None = None
    ) -> list[SendEntry]:
        """Entries of a READY snapshot after ``after`` (ordinal positions), end marker last."""


class Retention(Protocol):
    """What the send queue keeps: trim, dropped and stopped streams, flow control."""

    #: PostgreSQL retires the send queue a slot at a time (a whole partition of
    #: each of its tables, by TRUNCATE): a trim closes the current slot once it
    #: has been current this many seconds (0: at every trim). SQLite ignores it.
    rotation_period: float
    #: PostgreSQL: slots are added while every other one is pinned, up to this many.
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


class Receiving(Protocol):
    """A sink's receiver: batches appended to receive queues exactly once."""

    #: Whether a receive transaction wakes the subscribers of other processes at commit
    #: where the backend can (PostgreSQL ``NOTIFY``: :mod:`lr_client.store.arrival_watch`).
    notify_arrivals: bool

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

    def apply_lane_batch(
        self,
        source_id: str,
        client_name: str,
        lane: int,
        lanes: int,
        entries: Sequence[WireEntry],
        previous_position: int,
        low_water: int,
    ) -> tuple[bool, int]:
        """Append the log entries of one lane (1..``lanes``) in one transaction.

        Every entry must belong to ``lane`` (:func:`~lr_client.lanes.lane_of`),
        else :class:`~lr_client.errors.ProtocolError`. The stream's recorded
        position rises to ``low_water`` (the source had every entry up to it
        acknowledged), and lane rows at or below it are deleted. An entry is
        skipped if it is at or below that position or its lane's position
        under any lane count recorded; ``previous_position`` past both is a
        gap (:class:`~lr_client.errors.ProtocolError`). Returns (anything applied,
        the lane's last position).
        """

    def apply_snapshot_batch(
        self,
        source_id: str,
        client_name: str,
        snapshot_id: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        """Append snapshot entries; a new snapshot id supersedes the previous one."""

    def apply_drop_notice(
        self,
        source_id: str,
        client_name: str,
        notice_id: str,
        first_dropped_position: int,
        reason: str,
    ) -> bool:
        """Queue a drop notice for the listener once per ``notice_id``; False if a repeat."""

    def sink_progress(self, source_id: str, client_name: str) -> SinkProgress:
        """What this sink has received from one (source, client)."""

    def list_sink_progress(self) -> list[SinkProgress]:
        """Every (source, client) this sink has heard of."""

    def list_sink_drops(self) -> list[SinkDrop]:
        """The last drop notice received per (source, client)."""


class SubscriberQueues(Transactions, Protocol):
    """A sink's subscriber: receive queues, delivery state and leases.

    The methods that take a ``conn`` run in the delivering transaction, which
    the subscriber opens with :meth:`write` (or :meth:`read`).
    """

    #: Whether one write transaction at a time runs (SQLite): a subscriber's
    #: partition workers then take turns on a lock of their own.
    single_writer: bool

    def list_queues(self, client_name: str | None = None) -> list[QueueInfo]:
        """Registered receive queues."""

    def watch_arrivals(self, client_name: str, wake: Callable[[], None]) -> Watch | None:
        """Call ``wake`` (from a thread of its own) whenever a receiver commits entries of
        ``client_name``, until the watch is closed (PostgreSQL: its notifications,
        :mod:`lr_client.store.arrival_watch`; SQLite: any commit to the database file,
        :class:`~lr_client.store.watches.DataVersionWatch`); None where the backend
        cannot tell (an in-memory database: the subscriber polls)."""

    def read_queue(self, conn: Connection, queue_id: int, limit: int) -> list[RecvEntry]:
        """The oldest undelivered entries of a receive queue (``seq > delivered_seq``).

        So are those of every read and probe below.
        """

    def queue_depth(self, queue_id: int) -> int:
        """How many entries wait in a receive queue (above its ``delivered_seq``)."""

    def receive_queue_size(self, source_id: str, client_name: str) -> tuple[int, int]:
        """(entries, payload bytes) waiting in the client's receive queue of ``source_id``."""

    def rotate_receive_queues(self, period: float = 30.0) -> int | None:
        """Retire delivered entries in bulk once the newest ones are ``period`` s old.

        PostgreSQL truncates a partition whose every entry is delivered and
        writes new entries there (the new slot is returned; None: nothing
        rotated); SQLite deletes entries as they are delivered (always None).
        Never waits long for a lock: what it cannot do now, a later call does.
        """

    def load_state(self, conn: Connection, queue_id: int, *, lock: bool = False) -> SubscriberState:
        """The queue's delivery state (defaults if it has none yet).

        ``lock``: hold its row until the transaction ends (PostgreSQL; SQLite has
        one writer), so what the transaction reads next is no older than it.
        """

    def acquire_lease(
        self, conn: Connection, queue_id: int, owner: str, now: float, lease_seconds: float
    ) -> float | None:
        """Take or renew the queue's lease; return its expiry, or None if another holds it."""

    def save_state(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        *,
        snapshot_id: str,
        in_snapshot: bool,
        delivered: int,
        lease_expires: float,
        previous_seq: int,
        delivered_seq: int,
    ) -> bool:
        """Write the queue's state and pass its entries up to ``delivered_seq``, if
        ``owner`` still holds the lease and the queue's ``delivered_seq`` is still
        ``previous_seq``; False: roll back.

        The entries it passes are delivered exactly when the caller's
        transaction commits: readers see only those above ``delivered_seq``.
        """

    def release_leases(
        self, conn: Connection, owner: str, queue_ids: list[int] | None = None
    ) -> int:
        """Give up ``owner``'s leases (all of them, or those of ``queue_ids``)."""

    def read_head(
        self,
        conn: Connection,
        queue_id: int,
        limit: int,
        max_bytes: int | None = None,
        after: int | None = None,
    ) -> list[HeadEntry]:
        """The oldest entries of a receive queue, bounded by count and bytes
        (``after``: those above this ``seq`` instead of ``delivered_seq``)."""

    def peek_head(
        self, conn: Connection, queue_id: int, after: int | None = None
    ) -> HeadEntry | None:
        """The oldest entry of a receive queue, without its payload."""

    def has_snapshot_end(self, conn: Connection, queue_id: int, snapshot_id: str) -> bool:
        """Whether the end marker of ``snapshot_id`` is in the receive queue."""

    def snapshot_base(self, conn: Connection, queue_id: int, snapshot_id: str) -> int | None:
        """The base position carried by the end marker of ``snapshot_id``; None if not queued."""

    def has_entries(self, conn: Connection, queue_id: int) -> bool:
        """Whether the receive queue holds anything."""

    # -- delivery by partition (lr_client.partitioned) ---------------------------------
    def claim_partitions(self, conn: Connection, queue_id: int, count: int) -> None:
        """Deliver the queue with ``count`` partitions from now on (1: not by partition).

        The count is stored with the queue's state. Another count is taken only
        from a drained queue (every partition delivered up to the same entry), or
        from one never delivered by partition; else
        :class:`~lr_client.errors.PartitionCountError` and nothing changes.
        """

    def load_partitions(self, conn: Connection, queue_id: int) -> dict[int, int]:
        """{partition: its ``delivered_seq``} of a queue delivered by partition."""

    def scan_entries(
        self, conn: Connection, queue_id: int, after: int, limit: int, inline_bytes: int = 0
    ) -> list[HeadEntry]:
        """The queue's entries above ``seq`` ``after``, in order, without payloads
        (``b""``) but those of at most ``inline_bytes // limit`` bytes (so at most
        ``inline_bytes`` in all): read them with :meth:`read_payloads`."""

    def read_payloads(self, conn: Connection, queue_id: int, seqs: list[int]) -> dict[int, bytes]:
        """{seq: payload} of entries of the queue."""

    def save_partition(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        partition: int,
        *,
        previous_seq: int,
        delivered_seq: int,
        delivered_seqs: list[int],
    ) -> bool:
        """Raise a partition's ``delivered_seq`` from ``previous_seq`` (the value the
        delivery read) for the entries ``delivered_seqs`` it delivered, while
        ``owner`` holds the lease (a takeover waits for this transaction); False
        (roll back) if either changed meanwhile. The queue's own ``delivered_seq``
        is left as it is (see :meth:`raise_queue_mark`)."""

    def raise_queue_mark(self, conn: Connection, queue_id: int, owner: str) -> bool:
        """Raise the queue's ``delivered_seq`` to the minimum over its partitions, while
        ``owner`` holds the lease; whether it moved."""

    def save_barrier(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        *,
        count: int,
        previous_seq: int,
        delivered_seq: int,
        snapshot_id: str,
        in_snapshot: bool,
        delivered: int,
        lease_expires: float,
    ) -> bool:
        """Pass every partition of the queue (each at ``previous_seq``) and the queue
        itself to ``delivered_seq``, with the queue's new state, after entries that
        every partition waited for (no key, snapshot, drop notice); False: roll back."""


class Inspection(Protocol):
    """Read-only views (``lr status``, ``lr browse``) and the sessions' status rows."""

    def save_session_status(
        self,
        destination: str,
        state: str,
        *,
        connected: bool,
        inflight_batches: int,
        inflight_bytes: int,
        last_error: str = "",
    ) -> None:
        """Record a sender session's state (one row per destination)."""

    def list_session_status(self) -> list[dict[str, Any]]:
        """The sender sessions' status rows, by destination."""

    def head_position_estimate(self) -> int:
        """The highest position assigned so far, read without waiting for transmitters
        (SQLite: it may count one whose transaction has not committed yet)."""

    def queue_depths(self) -> dict[int, int]:
        """{queue_id: entries waiting} of every non-empty receive queue."""

    def queue_sizes(self) -> tuple[int, int, list[tuple[QueueInfo, int]]]:
        """Entries in the send log, the snapshot queue, and each receive queue (by name)."""

    def queue_slots(self) -> list[QueueSlot]:
        """The send and receive queues' slots (PostgreSQL), in order; SQLite has none."""

    def browse_log_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Send log entries after ``after``; with ``destination``, those it still needs."""

    def browse_snapshot_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Snapshot queue entries after ``after`` (of one destination's, one client's)."""

    def browse_queue(self, queue_name: str, after: int, limit: int) -> list[StoredEntry] | None:
        """A receive queue's entries after ``seq`` ``after``; None if there is no such queue."""


class Members(Protocol):
    """A site's ``lr server`` processes and the leases of its units of work.

    Times are the database's clock. A lease is valid while its owner's
    heartbeat is (within the caller's ``lease_timeout``); every change of a
    unit's owner raises its fencing token.
    """

    def db_now(self, conn: Connection | None = None) -> float:
        """The database's clock, seconds since the epoch."""

    def join_member(self, member_id: str, instance: str, address: str, weight: int) -> Member:
        """Register (or take over, with a new ``instance``) a member; heartbeat now."""

    def heartbeat_member(self, member_id: str, instance: str) -> bool:
        """Record that the member is alive; False if its row is gone or another instance's."""

    def leave_member(self, member_id: str, instance: str) -> int:
        """Release every lease of ``instance`` and remove the member; how many were released."""

    def list_members(self, lease_timeout: float) -> list[Member]:
        """Every member, ``alive`` if its heartbeat is within ``lease_timeout`` seconds."""

    def set_member_weight(self, member_id: str, weight: int) -> bool:
        """Change a member's weight (0: it owns nothing); False if there is no such member."""

    def remove_member(self, member_id: str) -> bool:
        """Remove a member and release its leases (an operator's clean-up of a dead one)."""

    def list_leases(self) -> list[UnitLease]:
        """Every unit's lease."""

    def acquire_unit(
        self, unit: str, member_id: str, instance: str, lease_timeout: float
    ) -> Fence | None:
        """Take (or keep) a unit if it is free, released, or its owner's heartbeat lapsed.

        Its fence (the token is raised when the owner changes), or None if a
        live member holds it.
        """

    def release_unit(self, fence: Fence) -> bool:
        """Give a unit up at once; False if the fence no longer held it."""

    def check_fence(self, fence: Fence) -> None:
        """Raise :class:`~lr_client.errors.FencedError` unless the fence still holds its unit."""


class CascadeReports(Protocol):
    """The control plane of cascaded clients: children's reports, the global watermark
    and provider switches (``lrq_cascade``, ``lrq_cascade_children``; docs/cascading.md)."""

    def record_cascade_report(
        self,
        client_name: str,
        child_id: str,
        epoch: int,
        local_watermark: int,
        acked_position: int,
        reported_at: float | None = None,
    ) -> bool:
        """Record a child's report (``reported_at`` default: now). No row or a newer epoch:
        the child is adopted (not dropped). The same epoch: its watermark, acknowledged
        position and report time are updated, ``dropped`` stays. An older epoch: refused,
        nothing changes, False. Bad names or negative positions: typed error."""

    def set_global_watermark(self, client_name: str, value: int) -> bool:
        """Store the set's global watermark at this node; False if not cascaded here."""

    def switch_cascade_provider(self, client_name: str, provider_id: str) -> int | None:
        """Make ``provider_id`` this node's provider of the client, epoch + 1; the new
        epoch, or None if the client is not cascaded here. The root has no provider:
        :class:`~lr_client.errors.InvalidInputError`, nothing changes."""


class Cascading(Protocol):
    """A node's cascade rows and the relay of cascaded clients (docs/cascading.md).

    A branch relays client ``C`` of origin ``R`` from its receive queue
    ``LRQ_Recv_<C>__<R>``: log entries in ``seq`` order with their origin
    positions. Its entries stay past delivery until the relay floor passes them.
    """

    def apply_cascade_config(
        self,
        client_name: str,
        origin_id: str,
        role: str,
        provider_id: str,
        children: Sequence[str] = (),
        nodes: Sequence[str] | None = None,
    ) -> CascadeNode:
        """Apply the configuration of one cascaded client at server start; the row after.

        No row: insert it (epoch 1 with a provider). A configured provider other
        than the one last applied (``config_provider``): switch to it, epoch + 1.
        Otherwise the database's provider stays (a switch made at run time
        survives restarts). ``children`` rows are added if missing (never removed).
        ``nodes`` (the set's nodes but the root), if given, replace those recorded
        for the client (:meth:`SendLog.transmit_route`).
        """

    def cascade_node(self, client_name: str) -> CascadeNode | None:
        """This node's row for ``client_name`` (None: not cascaded here)."""

    def list_cascade_nodes(self) -> list[CascadeNode]:
        """Every cascaded client's row, by client name."""

    def cascade_children(self, client_name: str) -> list[CascadeChild]:
        """The nodes below this one for ``client_name``, by id."""

    def mark_child_dropped(self, client_name: str, child_id: str, dropped: bool = True) -> bool:
        """Mark a child dropped (it leaves the relay floor) or not; False if unknown."""

    def read_relay(
        self,
        client_name: str,
        origin_id: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[SendEntry]:
        """The relayed log entries of (client, origin) after origin position ``after``, in
        order, from the last full sync this node applied on; at most ``limit``, within
        ``max_bytes`` past the first (the byte-cut rule)."""

    def relay_resume_floor(self, client_name: str, origin_id: str) -> int:
        """The lowest origin position a child may resume after: this node holds every
        relayed log entry above it (the relay trim mark, the base of its last full sync)."""

    def relay_delivered_position(
        self, client_name: str, origin_id: str, conn: Connection | None = None
    ) -> int:
        """The origin position of the last entry this node's subscriber delivered from
        (client, origin) (a full sync's base counts); in ``conn`` if given."""

    def relay_floor(self, client_name: str, origin_id: str, extra_floor: int | None = None) -> int:
        """The origin position up to which no node below needs the relayed entries: the
        lowest acknowledged position of the children not dropped, at most
        ``extra_floor`` (the set's global watermark). No child left: the delivered position."""

    def trim_relay(self, client_name: str, origin_id: str, extra_floor: int | None = None) -> int:
        """Release relayed entries delivered here and at or below :meth:`relay_floor`
        (raising the relay trim mark); rows deleted (PostgreSQL: 0, its rotation
        truncates them)."""


class QueueStore(
    Sites,
    SendLog,
    Shipping,
    Snapshots,
    Retention,
    Receiving,
    SubscriberQueues,
    Inspection,
    Members,
    CascadeReports,
    Cascading,
    Replays,
    StageLatencies,
    Protocol,
):
    """Every role: routing queues, stream tags and replication metadata in one database."""


__all__ = [
    "CascadeReports",
    "Cascading",
    "Inspection",
    "Members",
    "QueueStore",
    "Receiving",
    "Retention",
    "SendLog",
    "Shipping",
    "Sites",
    "Snapshots",
    "SubscriberQueues",
    "Transactions",
]
