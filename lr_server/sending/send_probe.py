"""The safety net under the send queue's watch: one read of the head for every session.

The watch (:meth:`~lr_client.store.contract.Shipping.watch_sends`) wakes the sender
sessions when entries come, but a wake-up may be lost: on PostgreSQL a process notifies
at most once per :data:`~lr_client.store.watches.NOTIFY_INTERVAL`, so a transaction that
transmitted just after another one and commits later is never announced. Every
:data:`PROBE_INTERVAL` the server reads the head of the send queue (on PostgreSQL the read
gives positions to what committed first) and, if it moved, has its sessions read at once
(the server's ``head_moved``: a sweep, which keeps their back-off): what a lost wake-up
costs stays bounded by that. The sessions' safety poll is the probe's too: every
:data:`SWEEP_INTERVAL` without a move it sweeps them (each reads once, at once, so the
shared reader serves them all with one read per client); on their own they read only
every :data:`STEADY_POLL_MAX`, in case the probe is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from lr_client.errors import LRError

log = logging.getLogger("lr.server")

#: Seconds between two reads of the send queue's head.
PROBE_INTERVAL = 5.0
#: Seconds between the sessions' safety polls, taken together by the probe (:meth:`SendProbe.run`).
SWEEP_INTERVAL = 60.0
#: Seconds a steady idle session waits at most between its own reads, under the probe.
STEADY_POLL_MAX = 300.0


def next_wait(idle: float, steady: bool, fast: float, idle_max: float, steady_max: float) -> float:
    """A session's wait after a round that found nothing: double from ``fast`` up to
    ``idle_max`` (a lost wake-up costs at most that); a steady session then waits
    ``steady_max`` at once (under the probe, its sweep is the safety poll)."""
    if steady and idle >= idle_max:
        return max(fast, steady_max)
    return min(max(fast, idle_max), idle * 2)


def on_grid(wait: float) -> float:
    """``wait`` shortened to end on the next multiple of itself (of ``time.monotonic()``):
    sessions backing off wake at the same moments, each level's among the level's below,
    so that the shared reader and the board of requests serve them with one read."""
    return wait - time.monotonic() % wait if wait > 0 else wait


class SendProbe:
    """Calls ``wake()`` when ``head()`` answers differently than at its last call, and at
    its first: what committed before it (its first read may come late on a busy machine,
    after the sessions' first reads) may have no other wake-up. Calls ``sweep()`` when
    ``sweep_interval`` passed without a wake-up."""

    def __init__(
        self,
        head: Callable[[], int],
        wake: Callable[[], None],
        sweep: Callable[[], None] = lambda: None,
        interval: float | None = None,
        sweep_interval: float | None = None,
    ) -> None:
        self.head = head
        self.wake = wake
        self.sweep = sweep
        self.interval = PROBE_INTERVAL if interval is None else interval
        self.sweep_interval = SWEEP_INTERVAL if sweep_interval is None else sweep_interval
        self.last: int | None = None
        self.swept_at = time.monotonic()  # the last wake-up or sweep

    def check(self) -> bool:
        """One read; whether the head moved since the last one (and the wake-up went)."""
        head = self.head()
        moved = head != self.last
        self.last = head
        if moved:
            self.wake()
        return moved

    def step(self, now: float) -> None:
        """One read at ``now`` (``time.monotonic()``), and the sweep if it is due."""
        if self.check():  # the sessions read now anyway
            self.swept_at = now
        elif now - self.swept_at >= self.sweep_interval:
            self.sweep()
            self.swept_at = now

    def run(self, stop: threading.Event) -> None:
        self.swept_at = time.monotonic()
        while not stop.wait(self.interval):
            try:
                self.step(time.monotonic())
            except LRError as exc:  # the database is away: the next read tries again
                log.info("send queue probe: %s", exc)


__all__ = [
    "PROBE_INTERVAL",
    "STEADY_POLL_MAX",
    "SWEEP_INTERVAL",
    "SendProbe",
    "next_wait",
    "on_grid",
]
