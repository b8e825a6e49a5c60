"""aiosqlite connections whose statements take one trip to their thread, not four.

aiosqlite runs each call of the sqlite3 module in the connection's own thread,
and each call is a trip there and back through the event loop. SQLAlchemy's
adapter makes four of them per statement that returns rows (make a cursor,
execute, fetch, close) and three per other statement: a delivery of five
statements took 17 trips, and the trips cost more than SQLite's work
(`bench/deliver.py --async`).

:func:`connect` makes an :class:`aiosqlite.Connection` whose cursors do it all
in one trip: the sqlite3 cursor is made, executed, its first
:data:`PREFETCH_ROWS` rows fetched, and closed (when none remain) in the
connection's thread; the cursor serves the rows it holds and goes back to the
thread only for more. Every sqlite3 call still runs in that one thread, as
aiosqlite requires. :func:`lr_client.aio.engine.create_async_engine` connects
with it. It builds on aiosqlite's connection (its queue to the thread), so the
``async`` extra pins aiosqlite's minor version.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import aiosqlite
from aiosqlite.context import contextmanager

T = TypeVar("T")

#: Rows fetched with the statement; a larger result (a stream) fetches the rest on demand.
PREFETCH_ROWS = 1024


class OneTripCursor(aiosqlite.Cursor):
    """A cursor whose statement runs, fetches and closes in one trip to the thread."""

    def __init__(self, conn: OneTripConnection) -> None:
        self.iter_chunk_size = conn.iter_chunk_size
        self._conn: OneTripConnection = conn
        #: The last statement's sqlite3 cursor (closed when its rows are spent).
        self._sql: sqlite3.Cursor | None = None
        self._rows: deque[Any] = deque()
        self._more = False  # rows left in the open sqlite3 cursor
        self._arraysize = 1

    def _run(self, many: bool, sql: str, parameters: Any) -> tuple[sqlite3.Cursor, list[Any], bool]:
        """In the connection's thread: execute, prefetch, close if spent."""
        cur = self._conn.sqlite.cursor()
        try:
            if many:
                cur.executemany(sql, parameters)
            else:
                cur.execute(sql, parameters)
            rows = cur.fetchmany(PREFETCH_ROWS) if cur.description else []
        except BaseException:
            cur.close()
            raise
        more = len(rows) == PREFETCH_ROWS
        if not more:
            cur.close()  # description, rowcount and lastrowid stay readable
        return cur, rows, more

    async def _start(self, many: bool, sql: str, parameters: Any) -> OneTripCursor:
        await self.close()
        self._sql, rows, self._more = await self._conn.in_thread(
            self._run, many, sql, [] if parameters is None else parameters
        )
        self._rows = deque(rows)
        return self

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> OneTripCursor:
        return await self._start(False, sql, parameters)

    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> OneTripCursor:
        return await self._start(True, sql, parameters)

    async def executescript(self, sql_script: str) -> OneTripCursor:
        await self.close()
        self._sql = await self._conn.in_thread(self._script, sql_script)
        return self

    def _script(self, sql_script: str) -> sqlite3.Cursor:
        cur = self._conn.sqlite.cursor()
        try:
            cur.executescript(sql_script)
        finally:
            cur.close()
        return cur

    async def _fetch(self, call: Callable[[sqlite3.Cursor], list[Any]]) -> list[Any]:
        """Rows from the open sqlite3 cursor, in the thread; closes it when spent."""
        cur = self._sql
        if not self._more or cur is None:
            return []

        def fetch() -> tuple[list[Any], bool]:
            rows = call(cur)
            spent = call is _all or len(rows) < PREFETCH_ROWS
            if spent:
                cur.close()
            return rows, not spent

        rows, self._more = await self._conn.in_thread(fetch)
        return rows

    async def fetchone(self) -> Any:
        if not self._rows:
            self._rows.extend(await self._fetch(_chunk))
        return self._rows.popleft() if self._rows else None

    async def fetchmany(self, size: int | None = None) -> Sequence[Any]:
        want = self._arraysize if size is None else size
        while len(self._rows) < want and self._more:
            self._rows.extend(await self._fetch(_chunk))
        return [self._rows.popleft() for _ in range(min(want, len(self._rows)))]

    async def fetchall(self) -> Sequence[Any]:
        rows = list(self._rows)
        self._rows.clear()
        rows.extend(await self._fetch(_all))
        return rows

    async def close(self) -> None:
        self._rows.clear()
        cur, more, self._more = self._sql, self._more, False
        if more and cur is not None:
            await self._conn.in_thread(cur.close)

    @property
    def rowcount(self) -> int:
        return -1 if self._sql is None else self._sql.rowcount

    @property
    def lastrowid(self) -> int | None:
        return None if self._sql is None else self._sql.lastrowid

    @property
    def description(self) -> Any:
        return None if self._sql is None else self._sql.description

    @property
    def arraysize(self) -> int:
        return self._arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._arraysize = value


def _chunk(cur: sqlite3.Cursor) -> list[Any]:
    return cur.fetchmany(PREFETCH_ROWS)


def _all(cur: sqlite3.Cursor) -> list[Any]:
    return cur.fetchall()


class OneTripConnection(aiosqlite.Connection):
    """An aiosqlite connection making :class:`OneTripCursor` cursors (no trip to make one)."""

    def __init__(self, connector: Callable[[], sqlite3.Connection], iter_chunk_size: int) -> None:
        super().__init__(connector, iter_chunk_size)
        self.iter_chunk_size = iter_chunk_size
        self._thread.daemon = True  # as SQLAlchemy's aiosqlite dialect does with its own

    @property
    def sqlite(self) -> sqlite3.Connection:
        """The sqlite3 connection: only for calls in :meth:`in_thread`."""
        return self._conn

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in this connection's thread: one trip."""
        result: T = await self._execute(fn, *args)  # type: ignore[no-untyped-call]
        return result

    @contextmanager
    async def cursor(self) -> aiosqlite.Cursor:
        return OneTripCursor(self)


def connect(database: str, iter_chunk_size: int = 64, **kwargs: Any) -> OneTripConnection:
    """As :func:`aiosqlite.connect` (``kwargs`` go to :func:`sqlite3.connect`), with
    :class:`OneTripCursor` cursors. Await it to open the connection."""

    def connector() -> sqlite3.Connection:
        conn: sqlite3.Connection = sqlite3.connect(database, **kwargs)
        return conn

    return OneTripConnection(connector, iter_chunk_size)


__all__ = ["PREFETCH_ROWS", "OneTripConnection", "OneTripCursor", "connect"]
