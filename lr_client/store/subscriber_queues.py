"""The :class:`~lr_client.store.contract.SubscriberQueues` role: a sink's subscriber.

Receive queues, and the per-queue subscriber state and leases in
``lrq_subscriber_state``; the methods that take a ``Connection`` run in the
caller's (the delivering) transaction.

A lease row says which subscriber (``lease_owner``) may deliver a receive
queue until ``lease_expires`` (wall-clock seconds). It is taken with one
conditional ``UPDATE`` (free, expired or already ours), so two subscribers can
never both succeed, on SQLite or PostgreSQL. The delivering transaction then
*fences* itself: it writes the queue's new state with
``WHERE lease_owner = :me`` and rolls back when that matches no row, so a
subscriber whose lease was taken over can never commit a delivery.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, delete, func, literal, or_, select, update
from sqlalchemy.engine import Connection

from lr_client.records import HeadEntry, QueueInfo, RecvEntry, ReplicationType, SubscriberState
from lr_client.store import schema as s
from lr_client.store.base import StoreBase
from lr_client.store.byte_bounds import fill, sized, within

_T = s.subscriber_state
_R = s.recv_entries
_TYPES = {int(t): t for t in ReplicationType}


class SubscriberQueuesStore(StoreBase):
    """Receive queues as a subscriber delivers them, under leases."""

    def list_queues(self, client_name: str | None = None) -> list[QueueInfo]:
        query = select(s.queue_registry).order_by(s.queue_registry.c.queue_id)
        if client_name is not None:
            query = query.where(s.queue_registry.c.client_name == client_name)
        with self.read() as conn:
            rows = conn.execute(query).all()
        return [QueueInfo(r.queue_id, r.queue_name, r.client_name, r.source_id) for r in rows]

    def read_queue(self, conn: Connection, queue_id: int, limit: int) -> list[RecvEntry]:
        t = s.recv_entries
        reg = s.queue_registry
        rows = conn.execute(
            select(t, reg.c.source_id, reg.c.client_name)
            .join(reg, reg.c.queue_id == t.c.queue_id)
            .where(t.c.queue_id == queue_id)
            .order_by(t.c.seq)
            .limit(limit)
        ).all()
        return [
            RecvEntry(
                seq=r.seq,
                queue_id=r.queue_id,
                source_id=r.source_id,
                client_name=r.client_name,
                source_position=r.source_position,
                type=ReplicationType(r.type),
                payload=bytes(r.payload),
                snapshot_id=r.snapshot_id,
                snapshot_count=r.snapshot_count,
            )
            for r in rows
        ]

    def delete_entries(self, conn: Connection, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        lo, hi = min(seqs), max(seqs)
        t = s.recv_entries
        if hi - lo + 1 == len(seqs):
            query = delete(t).where(and_(t.c.seq >= lo, t.c.seq <= hi))
        else:
            query = delete(t).where(t.c.seq.in_(list(seqs)))
        return int(conn.execute(query).rowcount or 0)

    def queue_depth(self, queue_id: int) -> int:
        with self.read() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(s.recv_entries.c.queue_id == queue_id)
                ).scalar_one()
            )

    # -- subscriber state and leases (in the caller's transaction) -------------------------
    def load_state(self, conn: Connection, queue_id: int) -> SubscriberState:
        """The queue's state (defaults if it has no row yet)."""
        row = conn.execute(select(_T).where(_T.c.queue_id == queue_id)).first()
        if row is None:
            return SubscriberState(queue_id)
        return SubscriberState(
            queue_id=row.queue_id,
            snapshot_id=row.snapshot_id,
            in_snapshot=bool(row.in_snapshot),
            delivered=int(row.delivered),
            lease_owner=row.lease_owner,
            lease_expires=float(row.lease_expires),
        )

    def _ensure_state_row(self, conn: Connection, queue_id: int) -> None:
        values = {
            "queue_id": queue_id,
            "snapshot_id": "",
            "in_snapshot": False,
            "delivered": 0,
            "lease_owner": "",
            "lease_expires": 0.0,
        }
        conn.execute(self.dialect_insert(_T).values(**values).on_conflict_do_nothing())

    def acquire_lease(
        self, conn: Connection, queue_id: int, owner: str, now: float, lease_seconds: float
    ) -> float | None:
        """Take or renew the queue's lease; return its expiry, or None if another holds it."""
        expires = now + lease_seconds
        stmt = (
            update(_T)
            .where(
                _T.c.queue_id == queue_id,
                or_(_T.c.lease_owner == owner, _T.c.lease_owner == "", _T.c.lease_expires < now),
            )
            .values(lease_owner=owner, lease_expires=expires)
        )
        if conn.execute(stmt).rowcount == 1:
            return expires
        if conn.execute(select(_T.c.queue_id).where(_T.c.queue_id == queue_id)).first() is not None:
            return None
        self._ensure_state_row(conn, queue_id)
        return expires if conn.execute(stmt).rowcount == 1 else None

    def save_state(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        *,
        snapshot_id: str,
        in_snapshot: bool,
        delivered: int,
        lease_expires: float,
    ) -> bool:
        """Write the queue's new state if ``owner`` still holds the lease (renewing it).

        Returns False when the lease was lost: the caller must roll back.
        """
        result = conn.execute(
            update(_T)
            .where(_T.c.queue_id == queue_id, _T.c.lease_owner == owner)
            .values(
                snapshot_id=snapshot_id,
                in_snapshot=in_snapshot,
                delivered=delivered,
                lease_expires=lease_expires,
            )
        )
        return result.rowcount == 1

    def release_leases(
        self, conn: Connection, owner: str, queue_ids: list[int] | None = None
    ) -> int:
        """Give up ``owner``'s leases (all of them, or those of ``queue_ids``)."""
        stmt = update(_T).where(_T.c.lease_owner == owner)
        if queue_ids is not None:
            stmt = stmt.where(_T.c.queue_id.in_(queue_ids))
        return int(conn.execute(stmt.values(lease_owner="", lease_expires=0.0)).rowcount or 0)

    def read_head(
        self, conn: Connection, queue_id: int, limit: int, max_bytes: int | None = None
    ) -> list[HeadEntry]:
        """The oldest entries of a receive queue, in seq order: at most ``limit``, and
        past the first no more than ``max_bytes`` (the store's one byte-cut rule).

        Sizes come first and large payloads only once their entry fits, so a queue
        of large payloads never loads more than the limit (see :func:`sized`).
        """
        query = (
            select(_R.c.seq, _R.c.type, _R.c.source_position, _R.c.snapshot_id, _R.c.base_position)
            .add_columns(*sized(_R.c.payload, limit, max_bytes))
            .where(_R.c.queue_id == queue_id)
            .order_by(_R.c.seq)
            .limit(limit)
        )
        rows = fill(conn, within(conn.execute(query).all(), max_bytes), _R.c.seq, _R.c.payload)
        make, types = HeadEntry._make, _TYPES
        return [make((r[0], types[r[1]], r[2], r[3], payload, r[4])) for r, payload in rows]

    def peek_head(self, conn: Connection, queue_id: int) -> HeadEntry | None:
        """The oldest entry of a receive queue, without its payload (``b""``)."""
        row = conn.execute(
            select(_R.c.seq, _R.c.type, _R.c.source_position, _R.c.snapshot_id, _R.c.base_position)
            .where(_R.c.queue_id == queue_id)
            .order_by(_R.c.seq)
            .limit(1)
        ).first()
        if row is None:
            return None
        return HeadEntry(row[0], _TYPES[row[1]], row[2], row[3], b"", row[4])

    def has_snapshot_end(self, conn: Connection, queue_id: int, snapshot_id: str) -> bool:
        """Whether the end marker of ``snapshot_id`` is in the receive queue (an index probe)."""
        end = literal(int(ReplicationType.LAST_FULL_SYNC_ENTRY), literal_execute=True)
        probe = (
            select(_R.c.seq)
            .where(_R.c.queue_id == queue_id, _R.c.snapshot_id == snapshot_id, _R.c.type == end)
            .limit(1)
        )
        return conn.execute(probe).first() is not None

    def snapshot_base(self, conn: Connection, queue_id: int, snapshot_id: str) -> int | None:
        """The base position the end marker of ``snapshot_id`` carries; None if not queued."""
        end = literal(int(ReplicationType.LAST_FULL_SYNC_ENTRY), literal_execute=True)
        row = conn.execute(
            select(_R.c.base_position)
            .where(_R.c.queue_id == queue_id, _R.c.snapshot_id == snapshot_id, _R.c.type == end)
            .limit(1)
        ).first()
        return None if row is None or row[0] is None else int(row[0])

    def has_entries(self, conn: Connection, queue_id: int) -> bool:
        """Whether the receive queue holds anything (a cheap indexed probe)."""
        probe = select(_R.c.seq).where(_R.c.queue_id == queue_id).limit(1)
        return conn.execute(probe).first() is not None


__all__ = ["SubscriberQueuesStore"]
