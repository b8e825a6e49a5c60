"""What every role of the SQLAlchemy store stands on: the engine, transactions,
the site cache, upserts, and the hooks a dialect (SQLite, PostgreSQL) fills in.

Each role holds the core (:class:`~lr_client.store.role.Role`); the dialects override
the hooks; :mod:`~lr_client.store.assembly` assembles them.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any, Protocol

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection, Engine

from lr_client.records import EntryRef, Fence, NewLogEntry, QueueSlot, ReplicationType, WireEntry
from lr_client.store.db_errors import database_errors, mapped_errors
from lr_client.store.relay_marks import RelayMarks
from lr_client.store.schema import tables as s
from lr_client.store.statements import Upserts, hold_fence
from lr_client.store.watches import Watch


class TrimMarks(Protocol):
    """What a trim of the send log reads and records (the retention role)."""

    def acked_positions(self, conn: Connection) -> dict[tuple[int, str], int]:
        """{(destination number, client): acknowledged position} of every cursor."""

    def record_trim_marks(self, conn: Connection, marks: dict[tuple[int, str], int]) -> None:
        """Raise each stream's trim mark to the highest position the trim retired."""


class StoreCore(abc.ABC):
    """The engine, the store's own transactions, the caches its roles share and the
    dialect hooks (a subclass per database: :mod:`.sqlite`, :mod:`.postgres`)."""

    dialect = "generic"
    #: Isolation for trim: every read of the transaction sees one snapshot.
    consistent_isolation: str | None = None
    #: The dialect's INSERT construct (it has ``on_conflict_do_nothing/update``).
    dialect_insert: Any = None
    #: PostgreSQL: seconds a slot of the send queue stays current before a trim
    #: closes it (0: every trim closes it). SQLite trims rows and ignores it.
    rotation_period: float = 30.0
    #: PostgreSQL: slots are added while the others are pinned, up to this many.
    max_slots: int = 32
    #: Whether delivered entries stay until rotation truncates their partition
    #: (PostgreSQL); else the delivery deletes them (SQLite).
    keeps_delivered = False
    #: Whether one transaction at a time writes (SQLite): the partitions' deliveries
    #: then queue on a lock of their own, woken at once, not on the busy handler's sleeps.
    single_writer = False
    #: PostgreSQL: snapshot entries carry their snapshot's slot, the partition key.
    snapsync_slotted = False
    #: Whether appends to receive queues wake their subscribers (where the backend can).
    notify_arrivals = True
    #: Whether the watch of sends rings for every committed transmit (not some only).
    every_send_wakes = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.upserts = Upserts(self.dialect_insert)
        self._sites: dict[str, int] = {}
        self._site_names: dict[int, str] = {}
        self.queue_ids: dict[str, int] = {}
        #: Queue ids each open transaction registered or read, cached once it commits:
        #: a registration rolled back with its transaction must be made again.
        self.txn_queue_ids: dict[Connection, dict[str, int]] = {}
        #: queue_id -> whether it is relayed, read when this store last took its lease.
        self.relayed_queues: dict[int, bool] = {}
        #: snapshot_id -> (ordinal, part, seq) of the last entry a read returned.
        self.snapshot_marks: dict[tuple[str, int], tuple[int, int, int]] = {}
        #: Per thread: whether its transactions run on one connection, and which.
        self._pins = threading.local()
        #: Where relay reads of a relayed queue may start (:mod:`.relay_marks`).
        self.relay_marks = RelayMarks()

    # -- transactions -----------------------------------------------------------
    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Run the calling thread's transactions of this store on one connection of its
        own until the block ends (taken at the first, given back at the end).

        For a thread that runs transactions back to back (a partition worker): no
        pool checkout per transaction, and no connection closed and opened again
        when more threads than the pool keeps give theirs back at once. A
        transaction begun while the thread's connection is in one (nested) takes
        another from the pool.
        """
        self._pins.on = True
        try:
            yield
        finally:
            self._pins.on = False
            conn, self._pins.conn = getattr(self._pins, "conn", None), None
            if conn is not None:
                with suppress(*database_errors()):
                    conn.close()

    def _connect(self, immediate: bool) -> AbstractContextManager[Connection]:
        """A connection for one transaction (``immediate``: SQLite's BEGIN IMMEDIATE):
        the thread's pinned one if it is free, else one from the pool."""
        if getattr(self._pins, "on", False):
            conn: Connection | None = getattr(self._pins, "conn", None)
            if conn is not None and (conn.closed or conn.invalidated):
                with suppress(*database_errors()):
                    conn.close()
                conn = None
            if conn is None:
                conn = self._pins.conn = self.engine.connect()
            if not conn.in_transaction():
                # Its options are set again for each transaction: none stays from the last.
                return nullcontext(conn.execution_options(lr_immediate=immediate, lr_turn=None))
        return self.engine.connect().execution_options(lr_immediate=immediate)

    @contextmanager
    def write(self, consistent: bool = False) -> Iterator[Connection]:
        """A read-write transaction of the store's own."""
        if consistent and self.consistent_isolation:  # an isolation level: never pinned
            with mapped_errors(), self.engine.connect() as conn:
                conn = conn.execution_options(
                    lr_immediate=True, isolation_level=self.consistent_isolation
                )
                with self._transaction(conn):
                    yield conn
            return
        with mapped_errors(), self._connect(immediate=True) as conn, self._transaction(conn):
            yield conn

    def announce_sends(self, conn: Connection) -> None:  # noqa: B027 - a hook: most need none
        """Work for the sender sessions was written in ``conn``'s transaction: wake them
        at commit where the backend needs telling (PostgreSQL; SQLite's watch sees it)."""

    @contextmanager
    def _transaction(self, conn: Connection) -> Iterator[Connection]:
        """``conn``'s transaction; the queue ids it learnt are cached once it committed."""
        try:
            with conn.begin():
                yield conn
            self.queue_ids.update(self.txn_queue_ids.get(conn, {}))
        finally:
            self.txn_queue_ids.pop(conn, None)

    @contextmanager
    def late_write(self, turn: AbstractContextManager[object]) -> Iterator[Connection]:
        """A read-write transaction that takes the database's write lock at its first
        statement, not at BEGIN, after ``turn`` (a lock of the process's writers): what
        runs before its first statement (a listener's wait) holds no lock. Row locks
        (PostgreSQL) need neither: this is :meth:`write`."""
        with self.write() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        with mapped_errors(), self._connect(immediate=False) as conn, conn.begin():
            yield conn

    @contextmanager
    def read_statements(self) -> Iterator[Connection]:
        """Reads that need no snapshot across their statements: each sees what was
        committed before it began, as in a ``READ COMMITTED`` transaction (PostgreSQL
        runs them without a transaction: no ``BEGIN`` and ``COMMIT`` round trips, on a
        hot path of every batch shipped); :meth:`read` here."""
        with self.read() as conn:
            yield conn

    def fetch_rows(
        self, conn: Connection, query: Any, in_index_order: bool = False
    ) -> Sequence[Any]:
        """The rows of a read of entries with their payloads, as tuples (by index).

        A backend may fetch them a faster way (PostgreSQL: binary results;
        SQLite: the driver's rows). ``in_index_order``: the query takes the
        first rows of an index range in its order (``ORDER BY`` the index,
        ``LIMIT``), and must be planned so, whatever the statistics say.
        """
        return conn.execute(query).all()

    # -- the site cache -----------------------------------------------------------
    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        if refresh or not self._sites:
            with self.read() as conn:
                rows = conn.execute(select(s.sites.c.site_id, s.sites.c.site_num)).all()
            self._sites = {r.site_id: r.site_num for r in rows}
            self._site_names = {num: name for name, num in self._sites.items()}
        return dict(self._sites)

    def site_name(self, num: int) -> str:
        if num not in self._site_names:
            self.site_numbers(refresh=True)
        return self._site_names.get(num, f"#{num}")

    @staticmethod
    def dest_nums_of(value: Any) -> list[int]:
        """The destination numbers stored with an entry (a backend's encoding)."""
        if isinstance(value, str):  # SQLite: ",1,5,"
            return [int(x) for x in value.split(",") if x]
        return [int(x) for x in value]

    # -- upserts -------------------------------------------------------------------
    def insert_ignore(
        self, conn: Connection, table: Any, rows: list[dict[str, Any]], keys: list[str]
    ) -> None:
        conn.execute(self.upserts.ignore(table, keys), rows)

    def upsert(
        self,
        conn: Connection,
        table: Any,
        row: dict[str, Any],
        keys: list[str],
        keep: Sequence[str] = (),
    ) -> None:
        """Insert ``row``, or update it on a key conflict (except the ``keep`` columns)."""
        conn.execute(self.upserts.upsert(table, list(row), keys, keep), row)

    def write_cursor(
        self,
        conn: Connection,
        destination: str,
        client_name: str,
        position: int,
        needs_snapshot: bool | None,
    ) -> None:
        """Upsert a cursor; ``needs_snapshot=None`` keeps the flag as it is."""
        row: dict[str, Any] = {
            "destination": destination,
            "client_name": client_name,
            "position": position,
            "acked_at": time.time(),
            "needs_snapshot": bool(needs_snapshot),
        }
        keep = ["needs_snapshot"] if needs_snapshot is None else []
        self.upsert(conn, s.cursors, row, ["destination", "client_name"], keep)

    def hold_fence(self, conn: Connection, fence: Fence | None) -> None:
        """Hold ``fence``'s lease row for the transaction, or raise :class:`FencedError`."""
        if fence is not None:
            hold_fence(conn, fence)

    # -- dialect hooks ------------------------------------------------------------------
    @abc.abstractmethod
    def head_position(self, conn: Connection | None = None) -> int:
        """The highest position assigned so far (0 if none)."""

    @abc.abstractmethod
    def insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[NewLogEntry]
    ) -> list[EntryRef]:
        """Insert send log entries with their destinations; a ref for each."""

    def sequence(self) -> int:
        """Give positions to entries committed since the last call; how many (a hook).

        Every read of positions calls it first. SQLite assigns positions at
        insert: nothing to do.
        """
        return 0

    def txn_bases(self, conn: Connection, txids: Sequence[int]) -> dict[int, int]:
        """{txid: base} of sequenced transactions: an entry's position is base + ord."""
        return {}

    @abc.abstractmethod
    def with_tag(self, query: Any, dest_num: int) -> Any:
        """``query`` (over the send log) narrowed to the entries tagged for ``dest_num``."""

    @abc.abstractmethod
    def tagged_query(self, dest_num: int, client_name: Any, after: Any) -> Any:
        """``position, created_at`` of a stream's entries after ``after`` (values or binds)."""

    @abc.abstractmethod
    def trim_send_log(self, batch_size: int, max_batches: int | None, marks: TrimMarks) -> int:
        """Retire the log entries every destination has passed, raising the trim marks.

        Returns how many entries went.
        """

    def lock_stream(
        self, conn: Connection, source_id: str, client_name: str, through: int | None = None
    ) -> tuple[bool, Any]:
        """Serialise appends to one queue (SQLite's writers are): (True, progress row or
        None) where the lock read it, else (False, None); ``through``: a log batch's end."""
        return False, None

    def copy_snapshot_rows(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        seq: int,
        payloads: Iterable[bytes | tuple[bytes, bytes | None]],
        slot: int,
    ) -> int | None:
        """Bulk-insert snapshot entries from ``seq`` on, into the snapshot's ``slot``;
        how many, or None if not supported."""
        return None

    def head_position_estimate(self) -> int:
        """The highest position assigned so far, read without waiting for transmitters."""
        return self.head_position()

    def analyze(self) -> None:  # noqa: B027 (a hook: PostgreSQL analyzes)
        """Refresh the planner's statistics of the send queue (a backend hook)."""

    def index_destinations(self, numbers: Iterable[int]) -> None:  # noqa: B027 - a hook
        """Make sure of each registered destination's index of the send log, if the
        backend keeps one per destination."""

    def tagged_read_walked_others(
        self, conn: Connection, num: int, client_name: str, after: int, end: int | None, own: int
    ) -> bool:
        """Whether a read of site ``num``'s entries of ``client_name`` in ``(after, end]``
        (``end`` None: to the head) that found ``own`` walked so many entries of others
        that the destination should get its index (:meth:`index_destination`)."""
        return False

    def index_destination(self, num: int) -> None:  # noqa: B027 - a hook
        """Make site ``num``'s index of the send log, if the backend makes them on need."""

    def watch_sends(self, wake: Callable[[], None]) -> Watch | None:
        """A watch calling ``wake`` when entries may be ready to ship (None: poll)."""
        return None

    def watch_arrivals(self, client_name: str, wake: Callable[[], None]) -> Watch | None:
        """A watch calling ``wake`` when entries of ``client_name`` arrive (None: poll)."""
        return None

    def rotate_receive_queues(self, period: float) -> int | None:
        """Retire delivered entries in bulk (PostgreSQL); the new current slot, or None."""
        return None

    def rotate_send_log(self) -> int | None:
        """Close the send queue's current slot (PostgreSQL); the new one, or None."""
        return None

    def send_slots(self) -> list[QueueSlot]:
        """The send queue's slots (PostgreSQL); SQLite trims rows."""
        return []

    def queue_slots(self) -> list[QueueSlot]:
        """The slots of the send and receive queues (PostgreSQL); SQLite trims rows."""
        return []

    # -- receive queues ---------------------------------------------------------------------
    def append_recv(self, conn: Connection, queue_id: int, entries: Sequence[WireEntry]) -> None:
        """Insert received entries into a receive queue: the portable insert (each backend
        has a faster one)."""
        now = time.time()
        snapshot = ReplicationType.SNAPSHOT_SYNC
        conn.execute(
            insert(s.recv_entries),
            [
                {
                    "queue_id": queue_id,
                    "type": int(e.type),
                    "source_position": e.position,
                    "snapshot_id": e.snapshot_id,
                    "snapshot_count": e.snapshot_count,
                    "payload": e.payload,
                    "received_at": e.origin_time or now,
                    "base_position": e.base_position
                    if e.type is snapshot and e.base_position
                    else None,
                }
                for e in entries
            ],
        )

    def announce_arrivals(self, conn: Connection, client_name: str) -> None:  # noqa: B027
        """Entries of ``client_name`` were appended in ``conn``'s transaction: wake its
        subscribers at commit where the backend can (PostgreSQL's arrival watch)."""

    # -- the pool of snapshot slots (:mod:`.snapshot_pool`) ---------------------------------
    def lock_pool(self, conn: Connection) -> None:  # noqa: B027 - a hook
        """Serialise the taking of slots (SQLite already serialises writers)."""

    def lock_requests(self, conn: Connection, client_name: str) -> None:  # noqa: B027
        """Serialise the requests of one client's snapshots (SQLite serialises writers)."""

    def slot_storage(self, conn: Connection, slot: int) -> None:  # noqa: B027 - a hook
        """Make the storage of a slot if it is missing (PostgreSQL: its partition)."""

    def drop_slot_entries(
        self, conn: Connection, snapshot_id: str, slot: int | None, count: bool
    ) -> int | None:
        """Delete a finished snapshot's entries; how many (0 unless ``count``), None: not now."""
        t = s.send_snapsync
        n = conn.execute(delete(t).where(t.c.snapshot_id == snapshot_id)).rowcount or 0
        return n if count else 0


__all__ = ["StoreCore", "TrimMarks"]
