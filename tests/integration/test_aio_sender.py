"""What the async sender adds to the shared rules: no extra round trip, a free event loop,
engines and URLs (the rules themselves are tested in every flavour in test_sender.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import asyncpg.prepared_stmt
import psycopg
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.util import greenlet_spawn

from lr_client import BackpressureError, ConfigError, LRMessageWithDestinations
from lr_client.aio import AsyncRoutingQueueClient, create_async_engine, sync_url
from lr_client.errors import SchemaError
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.async_engine import open_async_store
from tests.conftest import PG_URL, require_pg
from tests.kit.apps import App, Tx, every_flavour
from tests.kit.templates import migrated_sqlite


@pytest.fixture
def app(store: SQLAlchemyQueueStore, make_app: Callable[..., App]) -> App:
    store.sites.register_sites(["site-b", "site-c"])
    return make_app(store)


def sent(store: SQLAlchemyQueueStore) -> list[bytes]:
    return [e.payload for e in store.shipping.read_log_entries("site-b", "policy", 0, 100)]


@contextmanager
def driver_statements(app: App, tx: Tx, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The statements the driver runs on ``tx``'s connection from now on, whether
    through SQLAlchemy or on the driver's own connection: SQLite's trace of them
    (aiosqlite), psycopg's cursors, asyncpg's prepared statements and executemany."""
    statements: list[str] = []

    async def raw_connection() -> Any:
        handle = tx.handle
        conn = await handle.connection() if isinstance(handle, AsyncSession) else handle
        return (await conn.get_raw_connection()).driver_connection

    if app.flavour == "aiosqlite":
        raw = app.run(raw_connection())
        app.run(raw.set_trace_callback(statements.append))
        yield statements
        app.run(raw.set_trace_callback(None))
    elif app.flavour == "psycopg_async":
        for name in ("execute", "executemany"):
            real = getattr(psycopg.AsyncCursor, name)

            def run(cur: Any, query: Any, *args: Any, _real: Any = real, **kw: Any) -> Any:
                statements.append(str(query))
                return _real(cur, query, *args, **kw)

            monkeypatch.setattr(psycopg.AsyncCursor, name, run)
        yield statements
        monkeypatch.undo()
    else:
        fetch = asyncpg.prepared_stmt.PreparedStatement.fetch
        executemany = asyncpg.Connection.executemany

        async def fetched(stmt: Any, *args: Any, **kw: Any) -> Any:
            statements.append(stmt.get_query())
            return await fetch(stmt, *args, **kw)

        async def many(conn: Any, query: str, *args: Any, **kw: Any) -> Any:
            statements.append(query)
            return await executemany(conn, query, *args, **kw)

        monkeypatch.setattr(asyncpg.prepared_stmt.PreparedStatement, "fetch", fetched)
        monkeypatch.setattr(asyncpg.Connection, "executemany", many)
        yield statements
        monkeypatch.undo()


@every_flavour(only_async=True)
def test_a_transmit_adds_no_statement_of_its_own(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readings cached, a transmit is its INSERT alone on the application's connection
    (a batch: on SQLite its rows, then the last rowid; on PostgreSQL its ordinals, then
    its rows)."""
    with app.transaction() as tx:  # the client's readings: read once, cached
        tx.transmit(b"warm", ["site-b"])
    tx = app.open()
    try:
        tx.execute(text("SELECT 1"))  # the application's own first statement
        with driver_statements(app, tx, monkeypatch) as statements:
            tx.transmit(b"one", ["site-b"])
            single = list(statements)
            statements.clear()
            tx.transmit_many([LRMessageWithDestinations(b"%d" % i, ["site-b"]) for i in range(3)])
            batch = list(statements)
        tx.commit()
    finally:
        tx.close()
    if app.store.dialect == "sqlite":
        assert [s.split()[0] for s in single] == ["INSERT"]  # its rowid: its position
        assert [s.split()[0] for s in batch] == ["INSERT"] * 3 + ["SELECT"]  # rows, rowid
    else:
        assert len(single) == 1 and "INSERT INTO lrq_send_entries" in single[0]
        assert len(batch) == 2 and "pg_current_xact_id" in batch[0]
        assert "INSERT INTO lrq_send_entries" in batch[1]
    assert sent(app.store) == [b"warm", b"one", b"0", b"1", b"2"]


@every_flavour(backends=["postgresql"], only_async=True)
def test_a_transmit_on_an_async_postgresql_connection_skips_sqlalchemys_execution(
    app: App,
) -> None:
    """As on psycopg's sync connection: SQLAlchemy's execution (its context, result and
    events cost more than the driver's work) sees none of a transmit, one entry or a
    batch, even as the transaction's first statement (asyncpg's adapter begins the
    transaction there); what commits is sent, what rolls back is not."""
    _, engine = app.loop()
    seen: list[str] = []

    def count(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    with app.transaction() as tx:
        tx.transmit(b"warm", ["site-b"])
    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        with app.transaction() as tx:
            tx.transmit(b"one", ["site-b"])
        with app.transaction() as tx:
            tx.transmit_many([LRMessageWithDestinations(b"%d" % i, ["site-b"]) for i in (1, 2)])
        tx = app.open()
        try:
            tx.transmit(b"undone", ["site-b"])
            tx.rollback()
        finally:
            tx.close()
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)
    assert seen == []
    assert sent(app.store) == [b"warm", b"one", b"1", b"2"]


@every_flavour(backends=["postgresql"])
def test_a_drivers_error_in_a_transmit_is_the_stores_and_nothing_is_sent(app: App) -> None:
    """A transmit's statement failing in the driver (here the send queue's table is gone,
    as in a database never migrated) raises the store's :class:`SchemaError`, whichever
    way the statement went (the driver's own cursor, the DB-API cursor of SQLAlchemy's
    adapter), one entry or a batch; the transaction rolls back and sends nothing."""
    with app.transaction() as tx:
        tx.transmit(b"warm", ["site-b"])
    for batch in (False, True):
        tx = app.open()
        try:
            tx.execute(text("ALTER TABLE lrq_send_entries RENAME TO lrq_send_entries_gone"))
            with pytest.raises(SchemaError, match="lr init-db"):
                if batch:
                    tx.transmit_many([LRMessageWithDestinations(b"lost", ["site-b"])] * 2)
                else:
                    tx.transmit(b"lost", ["site-b"])
            tx.rollback()
        finally:
            tx.close()
    with app.transaction() as tx:
        tx.transmit(b"after", ["site-b"])
    assert sent(app.store) == [b"warm", b"after"]


def test_a_transmit_on_aiosqlite_is_one_trip_to_its_thread(
    sqlite_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiosqlite runs each call in its connection's thread: through SQLAlchemy a
    statement is three or four of them (cursor, execute, fetch, close); a transmit
    makes one (a batch two: its rows, then the last rowid)."""

    async def scenario() -> tuple[list[str], list[str]]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_site}")
        try:
            async with AsyncRoutingQueueClient.from_async_engine(engine, "site-a", "policy") as c:
                await c.register_destinations(["site-b"])
                async with AsyncSession(engine) as session, session.begin():
                    await c.transmit_log_entry_message(session, b"warm", ["site-b"])
                    with aiosqlite_trips(monkeypatch) as single:
                        await c.transmit_log_entry_message(session, b"one", ["site-b"])
                    batch = [LRMessageWithDestinations(b"%d" % i, ["site-b"]) for i in range(3)]
                    with aiosqlite_trips(monkeypatch) as many:
                        await c.transmit_log_entry_messages(session, batch)
                return single, many
        finally:
            await engine.dispose()

    single, batch = asyncio.run(scenario())
    assert len(single) == 1 and len(batch) == 2, (single, batch)


@every_flavour(only_async=True)
def test_the_clients_own_readings_leave_the_event_loop_free(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading of the store (here the flow state, read at every transmit) runs in a
    thread: other tasks go on while it waits for the database."""
    client = app.client
    assert isinstance(client, AsyncRoutingQueueClient)
    client.rules.flow.interval = 0.0  # read on every transmit
    real = app.store.send.flow_state
    inside, release = threading.Event(), threading.Event()

    def held_flow_state(client_name: str) -> tuple[bool, list[str]]:
        inside.set()
        assert release.wait(30), "the event loop never ran while the reading was held"
        return real(client_name)

    monkeypatch.setattr(app.store.send, "flow_state", held_flow_state)
    _, engine = app.loop()

    async def scenario() -> None:
        async with AsyncSession(engine) as session, session.begin():
            task = asyncio.create_task(client.transmit_log_entry_message(session, b"x", ["site-b"]))
            # Runs only if the loop is free while the transmit's reading is held.
            assert await asyncio.to_thread(inside.wait, 30)
            release.set()
            await task

    app.run(scenario())
    assert sent(app.store) == [b"x"]


@every_flavour()
def test_backpressure_is_refused_before_anything_is_written(app: App) -> None:
    app.store.retention.set_flow_state("policy", True, ["site-b"])
    app.client.rules.flow.interval = 0.0
    with pytest.raises(BackpressureError, match="site-b"), app.transaction() as tx:
        tx.transmit(b"refused", ["site-b"])
    app.store.retention.set_flow_state("policy", False, [])
    with app.transaction() as tx:
        tx.transmit(b"after", ["site-b"])
    assert sent(app.store) == [b"after"]


@every_flavour(only_async=True)
def test_backpressure_wait_lets_other_tasks_run_and_ends_when_it_lifts(
    store: SQLAlchemyQueueStore, make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    store.sites.register_sites(["site-b"])
    store.retention.set_flow_state("policy", True, ["site-b"])
    real = store.send.flow_state
    reads: list[str] = []
    polling = threading.Event()

    def flow_state(client_name: str) -> tuple[bool, list[str]]:
        reads.append(client_name)
        if len(reads) >= 4:  # the first, its confirmation, then the wait's own
            polling.set()
        return real(client_name)

    monkeypatch.setattr(store.send, "flow_state", flow_state)
    app = make_app(store, backpressure="wait", backpressure_timeout=60, flow_check_interval=0.01)
    client = app.client
    assert isinstance(client, AsyncRoutingQueueClient)
    _, engine = app.loop()

    async def scenario() -> None:
        async with AsyncSession(engine) as session, session.begin():
            task = asyncio.create_task(
                client.transmit_log_entry_message(session, b"waited", ["site-b"])
            )
            # The transmit is waiting (reading the state again), and the loop is not.
            assert await asyncio.to_thread(polling.wait, 30)
            assert not task.done()
            await asyncio.to_thread(store.retention.set_flow_state, "policy", False, [])
            await asyncio.wait_for(task, 30)

    app.run(scenario())
    assert sent(store) == [b"waited"]


@pytest.mark.parametrize(
    ("url", "sync"),
    [
        ("sqlite+aiosqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
        ("postgresql+asyncpg://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
        ("postgresql+psycopg://u@h/db?options=-c", "postgresql+psycopg://u@h/db?options=-c"),
        ("postgresql+psycopg_async://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_sync_url_changes_the_driver_only(url: str, sync: str) -> None:
    assert sync_url(url).render_as_string(hide_password=False) == sync


@pytest.mark.parametrize("url", ["sqlite+aiosqlite://", "mysql+aiomysql://h/db", "sqlite:///x"])
def test_sync_url_refuses_what_the_store_cannot_share(url: str) -> None:
    with pytest.raises(ConfigError):
        sync_url(url)


@pytest.fixture
def sqlite_site(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "site.db"
    migrated_sqlite(path)
    yield path


def test_from_async_engine_opens_and_closes_its_own_store(sqlite_site: Path) -> None:
    async def scenario() -> list[int | None]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_site}")
        try:
            async with AsyncRoutingQueueClient.from_async_engine(
                engine, "site-a", "policy"
            ) as client:
                await client.register_destinations(["site-b"])
                async with AsyncSession(engine) as session, session.begin():
                    ref = await client.transmit_log_entry_message(session, b"x", ["site-b"])
                found = await client.positions_of([ref], timeout=5)
                store = client.store
                assert isinstance(store, SQLAlchemyQueueStore)
                assert str(store.engine.url) == f"sqlite:///{sqlite_site}"
            return found
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == [1]


def test_create_async_engine_gives_sqlite_the_stores_settings(sqlite_site: Path) -> None:
    async def scenario() -> tuple[Any, ...]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_site}")
        try:
            async with engine.connect() as conn:
                mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
                busy = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
                raw = await conn.get_raw_connection()
                return mode, busy, raw.driver_connection.isolation_level  # type: ignore[union-attr]
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == ("wal", 60_000, None)  # BEGIN is the engine's


@contextmanager
def aiosqlite_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The calls aiosqlite runs in its connections' threads (one trip each), by name."""
    trips: list[str] = []
    real = aiosqlite.Connection._execute

    async def counted(conn: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return await real(conn, fn, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(aiosqlite.Connection, "_execute", counted)
        yield trips


def test_an_aiosqlite_connection_back_in_the_pool_is_rolled_back_only_if_in_a_transaction(
    sqlite_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call is a trip to aiosqlite's thread: one that committed has nothing to
    undo; one left in a transaction SQLAlchemy did not begin is still rolled back."""

    async def scenario() -> tuple[list[str], int, list[str]]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_site}")
        try:
            async with engine.connect() as conn:  # the pool's connection, opened
                await conn.exec_driver_sql("SELECT 1")
            with aiosqlite_trips(monkeypatch) as committed:
                async with engine.connect() as conn, conn.begin():
                    await conn.exec_driver_sql("SELECT 1")
            with aiosqlite_trips(monkeypatch) as left_open:
                async with engine.connect() as conn:
                    raw = (await conn.get_raw_connection()).driver_connection
                    assert raw is not None
                    await raw.execute("BEGIN")
                    await raw.execute("CREATE TABLE t (x INTEGER)")
            async with engine.connect() as conn:
                query = "SELECT count(*) FROM sqlite_master WHERE name = 't'"
                tables = (await conn.exec_driver_sql(query)).scalar_one()
            return committed, tables, left_open
        finally:
            await engine.dispose()

    committed, tables, left_open = asyncio.run(scenario())
    assert "commit" in committed and "rollback" not in committed
    assert tables == 0 and left_open.count("rollback") == 1


def test_the_stores_own_transactions_on_aiosqlite_begin_on_its_connection(
    sqlite_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's BEGIN on an async engine is one trip to aiosqlite's thread (through
    SQLAlchemy, three: cursor, execute, close); an application's goes through
    SQLAlchemy, its errors SQLAlchemy's."""
    seen: list[str] = []

    def count(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_site}")
        store = open_async_store(engine)
        event.listen(engine.sync_engine, "before_cursor_execute", count)

        def read_and_write() -> None:
            with store.read():
                pass
            with store.write():
                pass

        try:
            await greenlet_spawn(read_and_write)  # the pool's connection, opened
            with aiosqlite_trips(monkeypatch) as trips:
                await greenlet_spawn(read_and_write)
            stores = list(seen)
            seen.clear()
            async with engine.begin() as conn:
                await conn.exec_driver_sql("SELECT 1")
            return trips, stores, list(seen)
        finally:
            await engine.dispose()

    trips, stores, apps = asyncio.run(scenario())
    assert trips == ["execute", "commit"] * 2 and stores == []  # BEGIN, BEGIN IMMEDIATE
    assert apps == ["BEGIN", "SELECT 1"]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "options",
    ["-cstatement_timeout=5s -csearch_path=lr", "-c statement_timeout=5s -c search_path=lr"],
)
def test_asyncpg_gets_a_urls_options_as_server_settings(options: str) -> None:
    require_pg()
    url = make_url(PG_URL).set(drivername="postgresql+asyncpg")
    engine = create_async_engine(url.update_query_dict({"options": options}))

    async def shown() -> tuple[Any, ...]:
        try:
            async with engine.connect() as conn:
                timeout = (await conn.exec_driver_sql("SHOW statement_timeout")).scalar()
                path = (await conn.exec_driver_sql("SHOW search_path")).scalar()
                return timeout, path
        finally:
            await engine.dispose()

    assert "options" not in engine.url.query
    assert asyncio.run(shown()) == ("5s", "lr")


def test_asyncpg_refuses_other_options() -> None:
    with pytest.raises(ConfigError, match="-c name=value"):
        create_async_engine("postgresql+asyncpg://u@h/db?options=--single")


def test_a_begin_cancelled_before_aiosqlites_thread_ran_it_leaves_no_transaction_open(
    sqlite_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled while its store transaction's BEGIN waits in aiosqlite's thread
    (behind another call there) still has that BEGIN run later: the connection must not
    go back to the pool in a transaction."""

    async def scenario() -> int:
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_site}")
        release = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            conn = await engine.connect()
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None
            await raw.create_function("hold", 0, lambda: release.wait(30))
            with aiosqlite_trips(monkeypatch) as trips:
                held = asyncio.ensure_future(raw.execute("SELECT hold()"))
                store_conn = await conn.execution_options(lr_immediate=False)
                begin = asyncio.ensure_future(store_conn.begin())
                deadline = loop.time() + 30
                while trips.count("execute") < 2:  # the BEGIN waits behind hold()
                    assert loop.time() < deadline, trips
                    await asyncio.sleep(0)
                begin.cancel()
                while not begin.done() and "rollback" not in trips:
                    assert loop.time() < deadline, trips
                    await asyncio.sleep(0)
                if begin.done():  # back in the pool while the BEGIN is still to run
                    await conn.close()
                release.set()
                await held
                with pytest.raises(asyncio.CancelledError):
                    await begin
                await conn.close()
            async with engine.connect() as again:
                async with again.begin():  # no "transaction within a transaction"
                    await again.exec_driver_sql("SELECT 1")
                raw_again = (await again.get_raw_connection()).driver_connection
                assert raw_again is raw  # the same connection, back from the pool
                return int(raw_again.in_transaction)
        finally:
            release.set()
            await engine.dispose()

    assert asyncio.run(scenario()) == 0
