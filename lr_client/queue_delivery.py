"""One delivery transaction of a receive queue, around the listener's call.

What the subscribers share, sync (:mod:`lr_client.subscriber`) and async
(:mod:`lr_client.aio.subscriber`): both run these steps on the delivering
transaction's connection and differ only in how they call the listener
between them. :meth:`QueueDelivery.open` reads the queue's state (the lease
checked), the head of the queue and plans the batch with its callbacks;
:meth:`QueueDelivery.mark` records the queue's new state with a
compare-and-set from the ``delivered_seq`` read, under the lease. The
listener's writes and the mark commit together or not at all (I3).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from lr_client.collector import collector_paused
from lr_client.delivery import Plan, PlanKind, plan_delivery
from lr_client.listener_calls import Callback, CallPlanner
from lr_client.partitioned import Conflict, LeaseLost
from lr_client.queue_leases import QueueLeases
from lr_client.records import QueueInfo, ReplicationType, SubscriberState
from lr_client.store import DeliveryStore

log = logging.getLogger("lr_client.subscriber")

_SNAPSHOT_ENTRY = ReplicationType.SNAPSHOT_SYNC


@dataclass(frozen=True, slots=True)
class Opened:
    """A delivery between its read and its mark: the state read, the plan, its calls."""

    state: SubscriberState
    plan: Plan
    callbacks: list[Callback]


class QueueDelivery:
    """The read and the mark of one subscriber's deliveries (``calls``: its listener's
    planner; ``leases``: its owner's leases)."""

    def __init__(
        self,
        store: DeliveryStore,
        calls: CallPlanner,
        leases: QueueLeases,
        *,
        batch_size: int,
        snapshot_batch_size: int,
        batch_max_bytes: int,
    ) -> None:
        self.store, self.calls, self.leases = store, calls, leases
        self.owner = leases.owner
        self.batch_size = batch_size
        self.snapshot_batch_size = snapshot_batch_size
        self.batch_max_bytes = batch_max_bytes
        #: Queues whose head snapshot lacks its end.
        self.awaiting: set[int] = set()

    def open(self, conn: Connection, queue: QueueInfo) -> Opened | None:
        """Read the head of ``queue`` in ``conn``'s transaction and plan it; None if
        nothing is ready. :class:`LeaseLost` if this owner does not hold the queue."""
        store, qid = self.store, queue.queue_id
        state = store.queues.load_state(conn, qid)
        if state.lease_owner != self.owner:
            raise LeaseLost
        if qid in self.awaiting:
            # Waiting for a snapshot's end: look at the head alone, not a whole batch.
            if self.calls.awaits_end(conn, qid, state, store.heads.peek_head(conn, qid)):
                return None
            self.awaiting.discard(qid)
        with collector_paused():  # a batch of new objects: scanned once, after
            plan = self.read_plan(conn, queue, state)
        if plan is None:
            return None
        if plan.kind is PlanKind.STALE:
            log.warning(
                "dropping %d entries of ended snapshot %s from %s",
                len(plan.seqs),
                plan.snapshot_id,
                queue.queue_name,
            )
        return Opened(state, plan, self.calls.callbacks(conn, queue, plan))

    def read_plan(self, conn: Connection, queue: QueueInfo, state: SubscriberState) -> Plan | None:
        """Read the head of ``queue`` and plan its delivery; None if nothing is ready."""
        qid = queue.queue_id
        # Inside a full sync, its entries come in batches of snapshot_batch_size;
        # a log entry read past its end waits for the next delivery (the plan
        # takes one run), which reads batch_size again.
        limit = self.snapshot_batch_size if state.in_snapshot else self.batch_size
        entries = self.store.heads.read_head(conn, qid, limit, self.batch_max_bytes)
        if not entries:
            return None
        if len(entries) > self.batch_size and entries[0].type is not _SNAPSHOT_ENTRY:
            entries = entries[: self.batch_size]  # log entries: batch_size per callback
        if self.calls.waits_for_end(conn, qid, state, entries):
            self.awaiting.add(qid)
            return None
        return plan_delivery(queue, state, entries)

    def mark(self, conn: Connection, queue: QueueInfo, opened: Opened) -> float:
        """Record the delivery of ``opened`` in ``conn``'s transaction: the lease's new
        expiry. :class:`Conflict` if the lease was lost or another delivery committed
        since the read (the caller rolls back)."""
        state, plan = opened.state, opened.plan
        expires = self.leases.expiry()
        saved = self.store.queues.save_state(
            conn,
            queue.queue_id,
            self.owner,
            snapshot_id=plan.snapshot_id,
            in_snapshot=plan.in_snapshot,
            delivered=state.delivered + (0 if plan.kind is PlanKind.DROP else len(plan.messages)),
            lease_expires=expires,
            # The plan takes a prefix of the entries read: they are passed,
            # skipped (STALE) or not, exactly when this transaction commits.
            previous_seq=state.delivered_seq,
            delivered_seq=plan.seqs[-1],
        )
        if not saved:
            raise Conflict
        return expires


__all__ = ["Opened", "QueueDelivery"]
