"""The own ``delivered_seq`` of queues delivered by partition, raised behind them.

A partition's delivery commits its own mark only (:mod:`lr_client.partitioned`);
the queue's mark (what retires entries and what a status reads) is raised to
the minimum over its partitions now and then, by one worker at a time. What the
sync subscriber's threads and the async subscriber's tasks share.
"""

from __future__ import annotations

import threading
import time

from lr_client.store import DeliveryStore


class QueueMarks:
    """The queues of ``owner`` whose partitions moved since their own mark was raised."""

    def __init__(self, store: DeliveryStore, owner: str) -> None:
        self.store, self.owner = store, owner
        #: {queue id: when (monotonic) its partitions first moved since the last raise}.
        self.behind: dict[int, float] = {}
        #: Taken without waiting: a worker finding it held leaves the raise to its holder
        #: (so an async task never blocks the event loop on it).
        self.lock = threading.Lock()

    def moved(self, queue_id: int) -> None:
        """A partition of the queue committed a delivery."""
        self.behind.setdefault(queue_id, time.monotonic())

    def raise_due(self, every: float) -> None:
        """Raise the own mark of the queues whose partitions moved ``every`` seconds ago
        or more (one worker at a time; partition deliveries never write that row)."""
        if not self.behind or not self.lock.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            for qid, since in list(self.behind.items()):
                if now - since < every:
                    continue
                self.behind.pop(qid, None)
                try:
                    with self.store.write() as conn:
                        self.store.partitions.raise_queue_mark(conn, qid, self.owner)
                except BaseException:
                    self.behind.setdefault(qid, since)
                    raise
        finally:
            self.lock.release()


__all__ = ["QueueMarks"]
