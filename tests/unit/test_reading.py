"""CachedReading: read at most every interval, by one thread at a time."""

from __future__ import annotations

import threading

import pytest

from lr_client.reading import CachedReading


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


class Source:
    """Counts its reads; a read can be held until released."""

    def __init__(self) -> None:
        self.reads = 0
        self.value = "v0"
        self.hold: threading.Event | None = None
        self.inside = threading.Event()

    def __call__(self) -> str:
        self.reads += 1
        self.inside.set()
        if self.hold is not None:
            assert self.hold.wait(30), "the test never let the read finish"
        return self.value


def test_it_reads_once_per_interval(clock: Clock) -> None:
    src = Source()
    r = CachedReading(src, 0.25, clock)
    assert [r.get() for _ in range(5)] == ["v0"] * 5
    assert src.reads == 1
    src.value = "v1"
    clock.now += 0.2
    assert r.get() == "v0" and src.reads == 1  # not stale yet
    clock.now += 0.05
    assert r.get() == "v1" and src.reads == 2


def test_fresh_and_interval_zero_read_every_time(clock: Clock) -> None:
    src = Source()
    r = CachedReading(src, 60.0, clock)
    r.get()
    src.value = "v1"
    assert r.get(fresh=True) == "v1" and src.reads == 2
    assert r.get() == "v1" and src.reads == 2  # the fresh reading is the cached one now
    every = CachedReading(src, 0.0, clock)
    for _ in range(3):
        every.get()
    assert src.reads == 5


def test_while_one_thread_reads_again_the_others_use_the_last_reading(clock: Clock) -> None:
    src = Source()
    r = CachedReading(src, 0.25, clock)
    assert r.get() == "v0"
    clock.now += 1.0  # stale
    src.value, src.hold, src.inside = "v1", threading.Event(), threading.Event()
    refresher = threading.Thread(target=r.get)
    refresher.start()
    assert src.inside.wait(30)
    others = [r.get() for _ in range(20)]  # each would read, if nothing were in flight
    assert others == ["v0"] * 20
    assert src.reads == 2
    src.hold.set()
    refresher.join(30)
    assert r.get() == "v1" and src.reads == 2


def test_a_thread_with_no_reading_waits_for_the_one_in_flight(clock: Clock) -> None:
    src = Source()
    src.hold = threading.Event()
    r = CachedReading(src, 0.25, clock)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(r.get())) for _ in range(4)]
    for t in threads:
        t.start()
    assert src.inside.wait(30)
    src.value = "v1"
    src.hold.set()
    for t in threads:
        t.join(30)
    assert got == ["v1"] * 4
    assert src.reads == 1


def test_a_failed_read_raises_and_the_next_call_reads_again(clock: Clock) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("down")
        return "ok"

    r = CachedReading(flaky, 0.25, clock)
    with pytest.raises(ConnectionError):
        r.get()
    assert r.get() == "ok"  # the lock was let go
    assert len(calls) == 2


def test_an_older_reading_never_replaces_a_newer_one(clock: Clock) -> None:
    values = iter(["slow", "newer"])
    started, let_go = threading.Event(), threading.Event()

    def read() -> str:
        value = next(values)
        if value == "slow":
            started.set()
            assert let_go.wait(30), "the test never let the slow read finish"
        return value

    r = CachedReading(read, 0.25, clock)
    slow = threading.Thread(target=r.get)  # the first reading, started at 100.0
    slow.start()
    assert started.wait(30)
    clock.now += 0.1
    assert r.get(fresh=True) == "newer"  # started at 100.1, finished first
    let_go.set()
    slow.join(30)
    assert not slow.is_alive()
    assert r.get() == "newer"


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        CachedReading(lambda: 1, -1.0)


def test_cached_gives_a_fresh_reading_and_never_reads() -> None:
    clock = Clock()
    reads: list[int] = []

    def read() -> int:
        reads.append(1)
        return len(reads)

    reading = CachedReading(read, 1.0, clock)
    assert reading.cached() is None  # nothing read yet, and cached() does not read
    assert reads == []
    assert reading.get() == 1
    assert reading.cached() == (1,)
    clock.now += 1.0  # as old as the interval: stale
    assert reading.cached() is None
    assert reads == [1]
    assert CachedReading(read, 0.0, clock).cached() is None  # interval 0: always read


def test_cached_gives_the_last_reading_while_another_caller_reads_it_again(clock: Clock) -> None:
    src = Source()
    r = CachedReading(src, 0.25, clock)
    assert r.get() == "v0"
    clock.now += 1.0  # stale: the first caller to look reads it again
    assert r.cached() is None
    src.value, src.hold, src.inside = "v1", threading.Event(), threading.Event()
    refresher = threading.Thread(target=r.get)
    refresher.start()
    assert src.inside.wait(30)
    assert r.cached() == ("v0",)  # as get() gives meanwhile: no second caller sent to read
    src.hold.set()
    refresher.join(30)
    assert r.cached() == ("v1",) and src.reads == 2
