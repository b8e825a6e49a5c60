"""The keyed entries of one receive queue, read once for all its partitions.

Each partition delivers only its own keyed entries, but they are interleaved
with every other partition's in the queue. A partition that read the queue
for itself would read every entry N times (N partitions), each one decoded,
hashed and thrown away by N - 1 of them. A :class:`Window` reads a range of the
queue once (``seq`` above :attr:`Window.hi`), hands each keyed entry to its
partition, and stops just below the first entry every partition waits for (a
barrier: no key, a full sync, a drop notice).

The window is only a read cache: a partition's delivery still commits with a
compare-and-set from the mark it read (:mod:`lr_client.partitioned`), and the
entries of a queue are immutable and appended in ``seq`` order, so what a read
saw of a range is all that range will ever hold. Per partition it keeps the
entries above the partition's mark up to :attr:`Window.covered` (every entry of
the partition up to there is held); at most ``cap`` of them: a partition that
falls that far behind the others stops being filled by the shared reads
(its ``covered`` stays where it stopped) and reads its own range up to ``hi``
when it gets there, so it never holds the others back nor grows without bound.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NamedTuple

from lr_client.records import HeadEntry, ReplicationType

_LOG = ReplicationType.LOG_ENTRY_SYNC

#: Reads the queue: the entries above ``seq`` ``after``, in order, at most ``limit``.
Reader = Callable[[int, int], list[HeadEntry]]
#: The partition of a key.
Partition = Callable[[bytes], int]


class Take(NamedTuple):
    """What a partition delivers next: its entries (payloads above the inline
    size left ``b""``) and the ``seq`` its mark rises to once they commit."""

    entries: list[HeadEntry]
    upto: int
    #: ``upto`` stands just below an entry every partition waits for.
    at_barrier: bool


class Window:
    """One subscriber's read cache of one queue's keyed entries, by partition."""

    def __init__(
        self,
        marks: dict[int, int],
        read: Reader,
        partition: Partition,
        limit: int,
        cap: int,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        #: Every entry up to ``hi`` was read (or passed by every partition).
        self.hi = min(marks.values())
        #: ``hi`` stands just below a barrier: nothing is read past it.
        self.barrier = False
        #: Per partition: every entry of it up to here is in ``held`` (or delivered).
        self.covered = [marks[p] for p in range(len(marks))]
        self.held: list[deque[HeadEntry]] = [deque() for _ in marks]
        self.read, self.partition, self.limit, self.cap = read, partition, limit, cap
        #: Held across a read (``threading.Lock`` by default); a caller serialising its
        #: takes itself (an ``asyncio.Lock`` in the async subscriber) passes a no-op.
        self.lock: AbstractContextManager[object] = threading.Lock() if lock is None else lock

    def take(self, partition: int, mark: int, count: int) -> Take | None:
        """The next (at most ``count``) entries of ``partition``, whose mark is ``mark``;
        None if nothing is known or left above it (the queue's end)."""
        with self.lock:
            held = self.held[partition]
            while held and held[0].seq <= mark:
                held.popleft()
            if mark > self.covered[partition]:
                self.covered[partition] = mark
            while not held and self.covered[partition] == mark:
                if self.barrier and mark == self.hi:
                    return Take([], mark, True)
                if mark < self.hi:
                    moved = self._fill(mark, [partition], self.hi)
                else:
                    moved = self._fill(self.hi, self._level(), None)
                if not moved:
                    return None
            entries = [held[i] for i in range(min(count, len(held)))]
            if len(held) > len(entries):
                upto = held[len(entries)].seq - 1
            else:
                upto = self.covered[partition]
            return Take(entries, upto, self.barrier and upto == self.hi)

    def _level(self) -> list[int]:
        """The partitions a read above ``hi`` fills: those with nothing missing below it."""
        return [p for p, seq in enumerate(self.covered) if seq >= self.hi]

    def _fill(self, after: int, partitions: list[int], bound: int | None) -> bool:
        """Read above ``after`` (up to ``bound``, or on to a barrier or the end), and
        hold the entries of ``partitions`` there; whether anything new was read."""
        rows = self.read(after, self.limit)
        last = after
        barrier = False
        whole = len(rows) < self.limit  # every row above ``after`` was read (this instant)
        full: set[int] = set()
        wanted = set(partitions)
        for e in rows:
            if bound is not None and e.seq > bound:
                whole = True
                break
            if e.type is not _LOG or e.key is None:
                barrier = True
                last = e.seq - 1  # every row below it was read
                break
            p = self.partition(e.key)
            if p in wanted and p not in full and e.seq > self.covered[p]:
                if len(self.held[p]) >= self.cap:
                    full.add(p)  # held back: it reads its own range when it gets there
                    self.covered[p] = e.seq - 1
                else:
                    self.held[p].append(e)
            last = e.seq
        if bound is not None and whole and not barrier:
            last = bound  # nothing (left) between the rows read and the bound
        for p in wanted - full:
            self.covered[p] = max(self.covered[p], last)
        if bound is None:
            self.hi = max(self.hi, last)
            self.barrier = barrier
        return last > after or bool(full) or (barrier and bound is None)
