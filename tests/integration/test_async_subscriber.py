"""The async subscriber in an event loop, on SQLite (aiosqlite) and PostgreSQL through
both async drivers (psycopg, asyncpg), with async listeners of its own.

What the sync subscriber's suite checks runs against the async one too
(``test_subscriber.py`` and ``test_sink_exactly_once.py``, their ``aio`` cases, on
aiosqlite and psycopg); here: each entry exactly once and in order with the
listener's writes committed with the mark, on every driver, while entries
arrive (woken on arrival) and two subscribers compete; a failed callback rolls
back and comes again; a task cancelled while its listener awaits commits
nothing and its entries come again; by partition (``partitions=4``, tasks in the
loop): each entry once, each key in order, a failed delivery of one partition
rolls back that delivery only, a run cancelled while one partition's listener
awaits commits nothing of that delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from lr_client import ListenerError, RoutingQueueMessage
from lr_client.aio import AsyncRoutingQueueListener, AsyncRoutingQueueSubscriber
from lr_client.partitioners import HashPartitioner
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
    store.recv.apply_snapshot_batch("src-s", CLIENT, "snap-1", snapshot("snap-1", 7, base=0))
    store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 20))
    store.recv.apply_log_batch("src-b", CLIENT, log_entries(1, 5))

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
                    store.recv.apply_log_batch,
                    "src-a",
                    CLIENT,
                    log_entries(first, 10),
                    previous_position=first - 1,
                )
                await asyncio.to_thread(
                    store.recv.apply_log_batch,
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
    assert store.inspection.queue_depths() == {}


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
    store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 6))
    listener = FailsFirst(how)

    async def main() -> tuple[int, int]:
        engine = site.engine()
        sub = AsyncRoutingQueueSubscriber(engine, CLIENT, listener, batch_size=4, retry_initial=0.0)
        try:
            first = await sub.poll_once()
            assert rows(store) == []  # the writes of the failed batch rolled back
            assert sum(store.inspection.queue_depths().values()) == 6
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
    store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 6))

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
            assert sum(store.inspection.queue_depths().values()) == 6  # and nothing passed
            listener.hang = False
            return await sub.poll_once()  # the same entries come again
        finally:
            await sub.close()
            await engine.dispose()

    assert asyncio.run(main()) == 6
    assert [r[3] for r in rows(store)] == [1, 2, 3, 4, 5, 6]  # each once
    assert store.inspection.queue_depths() == {}


def keyed(first: int, count: int, keys: int = 13) -> list[WireEntry]:
    """Log entries with keys ``k<position % keys>``."""
    return [
        WireEntry(p, LOG, b"log-%d" % p, key=b"k%d" % (p % keys))
        for p in range(first, first + count)
    ]


class ByKey(Applier):
    """Writes a row per message whose ``kind`` is its key; ``fail``: refuses (once, by
    raising) the first batch of that partition; ``hang``: awaits until cancelled in
    the first batch of that partition."""

    def __init__(self, fail: int | None = None, hang: int | None = None) -> None:
        super().__init__()
        self.fail, self.hang = fail, hang
        self.partitions: set[int | None] = set()
        self.inside = asyncio.Event()

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        part = session.info["lr_partition"]
        self.partitions.add(part)
        for m in messages:
            key = (m.key or b"-").decode()
            await session.execute(
                insert(applied),
                {
                    "owner": self.owner,
                    "source_id": source_id,
                    "kind": key,
                    "position": m.source_position,
                },
            )
        await asyncio.sleep(0)  # other partitions' tasks run meanwhile
        if part is not None and part == self.fail:
            self.fail = None
            raise RuntimeError(f"boom in partition {part}")
        if part is not None and part == self.hang:
            await session.flush()  # the rows are in the transaction, not committed
            self.inside.set()
            await asyncio.Event().wait()  # until the task is cancelled
        return True


def in_key_order(got: list[tuple[str, str, str, int]]) -> bool:
    by_key: dict[str, list[int]] = {}
    for _, _, key, position in got:
        by_key.setdefault(key, []).append(position)
    return all(positions == sorted(positions) for positions in by_key.values())


def partition_marks(store: SQLAlchemyQueueStore) -> dict[int, int]:
    (qid,) = [q.queue_id for q in store.queues.list_queues(CLIENT)]
    with store.read() as conn:
        return store.partitions.load_partitions(conn, qid)


def test_by_partition_each_entry_once_and_each_key_in_order_while_entries_arrive(
    site: Site,
) -> None:
    """Four partitions, four tasks, two subscribers competing, a barrier (an entry
    without a key) in the middle, entries arriving while they run."""
    store = site.store
    first = keyed(1, 100)
    first[49] = WireEntry(50, LOG, b"log-50")  # no key: a barrier
    store.recv.apply_log_batch("src-a", CLIENT, first)

    async def main() -> list[ByKey]:
        engine = site.engine()
        listeners = [ByKey(), ByKey()]
        subs = [
            AsyncRoutingQueueSubscriber(
                engine,
                CLIENT,
                listener,
                owner=f"o{i}",
                partitions=4,
                batch_size=5,
                poll_interval=0.05,
                lease_seconds=5.0,
            )
            for i, listener in enumerate(listeners)
        ]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(sub.run(stop)) for sub in subs]
        try:
            await until(lambda: len(rows(store)) == 100)
            await asyncio.to_thread(
                store.recv.apply_log_batch, "src-a", CLIENT, keyed(101, 100), previous_position=100
            )
            await until(lambda: len(rows(store)) == 200)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await engine.dispose()
        return listeners

    listeners = asyncio.run(main())
    got = rows(store)
    assert sorted(r[3] for r in got) == list(range(1, 201))  # each once
    assert in_key_order(got)
    at = [i for i, r in enumerate(got) if r[3] == 50]
    assert {r[3] for r in got[: at[0]]} == set(range(1, 50))  # the barrier after all before
    assert [e for listener in listeners for e in listener.errors] == []
    assert set().union(*(lst.partitions for lst in listeners)) == {0, 1, 2, 3, None}
    assert len(set(partition_marks(store).values())) == 1


def test_by_partition_a_failed_delivery_rolls_back_that_delivery_only(site: Site) -> None:
    store = site.store
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 60))
    hashing = HashPartitioner()
    failing = [p for p in range(1, 61) if hashing(b"k%d" % (p % 13), 4) == 2]
    listener = ByKey(fail=2)

    async def main() -> tuple[int, int]:
        engine = site.engine()
        kw: dict[str, object] = {"owner": "one", "partitions": 4, "batch_size": 4}
        sub = AsyncRoutingQueueSubscriber(engine, CLIENT, listener, retry_initial=3600.0, **kw)
        again = AsyncRoutingQueueSubscriber(engine, CLIENT, listener, retry_initial=0.0, **kw)
        try:
            n = await sub.poll_once()
            assert sorted(r[3] for r in rows(store)) == sorted(set(range(1, 61)) - set(failing))
            assert partition_marks(store)[2] == 0  # its mark did not move
            return n, await again.poll_once()  # retried: the same entries come again
        finally:
            await sub.close()
            await again.close()
            await engine.dispose()

    assert asyncio.run(main()) == (60 - len(failing), len(failing))
    got = rows(store)
    assert sorted(r[3] for r in got) == list(range(1, 61)) and in_key_order(got)
    (error,) = listener.errors
    assert isinstance(error, ListenerError) and isinstance(error.__cause__, RuntimeError)


def test_by_partition_a_run_cancelled_while_a_listener_awaits_commits_nothing_of_it(
    site: Site,
) -> None:
    store = site.store
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 60))
    hashing = HashPartitioner()
    hung = [p for p in range(1, 61) if hashing(b"k%d" % (p % 13), 4) == 1]
    listener = ByKey(hang=1)

    async def main() -> int:
        engine = site.engine()
        kw: dict[str, object] = {"owner": "one", "partitions": 4, "batch_size": 4}
        sub = AsyncRoutingQueueSubscriber(engine, CLIENT, listener, poll_interval=0.05, **kw)
        try:
            task = asyncio.create_task(sub.run(asyncio.Event()))
            await asyncio.wait_for(listener.inside.wait(), scaled(30))
            if site.driver != "aiosqlite":  # SQLite: its one writer waits for the hung one
                await until(lambda: len(rows(store)) == 60 - len(hung))  # the others go on
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert {r[3] for r in rows(store)}.isdisjoint(hung)  # nothing of it committed
            assert partition_marks(store)[1] == 0
            listener.hang = None
            before = len(rows(store))
            return before + await sub.poll_once()  # its entries come again
        finally:
            await sub.close()
            await engine.dispose()

    assert asyncio.run(main()) == 60
    got = rows(store)
    assert sorted(r[3] for r in got) == list(range(1, 61)) and in_key_order(got)


class Overlap(Applier):
    """Each batch awaits (before any statement) until ``parties`` batches are inside the
    listener at once, as listeners awaiting a remote call would overlap; then writes."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.parties, self.inside = parties, 0
        self.all_in = asyncio.Event()

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        if not self.all_in.is_set():
            self.inside += 1
            if self.inside >= self.parties:
                self.all_in.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.all_in.wait(), scaled(10))
        return await super().process_log_entries(session, source_id, messages)


def test_by_partition_listeners_awaiting_before_their_writes_overlap(site: Site) -> None:
    """Four partitions' listeners are inside their callbacks at once (SQLite too: a
    delivery takes the write lock at its first statement, not before the listener)."""
    hashing = HashPartitioner()
    assert {hashing(b"k%d" % k, 4) for k in range(13)} == {0, 1, 2, 3}
    store = site.store
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 80))
    listener = Overlap(4)

    async def main() -> None:
        engine = site.engine()
        sub = AsyncRoutingQueueSubscriber(
            engine, CLIENT, listener, partitions=4, batch_size=2, poll_interval=0.05
        )
        stop = asyncio.Event()
        task = asyncio.create_task(sub.run(stop))
        try:
            await until(lambda: len(rows(store)) == 80)
        finally:
            stop.set()
            await task
            await engine.dispose()

    asyncio.run(main())
    assert listener.all_in.is_set()  # they overlapped
    assert sorted(r[3] for r in rows(store)) == list(range(1, 81))


def test_the_async_subscriber_records_the_applied_stage_of_its_deliveries(site: Site) -> None:
    """The ``applied`` stage (:mod:`lr_client.latency`) of a log batch it delivered."""
    store = site.store
    store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))

    async def main() -> int:
        engine = site.engine()
        sub = AsyncRoutingQueueSubscriber(engine, CLIENT, Applier())
        try:
            return await sub.poll_once()
        finally:
            await sub.close()
            await engine.dispose()

    assert asyncio.run(main()) == 3
    (row,) = store.latency.list_stage_latency()
    assert (row.peer, row.client_name, row.stage, row.batches) == ("src-a", CLIENT, "applied", 1)
    assert 0 <= row.p50 <= row.max
