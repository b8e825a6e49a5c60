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


@pytest.fixture
def run_sub(store: SQLAlchemyQueueStore) -> Iterator[Callable[..., RoutingQueueSubscriber]]:
    """Start ``run`` of a subscriber by partition in a thread; stopped at the end."""
    running: list[tuple[RoutingQueueSubscriber, threading.Event, threading.Thread]] = []

    def start(listener: RoutingQueueListener, **kw: object) -> RoutingQueueSubscriber:
        kw = {"partitions": 3, "workers": 1, "poll_interval": HOUR, **kw}
        sub = RoutingQueueSubscriber(store, CLIENT, listener, **kw)  # type: ignore[arg-type]
        stop = threading.Event()
        thread = threading.Thread(target=sub.run, args=(stop,))
        running.append((sub, stop, thread))
        thread.start()
        return sub

    yield start
    for sub, stop, thread in running:
        stop.set()
        join(thread, 60)
        sub.close()


def test_a_backlog_past_one_turns_batches_is_delivered_without_waiting_for_the_poll(
    store: SQLAlchemyQueueStore, run_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    """A turn delivers at most ``max_batches`` batches of each partition; one that
    delivered turns again at once."""
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 12))
    listener = Recorder()
    run_sub(listener, batch_size=1, max_batches=1, wake_on_arrival=False)
    wait_for(lambda: listener.of("src-a") == list(range(1, 13)), 30)


def test_only_the_subscribers_client_is_delivered(
    store: SQLAlchemyQueueStore, run_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    store.recv.apply_log_batch("src-a", "other", keyed(1, 4))
    store.recv.apply_log_batch("src-a", CLIENT, keyed(1, 3))
    (others,) = [q.queue_id for q in store.queues.list_queues("other")]
    listener = Recorder()
    run_sub(listener)
    wait_for(lambda: listener.of("src-a") == [1, 2, 3], 30)
    assert store.queues.queue_depth(others) == 4 and not listener.errors


def test_a_partition_waiting_to_retry_holds_back_neither_the_others_nor_its_attempts(
    store: SQLAlchemyQueueStore, run_sub: Callable[..., RoutingQueueSubscriber]
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
    store: SQLAlchemyQueueStore, run_sub: Callable[..., RoutingQueueSubscriber]
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
    run_sub: Callable[..., RoutingQueueSubscriber],
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
    store: SQLAlchemyQueueStore, run_sub: Callable[..., RoutingQueueSubscriber]
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
