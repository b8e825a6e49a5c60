"""How much waits in one receive queue: what a sink's receive limits are checked against."""

from __future__ import annotations

from sqlalchemy import func, select

from lr_client.names import recv_queue_name
from lr_client.store import schema as s
from lr_client.store.base import StoreBase
from lr_client.store.subscriber_queues import undelivered


class QueueSizesStore(StoreBase):
    """The undelivered entries and bytes of a receive queue."""

    def receive_queue_size(self, source_id: str, client_name: str) -> tuple[int, int]:
        """One index range of the queue (its undelivered entries): its cost grows with
        what waits, which the limits it serves keep small."""
        r, reg = s.recv_entries, s.queue_registry
        name = recv_queue_name(client_name, source_id)
        with self.read() as conn:
            qid = conn.execute(select(reg.c.queue_id).where(reg.c.queue_name == name)).scalar()
            if qid is None:
                return 0, 0
            row = conn.execute(
                select(func.count(), func.coalesce(func.sum(func.length(r.c.payload)), 0)).where(
                    undelivered(qid)
                )
            ).one()
        return int(row[0]), int(row[1])


__all__ = ["QueueSizesStore"]
