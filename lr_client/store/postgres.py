"""PostgreSQL backend: positions after commit, in commit order, and a GIN tag index.

Invariant I1 (no reader skips a committed entry) and commit order (I2) come
from the sequencer (:mod:`lr_client.store.send.sequencer`): a transmitting
transaction only inserts its entries and, at COMMIT, a stamp; positions are
given to committed transactions in commit-stamp order by ticks, which every
reader of positions runs first (:meth:`PostgresQueueStore.sequence`).
Transmitting transactions share no lock, so they never wait for each other
and transmit adds no deadlock to the application's.

Stream tags: ``dest_nums smallint[]`` with a GIN index (compressed posting
lists: a few bytes per destination), so eight destinations cost little more
than one (I4). ``lrq_send_log_entries`` is a view (positions joined to
entries) with the columns of SQLite's table, so readers share their queries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import literal, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import BindParameter

from lr_client.records import (
    EntryRef,
    NewLogEntry,
    QueueSlot,
    ReplicationType,
    WireEntry,
)
from lr_client.store import watches
from lr_client.store.core import StoreCore, TrimMarks
from lr_client.store.db_errors import mapped_errors
from lr_client.store.recv import arrival_watch
from lr_client.store.recv import rotation as recv_rotation
from lr_client.store.recv.receiving import recv_base
from lr_client.store.recv.stream_lock import StreamLocks
from lr_client.store.retention import slots
from lr_client.store.schema import tables as s
from lr_client.store.send import pg_append, pg_dest_index, sequencer
from lr_client.store.snapshots import pool as snapshot_pool

log = logging.getLogger(__name__)


_RECV_COLUMNS = (
    "queue_id",
    "type",
    "source_position",
    "snapshot_id",
    "snapshot_count",
    "payload",
    "received_at",
    "base_position",
    "slot",
    "partition_key",
    "headers",
)
_RECV_TYPES = (
    "int4",
    "int2",
    "int8",
    "varchar",
    "int8",
    "bytea",
    "float8",
    "int8",
    "int2",
    "bytea",
    "bytea",
)
_COPY_RECV = "COPY {} ({}) FROM STDIN (FORMAT BINARY)".format(
    s.recv_entries.name, ", ".join(_RECV_COLUMNS)
)

_SNAPSYNC_COLUMNS = "snapshot_id, part, seq, type, payload, snap_slot, partition_key"
_COPY_SNAPSYNC = f"COPY {s.send_snapsync.name} ({_SNAPSYNC_COLUMNS}) FROM STDIN (FORMAT BINARY)"

#: Sorts off for the rest of the transaction (the setting before, to restore it).
_SORT_OFF = "SELECT current_setting('enable_sort'), set_config('enable_sort', 'off', true)"
_SORT_BACK = "SELECT set_config('enable_sort', %s, true)"

#: A tick that sequenced at least this many entries refreshes the planner's statistics.
ANALYZE_AFTER_TICK = 5000


class PostgresCore(StoreCore):
    dialect = "postgresql"
    dialect_insert = staticmethod(pg_insert)
    consistent_isolation = "REPEATABLE READ"

    _tick_key: int | None = None
    snapsync_slotted = True

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._slot_marks: slots.MarksCache = {}
        self._dest_indexes: set[int] = set()  # the destinations whose index exists
        #: When this store last notified the sender sessions (time.monotonic()).
        self._notified_at = float("-inf")
        #: Receive streams' locks and the slot each transaction read with one.
        self.stream_locks = StreamLocks()

    def index_destinations(self, numbers: Iterable[int]) -> None:
        wanted = set(numbers)
        if wanted - self._dest_indexes:
            with self.write() as conn:
                self._dest_indexes = pg_dest_index.ensure(conn, wanted)

    def _notify_now(self) -> bool:
        """Whether this transmit notifies the sessions (one per ``NOTIFY_INTERVAL``)."""
        now = time.monotonic()
        if now - self._notified_at < watches.NOTIFY_INTERVAL:
            return False
        self._notified_at = now
        return True

    def announce_sends(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"SELECT {pg_append.NOTIFY_SENDS}")

    def watch_sends(self, wake: Callable[[], None]) -> watches.Watch | None:
        return watches.ChannelWatch(self.engine, watches.SENDS_CHANNEL, wake)

    def _tick_lock(self, conn: Connection) -> int:
        if self._tick_key is None:
            self._tick_key = sequencer.lock_key(conn)
        return self._tick_key

    def insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[NewLogEntry]
    ) -> list[EntryRef]:
        return pg_append.insert_entries(conn, client_name, messages, self._notify_now())

    def sequence(self) -> int:
        # One statement in autocommit: the tick's own transaction, one round trip.
        with mapped_errors(), self.engine.connect() as own:
            conn = own.execution_options(isolation_level="AUTOCOMMIT")
            n = sequencer.tick(conn, self._tick_lock(conn))[1]
        if n >= ANALYZE_AFTER_TICK:
            # A burst (a backlog committed while nothing read): the readers'
            # plans need the new rows counted before the next read, not at
            # the next periodic analyze.
            self.analyze()
        return n

    def txn_bases(self, conn: Connection, txids: Sequence[int]) -> dict[int, int]:
        return sequencer.bases(conn, txids)

    @contextmanager
    def read_statements(self) -> Iterator[Connection]:
        # Autocommit: each statement its own snapshot, as READ COMMITTED gives the
        # statements of a transaction; transaction-local settings (``_fetch_rows``'
        # index order) would not hold, so no such read runs here.
        with mapped_errors(), self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def analyze(self) -> None:
        # The per-destination read plans badly on a freshly filled queue that
        # autovacuum has not analysed yet; the server calls this periodically.
        with mapped_errors(), self.engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            auto.exec_driver_sql("ANALYZE lrq_send_positions")
            auto.exec_driver_sql("ANALYZE lrq_send_entries")

    def fetch_rows(
        self, conn: Connection, query: Any, in_index_order: bool = False
    ) -> Sequence[Any]:
        # Binary results through the driver's cursor: a bytea payload travels as its
        # bytes, not as hex text twice its size that the server encodes and the
        # driver decodes (about half the time of a read of 1 KiB payloads).
        if conn.dialect.is_async:  # asyncpg or async psycopg: through SQLAlchemy, sorts on
            return conn.execute(query).all()
        compiled = query.compile(dialect=conn.dialect)
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur:
            if not in_index_order:
                cur.execute(str(compiled), compiled.params, binary=True)
                found: list[Any] = cur.fetchall()
                return found
            # Without statistics (a partition filled since its last ANALYZE, as a
            # snapshot's is) the planner takes the queue for a few rows and reads
            # all of them with a bitmap scan, then sorts them to keep the first:
            # every batch of a large snapshot read and sorted what was left of it.
            # With sorts off for this statement alone it walks the index in order.
            # (A failed read aborts the transaction, and the setting with it.)
            cur.execute(_SORT_OFF)
            previous = cur.fetchone()
            assert previous is not None
            cur.execute(str(compiled), compiled.params, binary=True)
            rows: list[Any] = cur.fetchall()
            cur.execute(_SORT_BACK, (previous[0],))
        return rows

    def lock_stream(
        self, conn: Connection, source_id: str, client_name: str, through: int | None = None
    ) -> tuple[bool, Any]:
        # Two appends to one queue must commit in sequence order, or a
        # subscriber could pass a sequence number that commits later.
        announce = through if self.notify_arrivals else None
        return True, self.stream_locks.lock(conn, source_id, client_name, announce)

    def with_tag(self, query: Any, dest_num: int) -> Any:
        e = s.send_log_entries
        arr = literal([dest_num], postgresql.ARRAY(postgresql.SMALLINT))
        return query.where(e.c.dest_nums.op("@>")(arr))

    def tagged_query(
        self, dest_num: int, client_name: str | BindParameter[str], after: int | BindParameter[int]
    ) -> Any:
        e = s.send_log_entries
        query = select(e.c.position, e.c.created_at).where(
            e.c.client_name == client_name, e.c.position > after
        )
        return self.with_tag(query, dest_num)

    def head_position(self, conn: Connection | None = None) -> int:
        # Sequenced positions only: an entry committed since the last tick gets
        # a higher one (a snapshot base read here is below it: it is replayed).
        if conn is not None:
            return sequencer.head(conn)
        self.sequence()
        with self.read() as own:
            return sequencer.head(own)

    def copy_snapshot_rows(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        seq: int,
        payloads: Iterable[bytes | tuple[bytes, bytes | None]],
        slot: int,
    ) -> int:
        # Binary COPY, streamed: payloads are produced while earlier rows travel.
        kind = int(ReplicationType.SNAPSHOT_SYNC)
        raw = conn.connection.driver_connection
        assert raw is not None
        n = 0
        with raw.cursor() as cur, cur.copy(_COPY_SNAPSYNC) as copy:
            copy.set_types(["varchar", "int4", "int8", "int2", "bytea", "int4", "bytea"])
            write_row = copy.write_row
            for item in payloads:
                payload, key = item if isinstance(item, tuple) else (item, None)
                write_row((snapshot_id, part, seq + n, kind, payload, slot, key))
                n += 1
        return n

    # -- the pool of snapshot slots: a partition each (lr_client.store.snapshots.pool) -----
    def lock_pool(self, conn: Connection) -> None:
        conn.execute(snapshot_pool.POOL_LOCK)

    def lock_requests(self, conn: Connection, client_name: str) -> None:
        conn.execute(snapshot_pool.REQUEST_LOCK, {"client": client_name})

    def slot_storage(self, conn: Connection, slot: int) -> None:
        snapshot_pool.pg_make_partition(conn, slot)

    def drop_slot_entries(
        self, conn: Connection, snapshot_id: str, slot: int | None, count: bool
    ) -> int | None:
        return 0 if slot is None else snapshot_pool.pg_truncate(conn, slot, count)

    def append_recv(self, conn: Connection, queue_id: int, entries: Sequence[WireEntry]) -> None:
        # Binary COPY in the apply transaction: one round trip for the whole batch,
        # into the current slot of the receive queues' partitions.
        now = time.time()
        raw = conn.connection.driver_connection
        assert raw is not None
        slot = self.stream_locks.slot(conn)
        if slot is None:  # no stream lock taken in this transaction
            slot = recv_rotation.current_slot(raw)
        with raw.cursor() as cur, cur.copy(_COPY_RECV) as copy:
            copy.set_types(list(_RECV_TYPES))
            for e in entries:
                copy.write_row(
                    (
                        queue_id,
                        int(e.type),
                        e.position,
                        e.snapshot_id,
                        e.snapshot_count,
                        e.payload,
                        e.origin_time or now,
                        recv_base(e),
                        slot,
                        e.key,
                        e.headers,
                    )
                )

    def announce_arrivals(self, conn: Connection, client_name: str) -> None:
        if self.notify_arrivals and not self.stream_locks.announced(conn, client_name):
            arrival_watch.notify(conn.connection.driver_connection, client_name)

    def watch_arrivals(
        self, client_name: str, wake: Callable[[], None]
    ) -> arrival_watch.ArrivalWatch | None:
        return arrival_watch.ArrivalWatch(self.engine, client_name, wake)

    def trim_send_log(self, batch_size: int, max_batches: int | None, marks: TrimMarks) -> int:
        # Whole slots, not rows (see :mod:`lr_client.store.retention.slots`): the batch
        # bounds of the row trim do not apply.
        with self.write() as conn:
            done = slots.retire(
                conn,
                self._tick_lock(conn),
                marks.acked_positions,
                marks.record_trim_marks,
                period=self.rotation_period,
                max_slots=self.max_slots,
                cache=self._slot_marks,
            )
        if done.rotated_to is not None or done.retired or done.busy:
            log.info(
                "send queue slots",
                extra={
                    "rotated_to": done.rotated_to,
                    "retired": list(done.retired),
                    "entries": done.entries,
                    "busy": list(done.busy),
                },
            )
        return done.entries

    def rotate_send_log(self) -> int | None:
        """Close the current slot now (if it holds entries); the new current slot."""
        with self.write() as conn:
            return slots.rotate(conn, self._tick_lock(conn), max_slots=self.max_slots)

    def send_slots(self) -> list[QueueSlot]:
        """The send queue's slots: which is current, entries and bytes in each."""
        with self.read() as conn:
            return slots.slot_sizes(conn)

    def queue_slots(self) -> list[QueueSlot]:
        with self.read() as conn:
            return slots.slot_sizes(conn) + recv_rotation.slot_sizes(conn)

    keeps_delivered = True  # until rotation truncates their partition
    every_send_wakes = False  # a notification per process per NOTIFY_INTERVAL at most

    def rotate_receive_queues(self, period: float = 30.0) -> int | None:
        with mapped_errors():
            return recv_rotation.rotate(self.engine, period)


__all__ = ["PostgresCore"]
