"""A wait that ends at the next ring after a given turn: no ring is lost.

A poller reads :meth:`Doorbell.turn` before it looks for work and, finding
none, waits with that turn: a ring that came while it looked ends the wait at
once, which a plain :class:`threading.Condition` would have lost.
"""

from __future__ import annotations

import threading


class Doorbell:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rings = 0

    def turn(self) -> int:
        """The rings so far: pass it to :meth:`wait` after looking for work."""
        with self._cond:
            return self._rings

    def ring(self) -> None:
        """End every wait in progress and every wait of an earlier turn."""
        with self._cond:
            self._rings += 1
            self._cond.notify_all()

    def wait(self, turn: int, timeout: float) -> bool:
        """Wait until a ring after ``turn`` (True) or ``timeout`` seconds (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._rings != turn, timeout)


__all__ = ["Doorbell"]
