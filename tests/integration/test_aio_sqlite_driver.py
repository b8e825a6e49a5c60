"""The aiosqlite connections of :func:`lr_client.aio.create_async_engine`: one trip to
the connection's thread per statement, with the results, errors and counts of
aiosqlite's own cursors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from lr_client.aio import create_async_engine
from lr_client.aio.sqlite_driver import PREFETCH_ROWS, OneTripConnection

meta = MetaData()
items = Table(
    "items",
    meta,
    Column("id", Integer, primary_key=True),
    Column("name", String(20), nullable=False, unique=True),
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"


async def _engine(url: str, rows: int = 0) -> AsyncEngine:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(meta.create_all)
        if rows:
            await conn.execute(insert(items), [{"name": f"n{i}"} for i in range(rows)])
    return engine


class _Counted:
    """An aiosqlite connection's queue to its thread, counting what is put in it."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.puts = 0

    def put_nowait(self, item: Any) -> None:
        self.puts += 1
        self.queue.put_nowait(item)


def _count_trips(raw: Any) -> _Counted:
    """Count the calls queued to an aiosqlite connection's thread (its thread keeps
    the queue it was started with)."""
    raw._tx = counted = _Counted(raw._tx)
    return counted


def test_a_statement_is_one_trip_to_the_connections_thread(url: str) -> None:
    async def main() -> tuple[type, int, int, list[Any]]:
        engine = await _engine(url, rows=3)
        async with engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            await conn.begin()  # the store's engine settings: BEGIN is a statement of its own
            trips = _count_trips(raw)
            got = (await conn.execute(select(items.c.name).order_by(items.c.id))).all()
            select_trips = trips.puts
            await conn.execute(update(items).values(name=items.c.name + "x"))
            update_trips = trips.puts - select_trips
            await conn.rollback()
        await engine.dispose()
        return type(raw), select_trips, update_trips, got

    kind, select_trips, update_trips, got = run(main())
    assert kind is OneTripConnection
    assert [r.name for r in got] == ["n0", "n1", "n2"]
    # aiosqlite's own cursors: 4 trips (cursor, execute, fetchall, close) and 3.
    assert (select_trips, update_trips) == (1, 1)


def test_a_result_larger_than_the_prefetch_comes_whole_and_streams(url: str) -> None:
    total = PREFETCH_ROWS * 2 + 7

    async def main() -> tuple[list[int], list[int], list[int]]:
        engine = await _engine(url, rows=total)
        query = select(items.c.id).order_by(items.c.id)
        async with engine.connect() as conn:
            whole = [r.id for r in (await conn.execute(query)).all()]
            streamed: list[int] = []
            result = await conn.stream(query)
            async for part in result.partitions(300):
                streamed.extend(r.id for r in part)
            first = await conn.stream(query)  # closed after a few rows, rows left behind
            few = [r.id for r in await first.fetchmany(5)]
            await first.close()
            again = [r.id for r in (await conn.execute(query)).all()]
        await engine.dispose()
        assert again == whole
        return whole, streamed, few

    whole, streamed, few = run(main())
    assert whole == list(range(1, total + 1))
    assert streamed == whole
    assert few == [1, 2, 3, 4, 5]


def test_counts_keys_and_errors_are_aiosqlites(url: str) -> None:
    async def main() -> None:
        engine = await _engine(url, rows=4)
        async with engine.begin() as conn:
            result = await conn.execute(insert(items).values(name="new"))
            assert result.inserted_primary_key == (5,)
            changed = await conn.execute(
                update(items).where(items.c.id <= 2).values(name="z" + items.c.name)
            )
            assert changed.rowcount == 2
            many = await conn.execute(insert(items), [{"name": "m1"}, {"name": "m2"}])
            assert many.rowcount == 2
        async with engine.connect() as conn:
            with pytest.raises(IntegrityError):
                await conn.execute(insert(items).values(name="new"))
            await conn.rollback()
            with pytest.raises(OperationalError, match="no such table"):
                await conn.execute(text("SELECT * FROM missing"))
            await conn.rollback()
            # the connection serves on after its errors
            names = (await conn.execute(select(items.c.name).order_by(items.c.id))).scalars()
            assert list(names) == ["zn0", "zn1", "n2", "n3", "new", "m1", "m2"]
        await engine.dispose()

    run(main())


def test_an_application_creator_is_left_alone(url: str) -> None:
    import aiosqlite

    made: list[Any] = []

    def creator() -> Any:
        conn = aiosqlite.connect(url.split(":///", 1)[1])
        made.append(conn)
        return conn

    async def main() -> type:
        engine = create_async_engine(url, async_creator=creator)
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            kind = type((await conn.get_raw_connection()).driver_connection)
        await engine.dispose()
        return kind

    kind = run(main())
    assert made and kind is aiosqlite.Connection
