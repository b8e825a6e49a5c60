"""The :class:`~lr_client.store.contract.SubscriberQueues` role: a sink's subscriber.

Receive queues, the per-queue subscriber state and leases (``lrq_subscriber_state``);
the methods that take a ``Connection`` run in the caller's (delivering) transaction.

A lease row says which subscriber (``lease_owner``) may deliver a receive
queue until ``lease_expires`` (wall-clock seconds). It is taken with one
conditional ``UPDATE`` (free, expired or already ours), so two subscribers can
never both succeed, on SQLite or PostgreSQL. The delivering transaction then
*fences* itself: it writes the queue's new state with
``WHERE lease_owner = :me`` and rolls back when that matches no row, so a
subscriber whose lease was taken over can never commit a delivery.

Delivery deletes nothing it delivers. The state row's ``delivered_seq`` says
how far the queue was delivered: every entry with ``seq <= delivered_seq``
was delivered, or passed (the left-overs of an ended snapshot, never
delivered twice), and every read of a queue sees only the entries above it.
:meth:`~SubscriberQueuesStore.save_state` raises it in the delivering
transaction, only from the value the delivery read (``previous_seq``) and
only while the caller holds the lease: a delivery that raced another one,
or outlived its lease, matches no row and rolls back with the listener's
writes. So a crash anywhere applies each entry once, as with the delete it
replaces. Entries of a queue are appended in ``seq`` order under the queue's
lock (:meth:`_lock_stream`), so no entry below a delivered ``seq`` commits
later.

What happens to delivered rows depends on the backend. PostgreSQL keeps them
until their partition is truncated by :meth:`rotate_receive_queues`
(:mod:`lr_client.store.recv.rotation`): a DELETE would leave a dead tuple per
entry until vacuum, and a long transaction can hold vacuum back without
bound. SQLite has no dead tuples (the pages of deleted rows are reused), so
it deletes them in the delivering transaction, one range per delivery, and
its rotation does nothing.

Whether a queue is relayed (:func:`~lr_client.store.cascade.relays.is_relayed`: its
entries stay past delivery) is read once per lease, when
:meth:`~SubscriberQueuesStore.acquire_lease` takes or renews it, not at every
delivery. A configuration that changes it takes the leases of the queues it
changes (:func:`~lr_client.store.cascade.relays.revoke_leases`, in the same
transaction): a delivery holding an older answer fails its fence and rolls
back, and the next one takes the lease again and reads the new answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, or_, select, update
from sqlalchemy.engine import Connection

from lr_client.records import (
    QueueInfo,
    RecvEntry,
    ReplicationType,
    SubscriberState,
)
from lr_client.store.cascade.relays import is_relayed, relayed_as_leased
from lr_client.store.role import Role
from lr_client.store.schema import tables as s
from lr_client.store.watches import Watch

_T = s.subscriber_state
_R = s.recv_entries


def delivered_seq(queue_id: Any) -> ColumnElement[Any]:
    """The queue's ``delivered_seq`` (0 without a state row), as a scalar subquery."""
    sub = (
        select(_T.c.delivered_seq)
        .where(_T.c.queue_id == queue_id)
        .correlate_except(_T)
        .scalar_subquery()
    )
    return func.coalesce(sub, 0)


def undelivered(queue_id: Any) -> ColumnElement[bool]:
    """The receive queue's entries not delivered yet: an index range of ``(queue_id, seq)``."""
    return and_(_R.c.queue_id == queue_id, _R.c.seq > delivered_seq(queue_id))


def depth(queue_id: Any) -> Any:
    """The number of undelivered entries of a queue, as a scalar subquery."""
    return select(func.count()).where(undelivered(queue_id)).scalar_subquery()


def above(queue_id: int, after: int | None) -> ColumnElement[bool]:
    if after is None:
        return undelivered(queue_id)
    return and_(_R.c.queue_id == queue_id, _R.c.seq > after)


def optional_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def forget_delivered(
    conn: Connection, queue_id: int, previous_seq: int, delivered_seq: int, relayed: bool
) -> None:
    """Delete the entries a delivery passed, one range (SQLite: a store that keeps none
    delivered); a queue this node relays (``relayed``) keeps them until its relay trim
    (:mod:`.cascade`)."""
    if delivered_seq > previous_seq and not relayed:
        conn.execute(
            delete(_R).where(
                _R.c.queue_id == queue_id, _R.c.seq > previous_seq, _R.c.seq <= delivered_seq
            )
        )


def check_forward(previous_seq: int, delivered_seq: int) -> None:
    """Refuse a delivery that would move a ``delivered_seq`` back (``ValueError``)."""
    if delivered_seq < previous_seq:
        raise ValueError("delivered_seq cannot go back")


def save_fenced(
    conn: Connection,
    queue_id: int,
    owner: str,
    fence: ColumnElement[bool],
    *,
    relayed: dict[int, bool] | None,
    snapshot_id: str,
    in_snapshot: bool,
    delivered: int,
    lease_expires: float,
    previous_seq: int,
    delivered_seq: int,
) -> bool:
    """The fenced save of a delivery, in its transaction: the queue's new state, up to
    ``delivered_seq``, written only while ``owner`` holds the lease (renewing it) and
    ``fence`` holds; False if no row matched (the caller must roll back).

    Then the entries it passed are deleted (SQLite), unless the queue is relayed:
    ``relayed`` is the store's answers read when it took its leases
    (:func:`~lr_client.store.cascade.relays.relayed_as_leased`), None for a store that
    keeps delivered entries until rotation (PostgreSQL).
    """
    check_forward(previous_seq, delivered_seq)
    saved = conn.execute(
        update(_T)
        .where(_T.c.queue_id == queue_id, _T.c.lease_owner == owner, fence)
        .values(
            snapshot_id=snapshot_id,
            in_snapshot=in_snapshot,
            delivered=delivered,
            lease_expires=lease_expires,
            delivered_seq=delivered_seq,
        )
    )
    if saved.rowcount != 1:
        return False
    if relayed is not None:
        keep = relayed_as_leased(relayed, conn, queue_id)
        forget_delivered(conn, queue_id, previous_seq, delivered_seq, keep)
    return True


class SubscriberQueuesStore(Role):
    """Receive queues as a subscriber delivers them, under leases."""

    def watch_arrivals(self, client_name: str, wake: Callable[[], None]) -> Watch | None:
        return self.core.watch_arrivals(client_name, wake)

    def list_queues(self, client_name: str | None = None) -> list[QueueInfo]:
        query = select(s.queue_registry).order_by(s.queue_registry.c.queue_id)
        if client_name is not None:
            query = query.where(s.queue_registry.c.client_name == client_name)
        with self.core.read_statements() as conn:  # one statement: no transaction needed
            rows = conn.execute(query).all()
        return [QueueInfo(r.queue_id, r.queue_name, r.client_name, r.source_id) for r in rows]

    def read_queue(self, conn: Connection, queue_id: int, limit: int) -> list[RecvEntry]:
        t = s.recv_entries
        reg = s.queue_registry
        rows = conn.execute(
            select(t, reg.c.source_id, reg.c.client_name)
            .join(reg, reg.c.queue_id == t.c.queue_id)
            .where(undelivered(queue_id))
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
                key=optional_bytes(r.partition_key),
                headers=optional_bytes(r.headers),
            )
            for r in rows
        ]

    def queue_depth(self, queue_id: int) -> int:
        with self.core.read() as conn:
            return int(conn.execute(select(depth(queue_id))).scalar_one())

    def rotate_receive_queues(self, period: float = 30.0) -> int | None:
        """Retire delivered entries in bulk (PostgreSQL); the new current slot, or None.

        SQLite deletes them as they are delivered: nothing to do.
        """
        return self.core.rotate_receive_queues(period)

    # -- subscriber state and leases (in the caller's transaction) -------------------------
    def load_state(self, conn: Connection, queue_id: int, *, lock: bool = False) -> SubscriberState:
        """The queue's state (defaults if it has no row yet); ``lock``: its row held."""
        query = select(_T).where(_T.c.queue_id == queue_id)
        row = conn.execute(query.with_for_update() if lock else query).first()
        if row is None:
            return SubscriberState(queue_id)
        return SubscriberState(
            queue_id=row.queue_id,
            snapshot_id=row.snapshot_id,
            in_snapshot=bool(row.in_snapshot),
            delivered=int(row.delivered),
            lease_owner=row.lease_owner,
            lease_expires=float(row.lease_expires),
            delivered_seq=int(row.delivered_seq),
            partitions=int(row.partitions),
        )

    def _ensure_state_row(self, conn: Connection, queue_id: int) -> None:
        values = {
            "queue_id": queue_id,
            "snapshot_id": "",
            "in_snapshot": False,
            "delivered": 0,
            "lease_owner": "",
            "lease_expires": 0.0,
            "delivered_seq": 0,
        }
        conn.execute(self.core.dialect_insert(_T).values(**values).on_conflict_do_nothing())

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
        if conn.execute(stmt).rowcount != 1:
            if conn.execute(select(_T.c.queue_id).where(_T.c.queue_id == queue_id)).first():
                return None
            self._ensure_state_row(conn, queue_id)
            if conn.execute(stmt).rowcount != 1:
                return None
        if not self.core.keeps_delivered:  # read once per lease (module docstring)
            self.core.relayed_queues[queue_id] = is_relayed(conn, queue_id)
        return expires

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
        previous_seq: int,
        delivered_seq: int,
    ) -> bool:
        """Write the queue's new state, passing its entries up to ``delivered_seq``.

        Only if ``owner`` still holds the lease (renewing it) and the queue's
        ``delivered_seq`` is still ``previous_seq``, the value the delivery
        read. Returns False otherwise (the lease was lost, or another delivery
        committed first): the caller must roll back.
        """
        return save_fenced(
            conn,
            queue_id,
            owner,
            _T.c.delivered_seq == previous_seq,
            relayed=None if self.core.keeps_delivered else self.core.relayed_queues,
            snapshot_id=snapshot_id,
            in_snapshot=in_snapshot,
            delivered=delivered,
            lease_expires=lease_expires,
            previous_seq=previous_seq,
            delivered_seq=delivered_seq,
        )

    def release_leases(
        self, conn: Connection, owner: str, queue_ids: list[int] | None = None
    ) -> int:
        """Give up ``owner``'s leases (all of them, or those of ``queue_ids``)."""
        stmt = update(_T).where(_T.c.lease_owner == owner)
        if queue_ids is not None:
            stmt = stmt.where(_T.c.queue_id.in_(queue_ids))
        return int(conn.execute(stmt.values(lease_owner="", lease_expires=0.0)).rowcount or 0)


__all__ = [
    "SubscriberQueuesStore",
    "above",
    "check_forward",
    "delivered_seq",
    "depth",
    "forget_delivered",
    "optional_bytes",
    "save_fenced",
    "undelivered",
]
