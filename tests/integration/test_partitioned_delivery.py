"""Delivery by partition on SQLite and PostgreSQL: per-key order, exactly once, barriers,
the partition count kept with the queue.

The ``api`` cases run the async subscriber too (driven from these sync tests,
:mod:`tests.kit.aio`): partition tasks in an event loop, the same rules.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from sqlalchemy import Integer, LargeBinary, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from lr_client import (
    PartitionCountError,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
)
from lr_client.partitioners import HashPartitioner
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from lr_client.subscriber import PARTITION_INFO_KEY
from tests.kit.aio import SyncDriven
from tests.kit.wait import scaled, wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC


class Base(DeclarativeBase):
    pass


class Applied(Base):
    """One row per delivered message, written in the delivery transaction."""

    __tablename__ = "applied"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    position: Mapped[int] = mapped_column(default=0)
    partition: Mapped[int] = mapped_column(default=-1)


class Recorder(RoutingQueueListener):
    """Writes an Applied row per message; may sleep per batch, or fail at random."""

    def __init__(self, sleep: float = 0.0, fail_rate: float = 0.0) -> None:
        self.sleep = sleep
        self.fail_rate = fail_rate
        self.rng = random.Random(7)
        self.lock = threading.Lock()
        self.partitions_seen: dict[bytes, set[int]] = {}

    def _apply(self, session: Session, kind: str, messages: Sequence[RoutingQueueMessage]) -> bool:
        part = session.info.get(PARTITION_INFO_KEY)
        if self.sleep:
            time.sleep(self.rng.random() * self.sleep)
        for m in messages:
            session.add(
                Applied(
                    kind=kind,
                    key=m.key,
                    position=m.source_position,
                    partition=-1 if part is None else part,
                )
            )
            if m.key is not None:
                with self.lock:
                    self.partitions_seen.setdefault(m.key, set()).add(-1 if part is None else part)
        session.flush()
        with self.lock:
            return self.rng.random() >= self.fail_rate

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return self._apply(session, "log", messages)

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return self._apply(session, "snap", messages)

    def on_error(self, error: BaseException) -> None:
        pass


def keyed(positions: Sequence[int], keys: int) -> list[WireEntry]:
    """Log entries with keys ``k<position % keys>``; positions divisible by 0 never."""
    return [WireEntry(p, LOG, b"%d" % p, key=b"k%d" % (p % keys)) for p in positions]


def full_sync(sid: str, count: int) -> list[WireEntry]:
    """A full sync of ``count`` keyed entries (positions 1..count, base ``count``) and
    its end marker."""
    snap = [
        WireEntry(
            i,
            ReplicationType.SNAPSHOT_SYNC,
            b"s%d" % i,
            snapshot_id=sid,
            base_position=count,
            key=b"k%d" % i,
        )
        for i in range(1, count + 1)
    ]
    end = WireEntry(
        count + 1,
        ReplicationType.LAST_FULL_SYNC_ENTRY,
        b"",
        snapshot_id=sid,
        snapshot_count=count,
        base_position=count,
    )
    return [*snap, end]


def applied(store: SQLAlchemyQueueStore) -> list[Applied]:
    with Session(store.engine) as session:
        rows = session.scalars(select(Applied).order_by(Applied.id)).all()
        session.expunge_all()
        return list(rows)


@pytest.fixture
def app(store: SQLAlchemyQueueStore) -> SQLAlchemyQueueStore:
    Base.metadata.create_all(store.engine)
    return store


def subscriber(
    store: SQLAlchemyQueueStore, listener: RoutingQueueListener, partitions: int, **kw: object
) -> RoutingQueueSubscriber:
    return RoutingQueueSubscriber(
        store,
        CLIENT,
        listener,
        partitions=partitions,
        batch_size=kw.pop("batch_size", 7),  # type: ignore[arg-type]
        poll_interval=0.02,
        retry_initial=0.01,
        retry_max=0.05,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["sync", "aio"])
def api(request: pytest.FixtureRequest) -> str:
    """``RoutingQueueSubscriber``, or ``AsyncRoutingQueueSubscriber`` driven from here."""
    return str(request.param)


Make = Callable[..., RoutingQueueSubscriber]


@pytest.fixture
def make(app: SQLAlchemyQueueStore, api: str) -> Iterator[Make]:
    """:func:`subscriber` of the ``api`` under test (the async ones closed at the end)."""
    made: list[SyncDriven] = []

    def build(listener: RoutingQueueListener, partitions: int, **kw: object) -> object:
        if api == "sync":
            return subscriber(app, listener, partitions, **kw)
        kw.setdefault("batch_size", 7)
        url = app.engine.url.render_as_string(hide_password=False)
        sub = SyncDriven(
            url,
            CLIENT,
            listener,
            partitions=partitions,
            poll_interval=0.02,
            retry_initial=0.01,
            retry_max=0.05,
            **kw,
        )
        made.append(sub)
        return sub

    yield build  # type: ignore[misc]
    for sub in made:
        sub.close()


def test_each_key_is_delivered_in_order_by_its_partition_once(
    app: SQLAlchemyQueueStore, make: Make
) -> None:
    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 201), 13))
    listener = Recorder()
    sub = make(listener, 4)
    assert sub.poll_once() == 200
    rows = applied(app)
    assert sorted(r.position for r in rows) == list(range(1, 201))
    hashing = HashPartitioner()
    for key, parts in listener.partitions_seen.items():
        assert parts == {hashing(key, 4)}  # one partition per key, the hash's
    for k in range(13):
        mine = [r.position for r in rows if r.key == b"k%d" % k]
        assert mine == sorted(mine)
    assert sub.poll_once() == 0
    with app.read() as conn:
        (qid,) = [q.queue_id for q in app.queues.list_queues(CLIENT)]
        state = app.queues.load_state(conn, qid)
        marks = app.partitions.load_partitions(conn, qid)
    assert state.partitions == 4
    assert len(marks) == 4 and state.delivered_seq == min(marks.values())
    assert app.queues.queue_depth(qid) == 0


def test_an_entry_without_a_key_is_a_barrier(app: SQLAlchemyQueueStore, make: Make) -> None:
    entries = keyed(range(1, 41), 5)
    entries[19] = WireEntry(20, LOG, b"20")  # no key
    app.recv.apply_log_batch("a", CLIENT, entries)
    listener = Recorder()
    sub = make(listener, 3, batch_size=4)
    assert sub.poll_once() == 40
    rows = applied(app)
    at = [i for i, r in enumerate(rows) if r.position == 20]
    assert len(at) == 1 and rows[at[0]].key is None and rows[at[0]].partition == -1
    before = {r.position for r in rows[: at[0]]}
    assert before == set(range(1, 20))  # every earlier entry first, no later one
    assert sorted(r.position for r in rows[at[0] + 1 :]) == list(range(21, 41))


def test_a_full_sync_comes_first_and_whole_then_keyed_entries(
    app: SQLAlchemyQueueStore, make: Make
) -> None:
    app.recv.apply_snapshot_batch("a", CLIENT, "s1", full_sync("s1", 5))
    app.recv.apply_log_batch("a", CLIENT, keyed(range(6, 30), 4))
    listener = Recorder()
    sub = make(listener, 4, batch_size=3)
    sub.poll_once()
    rows = applied(app)
    kinds = [r.kind for r in rows]
    assert kinds == ["snap"] * 5 + ["log"] * 24
    assert [r.key for r in rows[:5]] == [b"k%d" % i for i in range(1, 6)]  # keys kept


def test_parallel_workers_with_a_slow_listener_keep_order_and_exactly_once(
    app: SQLAlchemyQueueStore, make: Make
) -> None:
    positions = list(range(1, 401))
    entries = keyed(positions, 17)
    for p in (100, 250):
        entries[p - 1] = WireEntry(p, LOG, b"%d" % p)  # barriers
    app.recv.apply_log_batch("a", CLIENT, entries)
    listener = Recorder(sleep=0.01, fail_rate=0.1)
    sub = make(listener, 8, batch_size=5)
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: len(applied(app)) >= 400, timeout=120)
    finally:
        stop.set()
        runner.join(timeout=60)
    assert not runner.is_alive()
    rows = applied(app)
    assert sorted(r.position for r in rows) == positions  # each once (failures rolled back)
    for k in range(17):
        mine = [r.position for r in rows if r.key == b"k%d" % k]
        assert mine == sorted(mine)
    index = {r.position: i for i, r in enumerate(rows)}
    for barrier in (100, 250):
        assert all(index[p] < index[barrier] for p in positions if p < barrier)
        assert all(index[p] > index[barrier] for p in positions if p > barrier)


class Poisoned(Recorder):
    """Refuses every batch that holds ``poison``'s position: its partition stays below it."""

    def __init__(self, poison: int) -> None:
        super().__init__()
        self.poison = poison

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        if any(m.source_position == self.poison for m in messages):
            return False
        return super().process_log_entries(session, source_id, messages)


def test_the_queue_mark_follows_its_lowest_partition_while_the_workers_run(
    app: SQLAlchemyQueueStore, make: Make
) -> None:
    """Partition deliveries do not write the queue's state row; the workers raise its
    ``delivered_seq`` to the lowest partition apart, though the queue never drains."""
    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 121), 11))
    (qid,) = [q.queue_id for q in app.queues.list_queues(CLIENT)]
    sub = make(Poisoned(poison=60), 3, batch_size=4)
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop,))

    def marks() -> tuple[int, dict[int, int]]:
        with app.read() as conn:
            return app.queues.load_state(conn, qid).delivered_seq, app.partitions.load_partitions(
                conn, qid
            )

    def raised() -> bool:
        own, parts = marks()
        return len(set(parts.values())) > 1 and own == min(parts.values()) > 0

    runner.start()
    try:  # two partitions past the poison (each where its last scan ended), the third
        # below it, the queue at the third
        wait_for(raised, timeout=120)
    finally:
        stop.set()
        runner.join(timeout=60)
    assert not runner.is_alive()
    own, parts = marks()
    assert own == min(parts.values()) > 0 and len(set(parts.values())) > 1
    assert 60 not in {r.position for r in applied(app)}
    assert app.queues.queue_depth(qid) > 0


def test_a_drained_queue_has_its_partitions_together_for_another_count(
    app: SQLAlchemyQueueStore,
) -> None:
    """The last entries all of one partition: once delivered (and, on SQLite, deleted),
    the other partitions stand with it, so another count is taken."""
    hashing = HashPartitioner()
    tail = [k for k in range(100) if hashing(b"k%d" % k, 2) == 1][:3]
    entries = keyed(range(1, 31), 5) + [
        WireEntry(31 + i, LOG, b"%d" % (31 + i), key=b"k%d" % k) for i, k in enumerate(tail)
    ]
    app.recv.apply_log_batch("a", CLIENT, entries)
    two = subscriber(app, Recorder(), 2, batch_size=4)
    first = two._poll_partitions(range(1, 2))[0]  # partition 1 first: its tail goes first
    assert first + two.poll_once() == 33
    two.release_leases()
    (qid,) = [q.queue_id for q in app.queues.list_queues(CLIENT)]
    with app.read() as conn:
        marks = app.partitions.load_partitions(conn, qid)
        assert len(set(marks.values())) == 1
        assert app.queues.load_state(conn, qid).delivered_seq == marks[0]
    app.recv.apply_log_batch("a", CLIENT, keyed(range(34, 41), 5))
    assert subscriber(app, Recorder(), 3).poll_once() == 7  # another count: taken
    assert sorted(r.position for r in applied(app)) == list(range(1, 41))


def test_a_different_partition_count_is_refused_until_the_queue_is_drained(
    app: SQLAlchemyQueueStore,
) -> None:
    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 21), 5))
    four = subscriber(app, Recorder(), 4, batch_size=2, max_batches=1)
    four._poll_partitions(range(1))  # partition 0 alone: the queue is not drained
    four.release_leases()
    with app.read() as conn:
        (qid,) = [q.queue_id for q in app.queues.list_queues(CLIENT)]
        before = (
            app.queues.load_state(conn, qid).partitions,
            app.partitions.load_partitions(conn, qid),
        )
    for other in (2, 1):
        with pytest.raises(PartitionCountError, match="not drained"):
            subscriber(app, Recorder(), other).poll_once()
    with app.read() as conn:
        assert (
            app.queues.load_state(conn, qid).partitions,
            app.partitions.load_partitions(conn, qid),
        ) == before
    # Drain with the stored count, then switch: nothing redelivered, nothing lost.
    four = subscriber(app, Recorder(), 4)
    four.poll_once()
    four.release_leases()
    two = subscriber(app, Recorder(), 2)
    assert two.poll_once() == 0
    app.recv.apply_log_batch("a", CLIENT, keyed(range(21, 31), 5))
    assert two.poll_once() == 10
    two.release_leases()
    rows = applied(app)
    assert sorted(r.position for r in rows) == list(range(1, 31))
    with app.read() as conn:
        assert app.queues.load_state(conn, qid).partitions == 2
        assert set(app.partitions.load_partitions(conn, qid)) == {0, 1}
    app.recv.apply_log_batch("a", CLIENT, keyed(range(31, 34), 5))
    one = subscriber(app, Recorder(), 1)
    assert one.poll_once() == 3  # the two partitions stood together at 30
    with Session(app.engine) as session:
        assert session.scalar(select(func.count()).select_from(Applied)) == 33
    with app.read() as conn:
        assert app.queues.load_state(conn, qid).partitions == 0
        assert conn.execute(select(func.count()).select_from(s.subscriber_partitions)).scalar() == 0


class Rendezvous(RoutingQueueListener):
    """Each batch waits (without a statement) for ``parties`` batches to be inside the
    listener at once, as listeners waiting for a remote call would overlap."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=scaled(10))
        self.met = threading.Event()
        self.seen: list[int] = []
        self.lock = threading.Lock()

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        with self.lock:
            self.seen += [m.source_position for m in messages]
        if self.met.is_set():
            return True
        try:
            self.barrier.wait()
            self.met.set()
        except threading.BrokenBarrierError:
            pass  # they did not overlap: the test fails on ``met``
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def on_error(self, error: BaseException) -> None:
        pass


def test_listeners_that_wait_without_writing_overlap_across_partitions(
    app: SQLAlchemyQueueStore,
) -> None:
    """Four partitions' listeners are inside their callbacks at the same time (SQLite
    too: a delivery takes the write lock at its first statement, not before the
    listener), and every entry is still delivered once."""
    hashing = HashPartitioner()
    assert {hashing(b"k%d" % k, 4) for k in range(13)} == {0, 1, 2, 3}
    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 81), 13))
    listener = Rendezvous(4)
    sub = subscriber(app, listener, 4, batch_size=2)
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: len(listener.seen) >= 80, timeout=60)
        (qid,) = [q.queue_id for q in app.queues.list_queues(CLIENT)]
        wait_for(lambda: app.queues.queue_depth(qid) == 0, timeout=60)
    finally:
        stop.set()
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert listener.met.is_set()
    assert sorted(listener.seen) == list(range(1, 81))


def test_sqlite_a_listener_takes_the_write_lock_at_its_first_statement(
    app: SQLAlchemyQueueStore,
) -> None:
    """Before its first statement the listener's transaction holds no lock (others
    write meanwhile); from it on, the write lock: no other commit comes between the
    listener's reads and its writes, which SQLite would refuse (SQLITE_BUSY_SNAPSHOT)."""
    if app.dialect != "sqlite":
        pytest.skip("SQLite's one write lock; PostgreSQL locks rows")
    probe = sqlite3.connect(str(app.engine.url.database), timeout=0, isolation_level=None)

    def free() -> bool:
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        probe.execute("ROLLBACK")
        return True

    class Probe(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.locks: list[tuple[bool, bool]] = []

        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            before = free()
            session.execute(select(func.count()).select_from(Applied))  # a read first
            self.locks.append((before, free()))
            return super().process_log_entries(session, source_id, messages)

    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 21), 5))
    listener = Probe()
    try:
        assert subscriber(app, listener, 2, batch_size=4).poll_once() == 20
    finally:
        probe.close()
    assert listener.locks and set(listener.locks) == {(True, False)}
    assert sorted(r.position for r in applied(app)) == list(range(1, 21))


class StartRecorder(Recorder):
    """Records each full sync start too; the first start waits (without a statement)
    until ``entered`` is set, or a bound passes."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.first: int | None = None

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        session.add(Applied(kind="start"))
        session.flush()
        if self.first is None:
            self.first = threading.get_ident()
            self.entered.wait(scaled(30))


def test_two_workers_at_a_full_sync_start_it_once(
    app: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers deliver a full sync's barrier runs at once: the second reads the
    queue's state while the first is inside its listener, and goes on only after the
    first committed its run. It must see that run's state (inside the full sync) with
    the partitions that run passed: the full sync starts once, comes whole, once."""
    if app.dialect == "sqlite":
        pytest.skip("SQLite's one writer: barrier deliveries of one subscriber never overlap")
    app.recv.apply_snapshot_batch("a", CLIENT, "s1", full_sync("s1", 6))
    listener = StartRecorder()
    sub = subscriber(app, listener, 2, batch_size=3)
    (queue,) = app.queues.list_queues(CLIENT)
    assert sub._hold_lease(queue.queue_id)
    first_done = threading.Event()
    real_load_state = app.queues.load_state

    def load_state(conn, queue_id, **kw):  # type: ignore[no-untyped-def]
        if listener.first in (None, threading.get_ident()):
            return real_load_state(conn, queue_id, **kw)
        listener.entered.set()  # the first worker is inside its listener now
        state = real_load_state(conn, queue_id, **kw)
        assert first_done.wait(scaled(30))  # its run committed before this worker goes on
        return state

    monkeypatch.setattr(app.queues, "load_state", load_state)
    results: dict[str, int | None] = {}

    def deliver(name: str) -> None:
        try:
            results[name] = sub._partitioned.deliver_barrier(queue, 1)
        finally:
            if name == "first":
                first_done.set()

    first = threading.Thread(target=deliver, args=("first",))
    first.start()
    wait_for(lambda: listener.first is not None, 30, what="the first worker's start")
    second = threading.Thread(target=deliver, args=("second",))
    second.start()
    first.join(scaled(60))
    second.join(scaled(60))
    assert not first.is_alive() and not second.is_alive()
    assert results == {"first": 3, "second": 3}  # neither conflicted
    monkeypatch.undo()
    while sub._partitioned.deliver_barrier(queue, 1) is not None:
        pass
    kinds = [r.kind for r in applied(app)]
    assert kinds == ["start", *["snap"] * 6], kinds  # started once, whole, once
    assert sorted(r.position for r in applied(app) if r.kind == "snap") == list(range(1, 7))


def test_by_default_a_subscriber_delivers_in_one_partition(
    app: SQLAlchemyQueueStore, api: str
) -> None:
    """No partition unless asked: every entry, keyed or not, in one order, in whole batches."""
    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 21), 5))
    listener = Recorder()
    if api == "sync":
        sub: object = RoutingQueueSubscriber(app, CLIENT, listener)
    else:
        sub = SyncDriven(app.engine.url.render_as_string(hide_password=False), CLIENT, listener)
    try:
        assert sub.poll_once() == 20  # type: ignore[attr-defined]
    finally:
        sub.close()  # type: ignore[attr-defined]
    rows = applied(app)
    assert [r.position for r in rows] == list(range(1, 21))
    assert {r.partition for r in rows} == {-1}  # no partition given to the listener


def test_a_range_partitioner_takes_its_boundaries(app: SQLAlchemyQueueStore, make: Make) -> None:
    app.recv.apply_log_batch("a", CLIENT, keyed(range(1, 41), 10))
    listener = Recorder()
    sub = make(listener, 2, partitioner="range", partition_boundaries=["k5"])
    assert sub.poll_once() == 40
    assert listener.partitions_seen == {b"k%d" % i: {0 if i < 5 else 1} for i in range(10)}
