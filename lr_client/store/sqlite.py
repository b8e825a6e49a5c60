"""SQLite backend: WAL, one writer at a time, destinations on the entry itself.

SQLite serialises writers for the whole transaction, so positions are
assigned in commit order and invariant I1 holds by construction.
``AUTOINCREMENT`` keeps positions from ever being reused after a trim.

An entry's destinations are its ``dest_nums`` text (``",1,5,"``): transmit
writes one row per entry whatever the number of destinations (I4). A
stream's reads walk the ``(client_name, position)`` index and keep the rows
naming the destination, or the destination's partial index once its reads
walked many entries of others (:mod:`lr_client.store.send.sqlite_dest_index`);
trim deletes, per client and per range between two distinct acknowledged
positions, the entries whose every destination has acknowledged that range.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import delete, func, literal_column, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.util import await_only

from lr_client.errors import LRError
from lr_client.records import EntryRef, NewLogEntry, WireEntry, new_entry_headers, new_entry_key
from lr_client.store.core import StoreCore, TrimMarks
from lr_client.store.db_errors import mapped_errors
from lr_client.store.recv.receiving import recv_base
from lr_client.store.schema import tables as s
from lr_client.store.send import sqlite_dest_index as dest_index
from lr_client.store.watches import DataVersionWatch, HeadChanged, Watch, sqlite_path

log = logging.getLogger(__name__)

_INSERT = (
    "INSERT INTO lrq_send_log_entries (client_name, payload, dest_nums, created_at,"
    " partition_key, headers) VALUES (?, ?, ?, ?, ?, ?)"
)
_LAST_ROWID = "SELECT last_insert_rowid()"


#: What a sender session may have to ship: the heads of the send queues, the latest
#: change of a full sync, a stream dropped or its loss accepted (the tables' own names,
#: not input).
_SENDS_HEAD = (
    "SELECT (SELECT seq FROM sqlite_sequence WHERE name = 'lrq_send_log_entries'),"
    " (SELECT seq FROM sqlite_sequence WHERE name = 'lrq_send_snapsync'),"
    " (SELECT max(updated_at) FROM lrq_snapshots),"
    " (SELECT max(updated_at) FROM lrq_snapshot_destinations),"
    " (SELECT count(*) FROM lrq_drops), (SELECT max(dropped_at) FROM lrq_drops),"
    " (SELECT max(accepted_at) FROM lrq_stream_stops),"
    " (SELECT seq FROM sqlite_sequence WHERE name = 'lrq_replays')"
)
#: The head of the receive queues: it moves when a receiver stores entries only.
_ARRIVALS_HEAD = "SELECT seq FROM sqlite_sequence WHERE name = 'lrq_recv_entries'"


def encode_dests(nums: Sequence[int]) -> str:
    """Site numbers as stored on SQLite: ``",1,5,"``."""
    return _encoded(tuple(nums))


@functools.lru_cache(maxsize=1024)
def _encoded(nums: tuple[int, ...]) -> str:
    return "," + ",".join(str(int(n)) for n in nums) + ","


def _names(dest_nums: Any, num: int) -> ColumnElement[bool]:
    """``dest_nums`` (``",1,5,"``) names site ``num``: the term of that site's partial
    index (:func:`~lr_client.store.send.sqlite_dest_index.ddl`), in literals, as SQLite
    uses a partial index only for a query whose terms are its own (a bound parameter
    never is)."""
    named: ColumnElement[bool] = func.instr(
        dest_nums, literal_column(f"',{dest_index.site_number(num)},'")
    ) > literal_column("0")
    return named


def _names_only(dest_nums: Any, nums: Sequence[int]) -> ColumnElement[bool]:
    """``dest_nums`` names no site outside ``nums``: removing each leaves ``","``."""
    rest: Any = dest_nums
    for num in sorted(nums):
        rest = func.replace(rest, f",{int(num)},", ",")
    only: ColumnElement[bool] = rest == ","
    return only


#: Takes SQLite's write lock in a deferred transaction that has read nothing yet (as
#: BEGIN IMMEDIATE does): a write that matches no row.
_TAKE_WRITE_LOCK = "UPDATE lrq_subscriber_partitions SET delivered = delivered WHERE 0"


def driver_rows(conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of ``sql`` (qmark parameters) on ``conn``'s driver connection, as tuples:
    sqlite3's, or aiosqlite's awaited in the greenlet of ``run_sync`` (one trip to its
    thread). Not seen by the engine's statement hooks: never a late write's first."""
    raw = conn.connection.driver_connection
    assert raw is not None
    if isinstance(raw, sqlite3.Connection):
        rows: list[Any] = raw.execute(sql, params).fetchall()
        return rows
    return list(await_only(raw.execute_fetchall(sql, params)))


class LateTurn:
    """A late write's locks, taken at its first statement: the process's writers'
    ``turn``, then SQLite's write lock, so no commit comes between the transaction's
    first read and its first write (which SQLite would refuse, SQLITE_BUSY_SNAPSHOT).

    Set as the ``lr_turn`` execution option of a connection in a deferred
    transaction (the engine's hook calls :meth:`take`); the async subscriber sets
    it on an aiosqlite connection with a ``turn`` of its event loop.
    """

    __slots__ = ("held", "turn")

    def __init__(self, turn: AbstractContextManager[object]) -> None:
        self.turn = turn
        self.held = False

    def take(self, dbapi_conn: Any) -> None:
        """Take both locks (once) before the first statement on ``dbapi_conn``."""
        if self.held:
            return
        self.turn.__enter__()
        self.held = True
        cursor = dbapi_conn.cursor()  # sqlite3's, or aiosqlite's adapted one (in a greenlet)
        try:
            cursor.execute(_TAKE_WRITE_LOCK)
        finally:
            cursor.close()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.turn.__exit__(None, None, None)


class SQLiteCore(StoreCore):
    dialect = "sqlite"
    dialect_insert = staticmethod(sqlite_insert)
    single_writer = True

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        #: The site numbers whose partial index exists (read at the first need).
        self._dest_indexes: set[int] | None = None

    @contextmanager
    def late_write(self, turn: AbstractContextManager[object]) -> Iterator[Connection]:
        # BEGIN (deferred): no lock and no snapshot until the first statement, where
        # the engine's hook calls LateTurn.take; released once committed or rolled back.
        late = LateTurn(turn)
        try:
            with mapped_errors(), self._connect(immediate=False) as conn, self._transaction(conn):
                conn.execution_options(lr_turn=late)  # after BEGIN, which it must not take
                yield conn
                late.take(conn.connection.dbapi_connection)  # the commit holds it too
        finally:
            late.release()

    def tagged_read_walked_others(
        self, conn: Connection, num: int, client_name: str, after: int, end: int | None, own: int
    ) -> bool:
        if self._dest_indexes is None:
            self._dest_indexes = dest_index.existing(conn)
        if num in self._dest_indexes:
            return False
        last = self.head_position(conn) if end is None else end
        return dest_index.walked_others(conn, client_name, after, last, own)

    def index_destination(self, num: int) -> None:
        # Not worth a wait for the write lock (a transmitter's long transaction): the
        # read that asked has its entries, and a later one asks again.
        try:
            with mapped_errors(), self.engine.connect() as conn:
                waits = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {dest_index.LOCK_WAIT_MS}")
                conn.commit()
                try:
                    with conn.begin():
                        conn.exec_driver_sql(dest_index.ddl(num))
                finally:
                    conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(waits or 0)}")
                    conn.commit()
        except LRError as exc:
            log.warning("destination %d: its index not made now: %s", num, exc)
            return
        if self._dest_indexes is not None:
            self._dest_indexes.add(num)
        log.info("destination %d: its reads walked others' entries; its index made", num)

    def watch_sends(self, wake: Callable[[], None]) -> Watch | None:
        path = sqlite_path(self.engine)
        if path is None:
            return None
        return DataVersionWatch(path, wake, HeadChanged(_SENDS_HEAD), name="lr-watch-sends")

    def watch_arrivals(self, client_name: str, wake: Callable[[], None]) -> Watch | None:
        path = sqlite_path(self.engine)
        if path is None:
            return None
        changed = HeadChanged(_ARRIVALS_HEAD)
        return DataVersionWatch(path, wake, changed, name=f"lr-watch-arrivals-{client_name}")

    def fetch_rows(
        self, conn: Connection, query: Any, in_index_order: bool = False
    ) -> Sequence[Any]:
        # The driver's own rows: SQLAlchemy's result processing per row cost a
        # read of 4,000 entries about as much as the driver's fetch itself.
        compiled = query.compile(dialect=conn.dialect)
        params = compiled.construct_params()
        names = compiled.positiontup or ()
        return driver_rows(conn, str(compiled), [params[n] for n in names])

    def insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[NewLogEntry]
    ) -> list[EntryRef]:
        now = time.time()
        codes: dict[int, str] = {}  # each list of site numbers encoded once (a batch shares one)
        rows: list[tuple[Any, ...]] = []
        for m in messages:
            nums = m[1]
            code = codes.get(id(nums))  # the lists are alive in messages: ids are unique
            if code is None:
                code = codes[id(nums)] = encode_dests(nums)
            rows.append((client_name, m[0], code, now, new_entry_key(m), new_entry_headers(m)))
        raw = conn.connection.driver_connection
        assert raw is not None
        if isinstance(raw, sqlite3.Connection):
            cur = raw.cursor()
            try:
                if len(rows) == 1:  # the cursor's lastrowid: cheaper than RETURNING
                    rowid = cur.execute(_INSERT, rows[0]).lastrowid
                    assert rowid is not None  # set by every INSERT that succeeds
                    last = rowid
                else:
                    cur.executemany(_INSERT, rows)
                    last = int(cur.execute(_LAST_ROWID).fetchone()[0])
            finally:
                cur.close()
        elif len(rows) == 1:
            # aiosqlite (an application's AsyncConnection, through run_sync): the same
            # statements on its own connection, each one trip to its thread (through
            # SQLAlchemy a statement is three or four: cursor, execute, fetch, close).
            last = int(await_only(raw.execute(_INSERT, rows[0])).lastrowid)
        else:
            await_only(raw.executemany(_INSERT, rows))
            last = int(driver_rows(conn, _LAST_ROWID, ())[0][0])
        # This transaction holds SQLite's only write lock, so the rows got
        # consecutive rowids: the last one and the count give them all.
        return [EntryRef(0, p, p) for p in range(last - len(messages) + 1, last + 1)]

    def with_tag(self, query: Any, dest_num: int) -> Any:
        return query.where(_names(s.send_log_entries.c.dest_nums, dest_num))

    def tagged_query(
        self, dest_num: int, client_name: str | BindParameter[str], after: int | BindParameter[int]
    ) -> Any:
        e = s.send_log_entries
        query = select(e.c.position, e.c.created_at).where(
            e.c.client_name == client_name, e.c.position > after
        )
        return self.with_tag(query, dest_num)

    def head_position(self, conn: Connection | None = None) -> int:
        query = text("SELECT seq FROM sqlite_sequence WHERE name = 'lrq_send_log_entries'")
        if conn is not None:
            return int(conn.execute(query).scalar() or 0)
        with self.read() as own:
            return int(own.execute(query).scalar() or 0)

    def trim_send_log(self, batch_size: int, max_batches: int | None, marks: TrimMarks) -> int:
        # Rows, in batches: SQLite has no dead tuples (freed pages are reused).
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            # One transaction for the acknowledgements read and the delete, so an
            # entry committed meanwhile is never judged by stale acknowledgements:
            # every write begins IMMEDIATE, holding SQLite's one write lock throughout.
            with self.write() as conn:
                n = self._trim_log(conn, batch_size, marks)
            total += n
            batches += 1
            if n < batch_size:
                break
        return total

    def _trim_log(self, conn: Connection, batch_size: int, trim: TrimMarks) -> int:
        streams: dict[str, dict[int, int]] = {}
        for (num, client), position in trim.acked_positions(conn).items():
            streams.setdefault(client, {})[num] = position
        marks: dict[tuple[int, str], int] = {}
        deleted = 0
        for client, acks in sorted(streams.items()):
            deleted += self._trim_client(conn, client, acks, batch_size - deleted, marks)
            if deleted >= batch_size:
                break
        # Per stream, the highest position deleted: recorded in this transaction.
        trim.record_trim_marks(conn, marks)
        return deleted

    def _trim_client(
        self,
        conn: Connection,
        client: str,
        acks: dict[int, int],
        limit: int,
        marks: dict[tuple[int, str], int],
    ) -> int:
        """Delete up to ``limit`` of ``client``'s entries acknowledged by all their destinations.

        Between two distinct acknowledged positions the set of destinations done
        with an entry is fixed: those acknowledged at or past the range's top. An
        entry goes if it names no other destination (one with no cursor, or
        behind, keeps it). ``marks`` gets each stream's highest deleted position.
        """
        e = s.send_log_entries
        deleted, low = 0, 0
        for high in sorted(set(acks.values())):
            done = [num for num, position in acks.items() if position >= high]
            victim = _names_only(e.c.dest_nums, done)
            # The range's top: the last victim that fits, or the range's own top. The
            # range is then deleted whole, in one statement returning nothing: cheaper
            # than deleting a list of positions and reading each row back.
            top = conn.execute(
                select(e.c.position)
                .where(e.c.client_name == client, e.c.position > low, e.c.position <= high, victim)
                .order_by(e.c.position)
                .limit(1)
                .offset(limit - deleted - 1)
            ).scalar()
            top = high if top is None else int(top)
            within = (e.c.client_name == client, e.c.position > low, e.c.position <= top, victim)
            # Each stream's highest position deleted, per distinct set of destinations.
            for dests, highest, count in conn.execute(
                select(e.c.dest_nums, func.max(e.c.position), func.count())
                .where(*within)
                .group_by(e.c.dest_nums)
            ).all():
                for num in self.dest_nums_of(dests):
                    key = (num, client)
                    marks[key] = max(marks.get(key, 0), int(highest))
                deleted += int(count)
            conn.execute(delete(e).where(*within))
            if deleted >= limit:
                break
            low = high
        return deleted

    def append_recv(self, conn: Connection, queue_id: int, entries: Sequence[WireEntry]) -> None:
        # The driver's executemany with tuples: no per-row dictionaries to build and bind.
        now = time.time()
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.executemany(
            "INSERT INTO lrq_recv_entries (queue_id, type, source_position, snapshot_id,"
            " snapshot_count, payload, received_at, base_position, partition_key, headers)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    queue_id,
                    int(e.type),
                    e.position,
                    e.snapshot_id,
                    e.snapshot_count,
                    e.payload,
                    e.origin_time or now,
                    recv_base(e),
                    e.key,
                    e.headers,
                )
                for e in entries
            ],
        )


__all__ = ["LateTurn", "SQLiteCore", "encode_dests"]
