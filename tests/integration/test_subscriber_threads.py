"""The threads a running subscriber starts: named for what they do, daemons, gone after it.

A stuck listener must never keep the application's process alive at its exit,
and a ``run`` that ended on an error leaves no thread of its own behind.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy.orm import Session

import lr_client.partition_workers as partition_workers
from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.wait import join, wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC


class Halt(BaseException):
    """Not an ``Exception``: the subscriber lets it end ``run``, as an interrupt would."""


class Held(RoutingQueueListener):
    """Blocks in its first batch until released, then raises ``halt`` if given one."""

    def __init__(self, halt: BaseException | None = None) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.halt = halt

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.inside.set()
        assert self.release.wait(60), "never released"
        if self.halt is not None:
            raise self.halt
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def entries(count: int) -> list[WireEntry]:
    return [WireEntry(p, LOG, b"%d" % p, key=b"k%d" % p) for p in range(1, count + 1)]


def threads_named(prefix: str) -> dict[str, threading.Thread]:
    return {t.name: t for t in threading.enumerate() if t.name.startswith(prefix)}


@pytest.fixture
def started() -> Iterator[list[threading.Thread]]:
    """The threads a test runs ``run`` in: joined at the end, whatever happened."""
    made: list[threading.Thread] = []
    yield made
    for thread in made:
        join(thread, 60)


def test_a_single_subscribers_stop_relay_is_a_named_daemon_that_ends_with_run(
    store: SQLAlchemyQueueStore,
    started: list[threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The relay that rings the subscriber's doorbell at the stop also looks, now and
    then, whether ``run`` ended without one (here: the listener raised a
    ``BaseException``), and ends then."""
    monkeypatch.setattr(partition_workers, "RELAY_CHECK", 0.05)
    store.recv.apply_log_batch("src-a", CLIENT, entries(3))
    listener = Held(Halt("halt"))
    sub = RoutingQueueSubscriber(store, CLIENT, listener, poll_interval=30.0)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            sub.run(threading.Event())  # never set: only the listener's Halt ends it
        except Halt as exc:
            raised.append(exc)

    started.append(threading.Thread(target=run))
    started[0].start()
    try:
        assert listener.inside.wait(60)
        relay = threads_named("lr-stop-relay-")
        assert list(relay) == [f"lr-stop-relay-{CLIENT}"]
        assert relay[f"lr-stop-relay-{CLIENT}"].daemon
    finally:
        listener.release.set()
    join(started[0], 60)
    assert [str(e) for e in raised] == ["halt"]
    wait_for(lambda: not threads_named("lr-stop-relay-"), 30, what="the relay ended")
    sub.close()


def test_partition_workers_are_named_daemons(
    store: SQLAlchemyQueueStore, started: list[threading.Thread]
) -> None:
    store.recv.apply_log_batch("src-a", CLIENT, entries(6))
    listener = Held()
    sub = RoutingQueueSubscriber(  # two workers for three partitions
        store, CLIENT, listener, partitions=3, workers=2, poll_interval=30.0
    )
    stop = threading.Event()
    started.append(threading.Thread(target=sub.run, args=(stop,)))
    started[0].start()
    try:
        assert listener.inside.wait(60)
        workers = wait_for(
            lambda: (
                len(threads_named("lr-partition-worker-")) == 2
                and threads_named("lr-partition-worker-")
            ),
            30,
        )
        assert sorted(workers) == ["lr-partition-worker-0", "lr-partition-worker-1"]
        assert all(thread.daemon for thread in workers.values())
    finally:
        stop.set()
        listener.release.set()
    join(started[0], 60)
    assert not threads_named("lr-partition-worker-")
    sub.close()
