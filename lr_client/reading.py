"""A value read from the database at most every so often, shared by the threads of a client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class CachedReading(Generic[T]):
    """``read()``'s last result, read again once it is ``interval`` seconds old.

    One thread reads at a time: while a reading is in flight, the other threads
    go on with the last one (at most ``interval`` plus one read's duration old)
    instead of each sending the same query. A thread with no reading yet waits
    for the one in flight. ``interval`` 0 reads on every call; so does
    :meth:`get` with ``fresh=True`` (a reading that starts after the call).
    """

    def __init__(
        self, read: Callable[[], T], interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if interval < 0:
            raise ValueError("interval must be >= 0")
        self._read = read
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()  # held by the thread reading it again
        self._set = threading.Lock()  # guards replacing _last
        #: (the clock's time when the reading started, its value), or None before the first.
        self._last: tuple[float, T] | None = None

    def cached(self) -> tuple[T] | None:
        """What :meth:`get` would give without reading, in a 1-tuple: the last reading if
        it is younger than ``interval``, or while another caller reads it again; else None.

        Never reads: a caller that must not block (an event loop) reads with
        :meth:`get` elsewhere when this gives None, so a stale reading sends one
        caller there, not each of them.
        """
        last = self._last
        if last is None or self.interval <= 0:
            return None
        if self._clock() - last[0] < self.interval or self._lock.locked():
            return (last[1],)
        return None

    def get(self, fresh: bool = False) -> T:
        last = self._last
        if fresh or self.interval <= 0:
            return self._take()
        if last is not None and self._clock() - last[0] < self.interval:
            return last[1]
        if last is not None and not self._lock.acquire(blocking=False):
            return last[1]  # another thread is reading it again
        if last is None:
            self._lock.acquire()
        try:
            last = self._last  # read again while this thread waited for the lock?
            if last is not None and self._clock() - last[0] < self.interval:
                return last[1]
            return self._take()
        finally:
            self._lock.release()

    def _take(self) -> T:
        started = self._clock()
        value = self._read()
        with self._set:
            last = self._last
            if last is None or last[0] <= started:  # never replace a newer reading
                self._last = (started, value)
        return value


__all__ = ["CachedReading"]
