"""The async subscriber in an event loop, on SQLite (aiosqlite) and PostgreSQL through
both async drivers (psycopg, asyncpg), with async listeners of its own.

What the sync subscriber's suite checks runs against the async one too
(``test_subscriber.py`` and ``test_sink_exactly_once.py``, their ``aio`` cases, on
aiosqlite and psycopg); here: each entry exactly once and in order with the
listener's writes committed with the mark, on every driver, while entries
arrive (woken on arrival) and two subscribers compete; a failed callback rolls
back and comes again; a task cancelled while its listener awaits commits
nothing and its entries come again; ``partitions > 1`` is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from lr_client import ListenerError, RoutingQueueMessage
from lr_client.aio import AsyncRoutingQueueListener, AsyncRoutingQueueSubscriber
from lr_client.errors import UnsupportedSettingError
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.aio import DRIVER_PARAMS, Site, aio_site
from tests.kit.wait import scaled

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC

meta = MetaData()
applied = Table(
    "aio_applied",
    meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("owner", String(64), nullable=False),
    Column("source_id", String(63), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("position", Integer, nullable=False),
)


@pytest.fixture(params=DRIVER_PARAMS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    with aio_site(str(request.param), tmp_path) as made:
        meta.create_all(made.store.engine)
        yield made


def log_entries(first: int, count: int) -> list[WireEntry]:
    return [WireEntry(p, LOG, b"log-%d" % p) for p in range(first, first + count)]


def snapshot(sid: str, count: int, base: int) -> list[WireEntry]:
    rows = [
        WireEntry(i, ReplicationType.SNAPSHOT_SYNC, b"s%d" % i, snapshot_id=sid)
        for i in range(1, count + 1)
    ]
    end = WireEntry(
        count + 1,
        ReplicationType.LAST_FULL_SYNC_ENTRY,
        b"",
        snapshot_id=sid,
        snapshot_count=count,
        base_position=base,
    )
    return [*rows, end]


def rows(store: SQLAlchemyQueueStore) -> list[tuple[str, str, str, int]]:
    """(owner, source, kind, position) of every applied row, in commit order."""
    a = applied.c
    with store.read() as conn:
        found = conn.execute(select(a.owner, a.source_id, a.kind, a.position).order_by(a.id))
        return [(r[0], r[1], r[2], r[3]) for r in found]


class Applier(AsyncRoutingQueueListener):
    """Writes a row per message (and per snapshot start and end) with the async session."""

    def __init__(self, owner: str = "one") -> None:
        self.owner = owner
        self.errors: list[BaseException] = []
        self.bases: list[tuple[str, int | None]] = []

    async def _write(self, session: AsyncSession, source: str, kind: str, at: list[int]) -> None:
        values = [
            {"owner": self.owner, "source_id": source, "kind": kind, "position": p} for p in at
        ]
        await session.execute(insert(applied), values)

    async def on_full_sync_start(
        self,
        session: AsyncSession,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        self.bases.append(("start", base_position))
        await self._write(session, source_id, "start", [0])

    async def on_full_sync_end(
        self,
        session: AsyncSession,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        self.bases.append(("end", base_position))
        await self._write(session, source_id, "end", [0])

    async def process_full_sync(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        await self._write(session, source_id, "full_sync", [m.source_position for m in messages])
        return True

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        assert all(m.source_id == source_id and m.type is LOG for m in messages)
        await asyncio.sleep(0)  # a listener that awaits between its writes
        await self._write(session, source_id, "log", [m.source_position for m in messages])
        return True

    async def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


async def until(check: object, timeout: float = 30.0) -> None:
    """Poll ``check()`` (a callable) in the loop until true; fail after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + scaled(timeout)
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {check}")
        await asyncio.sleep(0.01)


def expected(source: str, log: range, snap: int = 0) -> list[tuple[str, str, int]]:
    head = [(source, "start", 0)] + [(source, "full_sync", i) for i in range(1, snap + 1)]
    head = [*head, (source, "end", 0)] if snap else []
    return head + [(source, "log", p) for p in log]


def test_each_entry_once_in_order_while_entries_arrive_and_two_subscribers_compete(
    site: Site,
) -> None:
    store = site.store
    store.apply_snapshot_batch("src-s", CLIENT, "snap-1", snapshot("snap-1", 7, base=0))
    store.apply_log_batch("src-a", CLIENT, log_entries(1, 20))
    store.apply_log_batch("src-b", CLIENT, log_entries(1, 5))

    async def main() -> None:
        engine = site.engine()
        listeners = [Applier("one"), Applier("two")]
        subs = [
            AsyncRoutingQueueSubscriber(
                engine,
                CLIENT,
                listener,
                owner=listener.owner,
                batch_size=4,
                snapshot_batch_size=3,
                poll_interval=3600.0,
                lease_seconds=2.0,
            )
            for listener in listeners
        ]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(sub.run(stop)) for sub in subs]
        try:
            await until(lambda: len(rows(store)) == 9 + 20 + 5)
            # Idle now, polling once an hour: only a wake-up on arrival delivers these.
            for first in range(21, 61, 10):  # in a thread: SQLite's writer waits there
                await asyncio.to_thread(
                    store.apply_log_batch,
                    "src-a",
                    CLIENT,
                    log_entries(first, 10),
                    previous_position=first - 1,
                )
                await asyncio.to_thread(
                    store.apply_log_batch,
                    "src-s",
                    CLIENT,
                    log_entries(first - 20, 10),
                    previous_position=max(0, first - 21),
                )
            await until(lambda: len(rows(store)) == 9 + 60 + 5 + 40)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await engine.dispose()
        assert all(sub.arrival_watch is None for sub in subs)
        assert [e for listener in listeners for e in listener.errors] == []
        assert ("end", 0) in listeners[0].bases + listeners[1].bases

    asyncio.run(main())
    got = rows(store)
    by_source: dict[str, list[tuple[str, str, int]]] = {}
    for _, source, kind, position in got:
        by_source.setdefault(source, []).append((source, kind, position))
    assert by_source == {
        "src-a": expected("src-a", range(1, 61)),
        "src-b": expected("src-b", range(1, 6)),
        "src-s": expected("src-s", range(1, 41), snap=7),
    }
    assert store.queue_depths() == {}


class FailsFirst(Applier):
    """Writes its rows, then fails the first batch (raising, or returning False)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.calls = how, 0

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.calls += 1
        await super().process_log_entries(session, source_id, messages)
        if self.calls == 1 and self.how == "raise":
            raise RuntimeError("boom")
        return self.calls > 1


@pytest.mark.parametrize("how", ["raise", "false"])
def test_a_failed_callback_rolls_back_its_writes_and_the_batch_comes_again(
    site: Site, how: str
) -> None:
    store = site.store
    store.apply_log_batch("src-a", CLIENT, log_entries(1, 6))
    listener = FailsFirst(how)

    async def main() -> tuple[int, int]:
        engine = site.engine()
        sub = AsyncRoutingQueueSubscriber(engine, CLIENT, listener, batch_size=4, retry_initial=0.0)
        try:
            first = await sub.poll_once()
            assert rows(store) == []  # the writes of the failed batch rolled back
            assert sum(store.queue_depths().values()) == 6
            second = await sub.poll_once()
        finally:
            await sub.close()
            await engine.dispose()
        return first, second

    assert asyncio.run(main()) == (0, 6)
    assert [r[3] for r in rows(store)] == [1, 2, 3, 4, 5, 6]
    (error,) = listener.errors
    assert isinstance(error, ListenerError) and error.callback == "process_log_entries"
    assert (error.first_seq, error.last_seq, error.attempt) == (1, 4, 1)
    if how == "raise":
        assert isinstance(error.__cause__, RuntimeError)
    else:
        assert str(error).endswith("returned False")


class Hangs(Applier):
    """Writes its rows, says so, then awaits until cancelled (the first batch only)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = asyncio.Event()
        self.hang = True

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        await super().process_log_entries(session, source_id, messages)
        if self.hang:
            await session.flush()  # the rows are in the transaction, not committed
            self.inside.set()
            await asyncio.Event().wait()  # until the task is cancelled
        return True


def test_a_task_cancelled_while_its_listener_awaits_commits_nothing(site: Site) -> None:
    store = site.store
    store.apply_log_batch("src-a", CLIENT, log_entries(1, 6))

    async def main() -> int:
        engine = site.engine()
        listener = Hangs()
        sub = AsyncRoutingQueueSubscriber(engine, CLIENT, listener, batch_size=4)
        try:
            task = asyncio.create_task(sub.poll_once())
            await asyncio.wait_for(listener.inside.wait(), scaled(30))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert rows(store) == []  # nothing of the cancelled delivery committed
            assert sum(store.queue_depths().values()) == 6  # and nothing passed
            listener.hang = False
            return await sub.poll_once()  # the same entries come again
        finally:
            await sub.close()
            await engine.dispose()

    assert asyncio.run(main()) == 6
    assert [r[3] for r in rows(store)] == [1, 2, 3, 4, 5, 6]  # each once
    assert store.queue_depths() == {}


def test_partitions_are_refused_with_a_typed_error(site: Site) -> None:
    async def main() -> None:
        engine = site.engine()
        try:
            with pytest.raises(UnsupportedSettingError, match="partitions=2"):
                AsyncRoutingQueueSubscriber(engine, CLIENT, Applier(), partitions=2)
        finally:
            await engine.dispose()

    asyncio.run(main())
