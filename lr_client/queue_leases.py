"""The leases of receive queues one subscriber holds (see
:mod:`lr_client.store.subscriber_queues`), as it last took or renewed them.

What the subscriber (:mod:`lr_client.subscriber`) and delivery by partition
(:mod:`lr_client.partitioned`) share: a lease is taken or renewed once less
than half of it is left, with the queue's partition count claimed in the
same transaction; each delivery renews it with the expiry it saves.
"""

from __future__ import annotations

import threading
import time

from lr_client.store import SubscriberQueues


class QueueLeases:
    """``owner``'s leases of ``store``'s receive queues, each ``lease_seconds`` long, for
    delivery with ``partitions`` partitions."""

    def __init__(
        self, store: SubscriberQueues, owner: str, lease_seconds: float, partitions: int
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.partitions = partitions
        #: {queue id: its lease's expiry}: wall clock, as stored in the lease row.
        self.until: dict[int, float] = {}
        self.lock = threading.Lock()

    def hold(self, queue_id: int) -> bool:
        """Whether this owner holds the queue's lease, taking or renewing it once less
        than half of it is left (a round trip then, else none)."""
        with self.lock:
            now = time.time()
            if self.until.get(queue_id, 0.0) - now > self.lease_seconds / 2:
                return True
            with self.store.write() as conn:
                expires = self.store.acquire_lease(
                    conn, queue_id, self.owner, now, self.lease_seconds
                )
                if expires is not None:
                    # The partition count of the queue: refused (and the lease not
                    # taken) if it differs and the queue is not drained.
                    self.store.claim_partitions(conn, queue_id, self.partitions)
            if expires is None:
                self.until.pop(queue_id, None)
                return False
            self.until[queue_id] = expires
            return True

    def expiry(self) -> float:
        """The expiry a delivery starting now saves with the queue's state."""
        return time.time() + self.lease_seconds

    def renewed(self, queue_id: int, expires: float) -> None:
        """A delivery committed the queue's lease until ``expires``."""
        self.until[queue_id] = expires

    def lost(self, queue_id: int) -> None:
        """The queue's lease is another's now, or may be: taken again before delivering."""
        self.until.pop(queue_id, None)


__all__ = ["QueueLeases"]
