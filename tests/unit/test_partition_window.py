"""The read cache of delivery by partition: each keyed entry read once for every
partition, handed to its own in order, barriers and lagging partitions."""

from __future__ import annotations

import random

from lr_client.partition_window import Take, Window
from lr_client.records import HeadEntry, ReplicationType

LOG = ReplicationType.LOG_ENTRY_SYNC


class Queue:
    """Entries in seq order; counts the rows each read returns."""

    def __init__(self, entries: list[HeadEntry]) -> None:
        self.entries = entries
        self.rows_read = 0
        self.reads = 0

    def read(self, after: int, limit: int) -> list[HeadEntry]:
        rows = [e for e in self.entries if e.seq > after][:limit]
        self.rows_read += len(rows)
        self.reads += 1
        return rows


def entry(seq: int, key: int | None) -> HeadEntry:
    return HeadEntry(seq, LOG, seq, "", b"p", None, None if key is None else b"%d" % key)


def part(count: int):  # type: ignore[no-untyped-def]
    return lambda key: int(key) % count


def drain(
    window: Window, marks: dict[int, int], batch: int, order: list[int]
) -> dict[int, list[int]]:
    """Take and commit batches for the partitions in ``order`` (repeated), from their
    ``marks``, until none moves; {partition: seqs delivered}."""
    marks = dict(marks)
    got: dict[int, list[int]] = {p: [] for p in marks}
    moved = True
    while moved:
        moved = False
        for p in order:
            took = window.take(p, marks[p], batch)
            if took is None or took.upto <= marks[p]:
                continue
            assert all(marks[p] < e.seq <= took.upto for e in took.entries)
            got[p] += [e.seq for e in took.entries]
            marks[p] = took.upto
            moved = True
    return got


def test_each_entry_is_read_once_and_reaches_its_partition_in_order() -> None:
    rng = random.Random(3)
    count, batch = 8, 5
    queue = Queue([entry(s, rng.randrange(50)) for s in range(1, 2001)])
    window = Window(
        dict.fromkeys(range(count), 0), queue.read, part(count), batch * count, 8 * batch
    )
    got = drain(window, dict.fromkeys(range(count), 0), batch, list(range(count)))
    for p in range(count):
        assert got[p] == [e.seq for e in queue.entries if int(e.key or b"") % count == p]
    assert queue.rows_read == 2000  # once, not once per partition


def test_partitions_stop_just_below_a_barrier() -> None:
    entries = [entry(s, s) for s in range(1, 31)]
    entries[19] = entry(20, None)
    queue = Queue(entries)
    window = Window({0: 0, 1: 0, 2: 0}, queue.read, part(3), 9, 12)
    got = drain(window, {0: 0, 1: 0, 2: 0}, 3, [0, 1, 2])
    assert sorted(s for seqs in got.values() for s in seqs) == list(range(1, 20))
    for p in range(3):
        assert window.take(p, 19, 3) == Take([], 19, True)


def test_a_partition_far_behind_holds_at_most_its_cap_and_misses_nothing() -> None:
    count, batch, cap = 4, 2, 4
    queue = Queue([entry(s, s) for s in range(1, 401)])
    window = Window(dict.fromkeys(range(count), 0), queue.read, part(count), batch * count, cap)
    marks = dict.fromkeys(range(1, count), 0)
    for _ in range(100):  # partitions 1 to 3 run ahead; 0 waits
        for p in marks:
            took = window.take(p, marks[p], batch)
            if took is not None:
                marks[p] = took.upto
        assert len(window.held[0]) <= cap
    assert min(marks.values()) == 400
    got = drain(window, {0: 0}, batch, [0])
    assert got[0] == list(range(4, 401, 4))


def test_marks_apart_and_rows_deleted_below_them() -> None:
    """A window made from marks that stand apart (SQLite deleted what the partitions
    ahead delivered): each partition gets what is above its own mark."""
    count = 2
    entries = [entry(s, s) for s in range(1, 101)]
    marks = {0: 10, 1: 50}  # partition 1 delivered its entries up to 50: deleted
    queue = Queue([e for e in entries if not (e.seq <= 50 and e.seq % 2 == 1)])
    window = Window(marks, queue.read, part(count), 6, 20)
    got = drain(window, marks, 3, [1, 0])
    assert got[0] == list(range(12, 101, 2))
    assert got[1] == list(range(51, 101, 2))
