"""The leases of receive queues one subscriber holds (see
:mod:`lr_client.store.recv.queues`), as it last took or renewed them.

What the subscriber (:mod:`lr_client.subscriber`) and delivery by partition
(:mod:`lr_client.partitioned`) share: a lease is taken or renewed once less
than half of it is left, with the queue's partition count claimed in the
same transaction; each delivery renews it with the expiry it saves.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy.engine import Connection

from lr_client.store import DeliveryStore


class QueueLeases:
    """``owner``'s leases of ``store``'s receive queues, each ``lease_seconds`` long, for
    delivery with ``partitions`` partitions."""

    def __init__(
        self, store: DeliveryStore, owner: str, lease_seconds: float, partitions: int
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
            if self.fresh(queue_id):
                return True
            with self.store.write() as conn:
                expires = self.take(conn, queue_id)
            return self.taken(queue_id, expires)

    def fresh(self, queue_id: int) -> bool:
        """Whether more than half of this owner's lease of the queue is left (no round trip)."""
        return self.until.get(queue_id, 0.0) - time.time() > self.lease_seconds / 2

    def take(self, conn: Connection, queue_id: int) -> float | None:
        """Take or renew the queue's lease in ``conn``'s transaction: its expiry, or None
        if another owner holds it. The queue's partition count is claimed with it:
        refused (:class:`~lr_client.errors.PartitionCountError`, the lease not taken) if
        it differs and the queue is not drained."""
        expires = self.store.queues.acquire_lease(
            conn, queue_id, self.owner, time.time(), self.lease_seconds
        )
        if expires is not None:
            self.store.partitions.claim_partitions(conn, queue_id, self.partitions)
        return expires

    def taken(self, queue_id: int, expires: float | None) -> bool:
        """Record what :meth:`take` committed; whether this owner holds the lease."""
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
