"""The site's upkeep, on a schedule: retention (drops, backpressure, lag metrics),
trim, the rotation of the receive queues and the planner's statistics.

It runs in the member that owns the trim unit. While the send queue is idle
(its head unmoved since a round that found every stream caught up) retention
waits for the head to move, or for :data:`IDLE_RETENTION_PERIOD`: an idle site
does not measure every stream's backlog and rewrite every client's flow state
each ``trim_interval``. Trim runs every round; rounds that find nothing to do
come at doubling intervals, from ``trim_interval`` up to :data:`IDLE_UPKEEP_MAX`,
and a wake-up (:meth:`Upkeep.wake`: entries came, or the units moved) ends that
wait, though rounds never come closer than ``trim_interval``. The planner's
statistics are refreshed only after a round that found something to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from lr_client.errors import FencedError
from lr_client.records import Fence
from lr_client.store import QueueStore
from lr_server import metrics
from lr_server.cluster.retention import RetentionPolicy
from lr_server.config import SiteConfig

log = logging.getLogger("lr.server")

#: Seconds between refreshes of the send queue's planner statistics.
ANALYZE_INTERVAL = 15.0
#: Seconds between retention rounds while the send queue is idle.
IDLE_RETENTION_PERIOD = 120.0
#: Seconds between upkeep rounds at most, while rounds find nothing to do.
IDLE_UPKEEP_MAX = 30.0


class Upkeep:
    """Retention, trim and rotation every ``trim_interval`` while this member owns the
    trim unit (``fence()`` is its lease, None while another member owns it)."""

    def __init__(
        self,
        store: QueueStore,
        config: SiteConfig,
        fence: Callable[[], Fence | None],
        after_trim: Callable[[], None],
    ) -> None:
        self.store = store
        self.config = config
        self.fence = fence
        self.after_trim = after_trim
        self.policy = RetentionPolicy(store, config)
        #: The send queue's head when a round found it idle (None: not idle).
        self.quiet_head: int | None = None
        self._full_at = float("-inf")
        self._analyzed = time.monotonic()
        self._changed = True  # the queue may have changed since the last refresh
        self._woken = threading.Event()

    def wake(self) -> None:
        """Something may have changed (entries came, the units moved, the stop): the next
        round comes ``trim_interval`` after the last, not at the idle back-off."""
        self._woken.set()

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set (whoever sets it calls :meth:`wake`)."""
        self.store.retention.rotation_period = self.config.retention.rotation_period
        self.store.retention.max_slots = self.config.retention.max_slots
        every = self.config.retention.trim_interval
        wait = every
        while not stop.wait(every):
            if wait > every:
                self._woken.wait(wait - every)
            self._woken.clear()
            if stop.is_set():
                break
            fence = self.fence()
            if fence is None:  # another member runs the trim job
                wait = max(every, IDLE_UPKEEP_MAX)
                continue
            busy = True
            try:
                busy = self.round(fence)
            except FencedError as exc:  # the trim unit moved to another member meanwhile
                log.info("trim stopped: %s", exc)
            except Exception:
                log.exception("retention or trim failed")
            wait = every if busy else min(max(every, IDLE_UPKEEP_MAX), wait * 2)

    def round(self, fence: Fence | None) -> bool:
        """One round, its writes under ``fence`` (None: unfenced, a single server);
        whether it found something to do (the head moved, a backlog, a trim, a rotation)."""
        now = time.monotonic()
        head = self.store.send.head_position()
        busy = head != self.quiet_head
        if busy or now - self._full_at >= IDLE_RETENTION_PERIOD:
            # Also with no destinations: unconfigured ones are bounded too.
            report = self.policy.run_once()
            idle = all(h.backlog.entries == 0 for h in report.streams)
            self.quiet_head, self._full_at = (head if idle else None), now
            busy = busy or not idle
        # Every round: what was released (a drop) or passed goes even while idle, and on
        # PostgreSQL a slot is retired whole once its time is up, not when it is passed.
        n = self.store.retention.trim(self.config.retention.trim_batch, max_batches=10, fence=fence)
        if n:
            metrics.TRIMMED.inc(n)
        self.after_trim()
        rotated = None
        if self.config.listen:  # a sink: retire delivered receive queue entries
            rotated = self.store.queues.rotate_receive_queues(self.config.receiver.rotation_period)
            if rotated is not None:
                metrics.RECV_ROTATIONS.inc()
        busy = busy or bool(n) or rotated is not None
        self._changed = self._changed or busy
        if time.monotonic() - self._analyzed > ANALYZE_INTERVAL and self._changed:
            self.store.send.analyze()
            self._analyzed, self._changed = time.monotonic(), False
        return busy


__all__ = ["ANALYZE_INTERVAL", "IDLE_RETENTION_PERIOD", "IDLE_UPKEEP_MAX", "Upkeep"]
