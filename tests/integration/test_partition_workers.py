"""The workers of a subscriber delivering by partition: what one turn over the queues
and partitions passes by, and what it never waits for.

Each subscriber here but the last polls once an hour: whatever it delivers while a
test waits, it delivers because a turn went on, never because the poll came.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.errors import ListenerError
from lr_client.partitioners import HashPartitioner
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.wait import join, wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC
HOUR = 3600.0


class Recorder(RoutingQueueListener):
    """Applies every log entry but those at ``refused``; keeps what it saw."""

    def __init__(self, refused: int = 0) -> None:
        self.refused = refused
        self.positions: list[tuple[str, int]] = []
        self.refusals = 0
        self.errors: list[BaseException] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        assert all(m.client_name == CLIENT for m in messages)
        if any(m.source_position == self.refused for m in messages):
            self.refusals += 1
            return False
        self.positions += [(source_id, m.source_position) for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)

    def of(self, source_id: str) -> list[int]:
        return sorted(p for s, p in self.positions if s == source_id)


def keyed(first: int, count: int, key: Callable[[int], bytes] | None = None) -> list[WireEntry]:
    name = key or (lambda p: b"k%d" % p)
    return [WireEntry(p, LOG, b"%d" % p, key=name(p)) for p in range(first, first + count)]


class Runs:
    """Subscribers by partition, each running ``run`` in a thread of its own."""

    def __init__(self, store: SQLAlchemyQueueStore) -> None:
        self.store = store
        self.running: list[tuple[RoutingQueueSubscriber, threading.Event, threading.Thread]] = []

    def __call__(self, listener: RoutingQueueListener, **kw: object) -> RoutingQueueSubscriber:
        kw = {"partitions": 3, "workers": 1, "poll_interval": HOUR, **kw}
        sub = RoutingQueueSubscriber(self.store, CLIENT, listener, **kw)  # type: ignore[arg-type]
        stop = threading.Event()
        thread = threading.Thread(target=sub.run, args=(stop,))
        self.running.append((sub, stop, thread))
        thread.start()
        return sub

    def stop(self) -> None:
        """Stop every subscriber started and wait for its ``run`` to return."""
        while self.running:
            sub, stop, thread = self.running.pop()
            stop.set()
            join(thread, 60)
            sub.close()


@pytest.fixture
def run_sub(store: SQLAlchemyQueueStore) -> Iterator[Runs]:
    """Start ``run`` of a subscriber by partition in a thread; stopped at the end."""
    runs = Runs(store)
    yield runs
    runs.stop()


def test_a_backlog_past_one_turns_batches_is_delivered_without_waiting_for_the_poll(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    """A turn delivers at most ``max_batches`` batches of each partition; one that
    delivered turns again at once."""
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 12))
    listener = Recorder()
    run_sub(listener, batch_size=1, max_batches=1, wake_on_arrival=False)
    wait_for(lambda: listener.of("src-a") == list(range(1, 13)), 30)


def test_only_the_subscribers_client_is_delivered(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    store.recv.apply_log_batch("src-a", "other", keyed(1, 4))
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 3))
    (others,) = [q.queue_id for q in store.queues.list_queues("other")]
    listener = Recorder()
    run_sub(listener)
    wait_for(lambda: listener.of("src-a") == [1, 2, 3], 30)
    assert store.queues.queue_depth(others) == 4 and not listener.errors


def test_a_partition_waiting_to_retry_holds_back_neither_the_others_nor_its_attempts(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    """The refused entry's partition, the first of the turn, waits its retry (an hour
    here) while the partitions after it deliver what comes; the refusal is its
    first attempt."""
    part = HashPartitioner()
    first = next(b"a%d" % i for i in range(100) if part(b"a%d" % i, 3) == 0)
    later = [b"b%d" % i for i in range(100) if part(b"b%d" % i, 3) > 0][:6]

    def key(p: int) -> bytes:
        return first if p == 1 else later[(p - 2) % len(later)]

    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 4, key))
    listener = Recorder(refused=1)
    run_sub(listener, retry_initial=HOUR, retry_max=HOUR)
    wait_for(lambda: listener.of("src-a") == [2, 3, 4], 30)
    store.recv.apply_log_batch("src-a", CLIENT, keyed(5, 4, key), previous_position=4)
    wait_for(lambda: listener.of("src-a") == [2, 3, 4, 5, 6, 7, 8], 30)
    assert listener.refusals == 1
    (refusal,) = [e for e in listener.errors if isinstance(e, ListenerError)]
    assert "attempt 1)" in str(refusal), refusal


def test_a_queue_another_subscriber_leases_holds_back_no_other_queue(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 3))
    store.recv.apply_log_batch("src-b", CLIENT, keyed(1, 3))
    leased, _ = [q.queue_id for q in store.queues.list_queues(CLIENT)]
    with store.write() as conn:
        assert store.queues.acquire_lease(conn, leased, "someone-else", time.time(), HOUR)
    listener = Recorder()
    run_sub(listener, owner="me")
    wait_for(lambda: listener.of("src-b") == [1, 2, 3], 30)
    assert listener.of("src-a") == [] and store.queues.queue_depth(leased) == 3


def test_a_turn_that_fails_is_reported_and_the_workers_go_on(
    store: SQLAlchemyQueueStore,
    run_sub: Runs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = store.queues.list_queues
    failures = [OSError("the registry could not be read")]

    def flaky(client_name: str | None = None) -> object:
        if failures:
            raise failures.pop()
        return real(client_name)

    monkeypatch.setattr(store.queues, "list_queues", flaky)
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 3))
    listener = Recorder()
    run_sub(listener, poll_interval=0.05)  # the next turn: at the next poll
    wait_for(lambda: listener.of("src-a") == [1, 2, 3], 30)
    assert [str(e) for e in listener.errors] == ["the registry could not be read"]


def test_a_partitions_attempts_count_from_one_again_once_it_delivered(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    class RefusingEachOnce(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[int] = set()

        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            fresh = {m.source_position for m in messages} - self.seen
            self.seen |= fresh
            return not fresh and super().process_log_entries(session, source_id, messages)

    listener = RefusingEachOnce()
    run_sub(listener, poll_interval=0.05, retry_initial=0.01, retry_max=0.01)
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 1, lambda p: b"k"))
    wait_for(lambda: listener.of("src-a") == [1], 30)
    store.recv.apply_log_batch("src-a", CLIENT, keyed(2, 1, lambda p: b"k"), previous_position=1)
    wait_for(lambda: listener.of("src-a") == [1, 2], 30)
    refusals = [str(e) for e in listener.errors if isinstance(e, ListenerError)]
    assert len(refusals) == 2 and all("attempt 1)" in e for e in refusals), refusals


def stop_below_a_refused_entry(store: SQLAlchemyQueueStore, run_sub: Runs) -> tuple[int, Recorder]:
    """Run a subscriber by partition until every entry but the refused 12 is applied,
    then stop it: (the queue's id, the listener). The partition of 12 stops below it
    (the queue never drains, so no barrier raises the queue's mark), and the poll and
    the retry are far away: the queue's own mark is left for the stop to raise."""
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 12))
    (qid,) = [q.queue_id for q in store.queues.list_queues(CLIENT)]
    part = HashPartitioner()
    blocked = [p for p in range(1, 13) if part(b"k%d" % p, 3) == part(b"k12", 3)]
    assert len(blocked) > 1  # the refused 12 comes after others of its partition
    listener = Recorder(refused=12)
    run_sub(listener, batch_size=1, retry_initial=HOUR, retry_max=HOUR)
    try:
        wait_for(lambda: listener.of("src-a") == list(range(1, 12)), 30)
    finally:
        run_sub.stop()
    return qid, listener


def test_stopping_raises_the_queue_mark_its_partitions_reached(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    """Partition deliveries write their own marks; the queue's, which retires entries
    and which a status reads, is raised behind them now and then, and at the stop for
    what moved since."""
    qid, _ = stop_below_a_refused_entry(store, run_sub)
    with store.read() as conn:
        own = store.queues.load_state(conn, qid).delivered_seq
        parts = store.partitions.load_partitions(conn, qid)
    assert own == min(parts.values()) > 0


def test_a_queue_mark_the_stop_cannot_raise_is_reported_to_on_error(
    store: SQLAlchemyQueueStore, run_sub: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise OSError("the database went away")

    monkeypatch.setattr(store.partitions, "raise_queue_mark", refuse)
    qid, listener = stop_below_a_refused_entry(store, run_sub)
    others = [e for e in listener.errors if not isinstance(e, ListenerError)]  # not the refusal
    assert others and all(str(e) == "the database went away" for e in others), others
    with store.read() as conn:  # the mark stays; the next subscriber raises it
        assert store.queues.load_state(conn, qid).delivered_seq == 0


def test_a_poll_by_partition_raises_the_queue_mark_its_partitions_reached(
    store: SQLAlchemyQueueStore,
) -> None:
    """``poll_once`` turns until no partition moves, then raises the queue's own mark
    behind them: no barrier does here (the refused 12 keeps the queue from draining)."""
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 12))
    (qid,) = [q.queue_id for q in store.queues.list_queues(CLIENT)]
    listener = Recorder(refused=12)
    sub = RoutingQueueSubscriber(
        store, CLIENT, listener, partitions=3, batch_size=1, retry_initial=HOUR, retry_max=HOUR
    )
    try:
        wait_for(lambda: sub.poll_once() >= 0 and listener.of("src-a") == list(range(1, 12)), 30)
        with store.read() as conn:
            own = store.queues.load_state(conn, qid).delivered_seq
            parts = store.partitions.load_partitions(conn, qid)
    finally:
        sub.close()
    assert own == min(parts.values()) > 0


def test_workers_waiting_at_a_barrier_go_on_once_another_delivers_it(
    store: SQLAlchemyQueueStore, run_sub: Runs
) -> None:
    """An entry without a key is a barrier: each partition stops there until the last
    one reaches it and its worker delivers it. The workers that stopped first wait for
    that delivery's ring, not for the poll (an hour here); three barriers in turn."""
    part = HashPartitioner()
    zero = [b"z%d" % i for i in range(200) if part(b"z%d" % i, 2) == 0]
    one = [b"o%d" % i for i in range(200) if part(b"o%d" % i, 2) == 1]
    entries, p = [], 0
    for round_ in range(3):  # partition 0 reaches each barrier first: 1 entry against 3
        for key in [zero[round_], *one[3 * round_ : 3 * round_ + 3], None]:
            p += 1
            entries.append(WireEntry(p, LOG, b"%d" % p, key=key))
    entries.append(WireEntry(p + 1, LOG, b"last", key=zero[3]))
    store.recv.apply_log_batch("src-a", CLIENT, entries)
    listener = Recorder()
    run_sub(listener, partitions=2, workers=2, batch_size=1, wake_on_arrival=False)
    wait_for(lambda: listener.of("src-a") == list(range(1, p + 2)), 30)
