"""The safety net under the send queue's watch: one read of the head for every session.

The watch (:meth:`~lr_client.store.contract.Shipping.watch_sends`) wakes the sender
sessions when entries come, but a wake-up may be lost: on PostgreSQL a process notifies
at most once per :data:`~lr_client.store.watches.NOTIFY_INTERVAL`, so a transaction that
transmitted just after another one and commits later is never announced. Every
:data:`PROBE_INTERVAL` the server reads the head of the send queue (on PostgreSQL the read
gives positions to what committed first) and wakes its sessions if it moved: what a lost
wake-up costs stays bounded by that, while each idle session reads on its own only
rarely (``steady_poll_max``), whatever the number of destinations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from lr_client.errors import LRError

log = logging.getLogger("lr.server")

#: Seconds between two reads of the send queue's head.
PROBE_INTERVAL = 5.0
#: Seconds a steady idle session waits at most between its own reads, under the probe.
STEADY_POLL_MAX = 60.0


class SendProbe:
    """Calls ``wake()`` when ``head()`` answers differently than at its last call, and at
    its first: what committed before it (its first read may come late on a busy machine,
    after the sessions' first reads) may have no other wake-up."""

    def __init__(
        self, head: Callable[[], int], wake: Callable[[], None], interval: float | None = None
    ) -> None:
        self.head = head
        self.wake = wake
        self.interval = PROBE_INTERVAL if interval is None else interval
        self.last: int | None = None

    def check(self) -> bool:
        """One read; whether the head moved since the last one (and the wake-up went)."""
        head = self.head()
        moved = head != self.last
        self.last = head
        if moved:
            self.wake()
        return moved

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.check()
            except LRError as exc:  # the database is away: the next read tries again
                log.info("send queue probe: %s", exc)


__all__ = ["PROBE_INTERVAL", "STEADY_POLL_MAX", "SendProbe"]
