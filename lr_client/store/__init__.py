"""The queue store: a contract split by role, a SQLite and a PostgreSQL backend."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.util import await_only
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from lr_client.store.assembly import SQLAlchemyQueueStore
from lr_client.store.contract import (
    CascadeReports,
    Cascading,
    DeliveryStore,
    Inspection,
    Members,
    QueueHeads,
    QueuePartitions,
    QueueStore,
    Receiving,
    Replays,
    Retention,
    SendLog,
    Shipping,
    Sites,
    SnapshotEntries,
    SnapshotRequests,
    SnapshotStore,
    StageLatencies,
    SubscriberQueues,
    Transactions,
)
from lr_client.store.recv import parked as parked  # its tables join the schema
from lr_client.store.schema.lifecycle import SchemaStatus
from lr_client.store.sqlite import SQLiteCore

SQLITE_BUSY_TIMEOUT_S = 60.0


def _enable_wal(
    cur: Any,
    timeout_s: float = SQLITE_BUSY_TIMEOUT_S,
    locked: tuple[type[Exception], ...] = (sqlite3.OperationalError,),
) -> None:
    """Switch the database to WAL, waiting for other connections' locks.

    SQLite answers ``database is locked`` at once, without its busy handler, when
    another connection holds a lock while the journal mode changes (several
    processes opening a new database together): retry until the busy timeout.
    ``locked`` are the driver's errors for it (aiosqlite's through SQLAlchemy's
    adapter are not sqlite3's).
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")  # not chained: aiosqlite's returns no cursor
            mode = cur.fetchone()[0]
        except locked as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)  # a lock held by another process: nothing to poll but the lock
            delay = min(delay * 2, 0.2)
            continue
        if str(mode).lower() in ("wal", "memory"):
            return
        raise sqlite3.OperationalError(f"cannot switch the database to WAL (journal mode {mode})")


def configure_sqlite_engine(engine: Engine) -> None:
    """WAL, a busy timeout, ``secure_delete=FAST``, and explicit BEGIN (IMMEDIATE for
    the store's writes; a late write takes the lock at its first statement).

    On a connection of the sqlite3 driver or of aiosqlite (an async engine's
    ``sync_engine``, :func:`lr_client.aio.create_async_engine`).
    """
    locked = (sqlite3.OperationalError, engine.dialect.loaded_dbapi.OperationalError)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _enable_wal(cur, locked=locked)
        cur.execute("PRAGMA synchronous=NORMAL")
        # Deleted rows are zeroed in the b-tree pages that stay, not in the pages
        # freed (reused for new rows): builds with SECURE_DELETE on (Debian's) wrote
        # every freed page of delivered entries to the WAL, a third of a delivery's cost.
        cur.execute("PRAGMA secure_delete=FAST")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("lr_immediate")  # None: not the store's
        sql = "BEGIN IMMEDIATE" if immediate else "BEGIN"
        try:
            if immediate is not None and conn.dialect.is_async:
                # The store's own transaction on aiosqlite (its errors mapped by the
                # store): on the driver's connection, one trip to its thread, not three.
                await_only(conn.connection.driver_connection.execute(sql))
            else:
                conn.exec_driver_sql(sql)
        except BaseException:
            if conn.dialect.is_async:
                # Cancelled while aiosqlite's thread had the BEGIN still to run: undo it
                # there, in turn (its calls run in order), before the pool takes the
                # connection back, or the next user finds a transaction open.
                with contextlib.suppress(Exception):
                    await_only(conn.connection.driver_connection.rollback())
            raise

    @event.listens_for(engine, "before_cursor_execute")
    def _first_statement(conn: Any, *_args: Any) -> None:
        # A late write (SQLiteCore.late_write) takes its write lock here.
        turn = conn.get_execution_options().get("lr_turn")
        if turn is not None:
            turn.take(conn.connection.dbapi_connection)


def create_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine configured for the queue store.

    SQLite gets WAL mode, a busy timeout and transactions that begin when the
    application begins them (``BEGIN IMMEDIATE`` for the store's own writes);
    ``postgresql://`` URLs use psycopg 3.
    """
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
        kwargs["connect_args"].setdefault("check_same_thread", False)
        engine = sqlalchemy.create_engine(url, **kwargs)
        configure_sqlite_engine(engine)
        return engine
    # No pool_pre_ping: it costs a round trip per checkout on the hot path; a
    # dead connection surfaces as StoreUnavailableError and the caller retries.
    return sqlalchemy.create_engine(url, **kwargs)


def open_store(engine_or_url: Engine | str) -> SQLAlchemyQueueStore:
    """The store backend for an engine (or a URL, through :func:`create_engine`)."""
    engine = create_engine(engine_or_url) if isinstance(engine_or_url, str) else engine_or_url
    name = engine.dialect.name
    if name == "sqlite":
        return SQLAlchemyQueueStore(SQLiteCore(engine))
    if name == "postgresql":
        from lr_client.store.postgres import PostgresCore  # imports the PostgreSQL driver

        return SQLAlchemyQueueStore(PostgresCore(engine))
    raise ValueError(f"unsupported database dialect {name!r} (SQLite and PostgreSQL are)")


def create_schema(engine_or_url: Engine | str) -> SchemaStatus:
    """Create or upgrade the queue store's tables in a database; idempotent.

    What ``lr init-db`` does for a site, for an application that embeds the
    library: safe when several processes run it at once (one migrates, the
    others find the schema current). Returns the schema's status *before*.
    An engine given stays the caller's; one made from a URL is disposed of.
    """
    store = open_store(engine_or_url)
    try:
        return store.create_schema()
    finally:
        if isinstance(engine_or_url, str):
            store.close()


def _sqlite_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlalchemy.exc.OperationalError) and "database is locked" in str(exc)


def create_app_tables(
    engine: Engine, metadata: sqlalchemy.MetaData, tables: Sequence[sqlalchemy.Table] | None = None
) -> None:
    """Create an application's tables (``metadata.create_all``) in a site's database.

    On SQLite, a site's server that writes between the DDL's read of the schema
    and its write makes it fail at once ("database is locked": no busy wait
    there); it is tried again, for up to 30 s. Other errors are raised.
    """
    for attempt in Retrying(
        retry=retry_if_exception(_sqlite_locked),
        stop=stop_after_delay(30),
        wait=wait_fixed(0.25),
        reraise=True,
    ):
        with attempt:
            metadata.create_all(engine, tables=tables)


__all__ = [
    "SQLITE_BUSY_TIMEOUT_S",
    "CascadeReports",
    "Cascading",
    "DeliveryStore",
    "Inspection",
    "Members",
    "QueueHeads",
    "QueuePartitions",
    "QueueStore",
    "Receiving",
    "Replays",
    "Retention",
    "SQLAlchemyQueueStore",
    "SendLog",
    "Shipping",
    "Sites",
    "SnapshotEntries",
    "SnapshotRequests",
    "SnapshotStore",
    "StageLatencies",
    "SubscriberQueues",
    "Transactions",
    "configure_sqlite_engine",
    "create_app_tables",
    "create_engine",
    "create_schema",
    "open_store",
]
