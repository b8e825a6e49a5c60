"""Delivery of one receive queue by partition: the transactions of its workers.

A subscriber with ``partitions = N`` maps each keyed log entry to a partition
(its :class:`~lr_client.partitioners.Partitioner`) and delivers each partition
on its own, in ``seq`` order, so the entries of one key reach the listener in
source order while different keys are applied in parallel. The entries are
read once for every partition (:mod:`lr_client.partition_window`); each
delivery is then one transaction: the listener's writes and the partition's
new ``delivered_seq`` (a compare-and-set from the mark it started from)
commit together or not at all, so every entry is applied once whatever
crashes. On SQLite that transaction takes the write lock at its first
statement (:meth:`~lr_client.store.contract.Transactions.late_write`), so
listeners that wait before touching the database overlap their waits.

Every other entry is a barrier: an entry without a key, the entries of a full
sync, a drop notice. A partition stops just below it; once every partition
stands there, one transaction delivers the barrier run (planned as the
single-threaded subscriber plans it, :func:`~lr_client.delivery.plan_delivery`)
and passes every partition above it. So a full sync still comes first and
whole, and an unkeyed entry is delivered after every entry before it and
before every entry after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from lr_client.collector import collector_paused
from lr_client.delivery import Plan, PlanKind, messages, plan_delivery
from lr_client.listener_calls import Callback, CallPlanner, ListenerCalls
from lr_client.partition_window import Window
from lr_client.partitioners import Partitioner, partition_of
from lr_client.queue_leases import QueueLeases
from lr_client.records import HeadEntry, QueueInfo, ReplicationType, SubscriberState
from lr_client.store import DeliveryStore

_LOG = ReplicationType.LOG_ENTRY_SYNC
#: A partition's window holds at most this many batches of it (see
#: :mod:`lr_client.partition_window`): one that falls further behind reads its own.
WINDOW_BATCHES = 8


class Conflict(Exception):
    """The partition or queue changed under the delivery: roll back and retry."""


class LeaseLost(Exception):
    """Another subscriber holds the queue now."""


def is_keyed(entry: HeadEntry) -> bool:
    """Whether an entry is delivered by its partition (a log entry with a key)."""
    return entry.type is _LOG and entry.key is not None


#: Makes a lock of the steps' shared state: ``threading.Lock`` for worker threads; a
#: ``nullcontext`` where the caller serialises the steps itself (the async subscriber's
#: tasks, with an ``asyncio.Lock``: a thread's lock would block the event loop).
LockFactory = Callable[[], AbstractContextManager[object]]


@dataclass(frozen=True, slots=True)
class Taken:
    """A partition's next delivery, read before its transaction: its keyed entries
    (payloads read), the mark it starts from and the one it rises to."""

    entries: list[HeadEntry]
    previous: int
    upto: int
    #: ``upto`` stands just below an entry every partition waits for.
    at_barrier: bool

    def plan(self, queue: QueueInfo) -> Plan | None:
        """The listener's batch (None if the delivery only passes others' entries)."""
        if not self.entries:
            return None
        seqs = [e.seq for e in self.entries]
        return Plan(PlanKind.LOG, seqs, messages(queue, self.entries), "", False, False, False)


@dataclass(frozen=True, slots=True)
class Barrier:
    """A barrier run read and planned in its transaction: the queue's state, the mark
    every partition stands at, the plan and the listener's calls."""

    state: SubscriberState
    low: int
    plan: Plan
    callbacks: list[Callback]


class PartitionSteps:
    """The steps of delivery by partition, for one subscriber: its store, its listener's
    planner (``calls``) and its leases (``leases``: their owner and partition count).

    What the sync subscriber (:class:`PartitionedDelivery`) and the async one share:
    each delivery reads (:meth:`take`, outside any transaction, or :meth:`open_barrier`
    in it), the caller runs the listener in the transaction, then :meth:`save` or
    :meth:`mark_barrier` checks and records it and :meth:`saved` or
    :meth:`barrier_saved` notes what committed.
    """

    def __init__(
        self,
        store: DeliveryStore,
        calls: CallPlanner,
        leases: QueueLeases,
        *,
        partitioner: Partitioner,
        batch_size: int,
        batch_max_bytes: int,
        lock: LockFactory = threading.Lock,
    ) -> None:
        self.store, self.calls, self.leases = store, calls, leases
        self.owner, self.partitions = leases.owner, leases.partitions
        self.partitioner = partitioner
        self.batch_size, self.batch_max_bytes = batch_size, batch_max_bytes
        self.lock = lock
        #: {(queue id, partition): its delivered_seq} as last committed or read here.
        #: Only a hint: each delivery's compare-and-set checks it (a stale one is a
        #: Conflict, and is read again), so a batch costs no read of the marks.
        self.marks: dict[tuple[int, int], int] = {}
        #: {queue id: its window}: the keyed entries read once for every partition.
        self.windows: dict[int, Window] = {}
        self.making = lock()

    def forget(self, queue_id: int) -> None:
        """Drop what is known of a queue (after a conflict or an error): its marks
        and its window, read again at the next delivery."""
        for key in [k for k in self.marks if k[0] == queue_id]:
            self.marks.pop(key, None)
        self.windows.pop(queue_id, None)

    def _window(self, queue_id: int) -> Window:
        """The queue's read cache, made (by one worker) from its partitions' marks."""
        window = self.windows.get(queue_id)
        if window is not None:
            return window
        with self.making:
            window = self.windows.get(queue_id)
            if window is None:
                window = self._make_window(queue_id)
                self.windows[queue_id] = window
            return window

    def _make_window(self, queue_id: int) -> Window:
        store, count = self.store, self.partitions
        with store.read() as conn:
            marks = store.partitions.load_partitions(conn, queue_id)
        if sorted(marks) != list(range(count)):
            raise Conflict
        for p, seq in marks.items():  # a mark only rises: one committed since is newer
            marks[p] = max(seq, self.marks.get((queue_id, p), seq))
            self.marks[(queue_id, p)] = marks[p]
        # Small payloads come with the read (within batch_max_bytes / N in all): the
        # others are read for the entries taken only.
        limit, inline = self.batch_size * count, self.batch_max_bytes // count

        def read(after: int, limit: int) -> list[HeadEntry]:
            with store.read() as conn:
                return store.partitions.scan_entries(conn, queue_id, after, limit, inline)

        def partition(key: bytes) -> int:
            return partition_of(self.partitioner, key, count)

        cap = WINDOW_BATCHES * self.batch_size
        return Window(marks, read, partition, limit, cap=cap, lock=self.lock())

    def take(self, queue: QueueInfo, partition: int) -> Taken | None:
        """The next keyed entries of ``partition``, read (outside the delivery's
        transaction); None if it stands at a barrier or the end."""
        store, qid = self.store, queue.queue_id
        window = self._window(qid)
        previous = self.marks.get((qid, partition))
        if previous is None:
            raise Conflict  # the window was made without it: made again
        took = window.take(partition, previous, self.batch_size)
        if took is None:
            return None
        at_barrier = took.at_barrier
        upto = took.upto
        missing = [e.seq for e in took.entries if not e.payload]
        payloads: dict[int, bytes] = {}
        if missing:  # read apart from the delivery: its transaction takes no lock before
            with store.read() as conn:  # the listener's first statement (SQLite)
                payloads = store.partitions.read_payloads(conn, qid, missing)
        kept: list[HeadEntry] = []
        size = 0
        for e in took.entries:
            payload = payloads.get(e.seq, e.payload)
            if kept and size + len(payload) > self.batch_max_bytes:
                upto = e.seq - 1
                at_barrier = False
                break
            size += len(payload)
            kept.append(e._replace(payload=payload))
        if upto <= previous:
            return None
        return Taken(kept, previous, upto, at_barrier)

    def save(self, conn: Connection, queue: QueueInfo, partition: int, taken: Taken) -> None:
        """Record ``taken`` delivered in ``conn``'s transaction: a compare-and-set from
        its mark (:class:`Conflict` if another delivery committed since)."""
        if not self.store.partitions.save_partition(
            conn,
            queue.queue_id,
            self.owner,
            partition,
            previous_seq=taken.previous,
            delivered_seq=taken.upto,
            delivered_seqs=[e.seq for e in taken.entries],
        ):
            raise Conflict

    def saved(self, queue_id: int, partition: int, taken: Taken) -> None:
        """``taken``'s transaction committed."""
        self.marks[(queue_id, partition)] = taken.upto

    def _level(self, conn: Connection, queue_id: int, marks: dict[int, int]) -> None:
        """Raise every partition to the highest when no entry is left above the lowest.

        A partition stands below entries of other partitions until it scans past
        them; once those are gone (SQLite deletes what it delivers), it would stand
        there, apart, and another partition count would be refused though the
        queue is drained. Nothing is above it, so nothing is passed undelivered.
        """
        store, owner = self.store, self.owner
        if store.heads.peek_head(conn, queue_id, after=min(marks.values())) is not None:
            return
        high = max(marks.values())
        for p, seq in marks.items():
            if seq < high and not store.partitions.save_partition(
                conn, queue_id, owner, p, previous_seq=seq, delivered_seq=high, delivered_seqs=[]
            ):
                raise Conflict
        self.forget(queue_id)  # read again after this commit

    def open_barrier(self, conn: Connection, queue: QueueInfo) -> Barrier | None:
        """Read and plan, in ``conn``'s transaction, the entries every partition waits
        for, once all stand below them; None if they are not all there yet (or none
        waits). :class:`LeaseLost` if this owner does not hold the queue."""
        store, qid, owner = self.store, queue.queue_id, self.owner
        count = self.partitions
        # Held: another worker's barrier run commits the state and the marks
        # together, so both are read after it, never the marks alone (a full
        # sync would start twice).
        state = store.queues.load_state(conn, qid, lock=True)
        if state.lease_owner != owner:
            raise LeaseLost
        marks = store.partitions.load_partitions(conn, qid)
        if len(marks) != count:
            raise Conflict
        low = min(marks.values())
        if any(seq != low for seq in marks.values()):
            self._level(conn, qid, marks)
            return None
        head = store.heads.peek_head(conn, qid, after=low)
        if head is None and state.delivered_seq < low:
            # Every partition passed everything: the queue's own mark catches up
            # (a worker's commit may have read its peers' marks before theirs).
            store.partitions.save_barrier(
                conn,
                qid,
                owner,
                count=count,
                previous_seq=low,
                delivered_seq=low,
                snapshot_id=state.snapshot_id,
                in_snapshot=state.in_snapshot,
                delivered=state.delivered,
                lease_expires=state.lease_expires,
            )
        if head is None or is_keyed(head):
            return None
        with collector_paused():  # a batch of new objects: scanned once, after
            size, max_bytes = self.batch_size, self.batch_max_bytes
            entries = store.heads.read_head(conn, qid, size, max_bytes, after=low)
            run = []
            for e in entries:
                if is_keyed(e):
                    break
                run.append(e)
            if not run or self.calls.waits_for_end(conn, qid, state, run):
                return None
            plan = plan_delivery(queue, state, run)
        return Barrier(state, low, plan, self.calls.callbacks(conn, queue, plan))

    def mark_barrier(self, conn: Connection, queue: QueueInfo, barrier: Barrier) -> float:
        """Record ``barrier`` delivered in ``conn``'s transaction, every partition passed
        above it: the lease's new expiry. :class:`Conflict` if the queue changed."""
        state, plan = barrier.state, barrier.plan
        expires = self.leases.expiry()
        if not self.store.partitions.save_barrier(
            conn,
            queue.queue_id,
            self.owner,
            count=self.partitions,
            previous_seq=barrier.low,
            delivered_seq=plan.seqs[-1],
            snapshot_id=plan.snapshot_id,
            in_snapshot=plan.in_snapshot,
            delivered=state.delivered + (0 if plan.kind is PlanKind.DROP else len(plan.messages)),
            lease_expires=expires,
        ):
            raise Conflict
        return expires

    def barrier_saved(self, queue_id: int, barrier: Barrier, expires: float) -> None:
        """``barrier``'s transaction committed (its lease until ``expires``)."""
        for p in range(self.partitions):
            self.marks[(queue_id, p)] = barrier.plan.seqs[-1]
        self.windows.pop(queue_id, None)  # made again from the marks, all above the barrier
        self.leases.renewed(queue_id, expires)


class PartitionedDelivery(PartitionSteps):
    """The two transactions of delivery by partition, run by a sync subscriber's worker
    threads, the listener called between the steps."""

    calls: ListenerCalls

    def __init__(
        self,
        store: DeliveryStore,
        calls: ListenerCalls,
        leases: QueueLeases,
        *,
        partitioner: Partitioner,
        batch_size: int,
        batch_max_bytes: int,
    ) -> None:
        super().__init__(
            store,
            calls,
            leases,
            partitioner=partitioner,
            batch_size=batch_size,
            batch_max_bytes=batch_max_bytes,
        )
        #: Per thread: whether its last partition delivery stopped below a barrier.
        self.local = threading.local()
        #: SQLite has one writer: this subscriber's workers wait for it here, each
        #: woken as the one before commits (SQLite's busy handler sleeps and polls).
        self.writer: AbstractContextManager[object] = (
            threading.Lock() if store.single_writer else nullcontext()
        )

    def deliver_partition(self, queue: QueueInfo, partition: int, attempt: int) -> int | None:
        """Deliver the next keyed entries of ``partition``: how many, 0 if it only
        passed other partitions' entries, None if it stands at a barrier or the end."""
        self.local.at_barrier = False
        taken = self.take(queue, partition)
        if taken is None:
            return None
        self.local.at_barrier = taken.at_barrier
        # The listener's transaction takes the write lock (SQLite) at its first statement,
        # or at the compare-and-set: a listener that waits without writing holds none.
        with self.store.late_write(self.writer) as conn:
            plan = taken.plan(queue)
            if plan is not None:
                self.calls.call(conn, queue, plan, attempt, partition=partition)
            self.save(conn, queue, partition, taken)
        self.saved(queue.queue_id, partition, taken)
        return len(taken.entries)

    def stopped_at_barrier(self) -> bool:
        """Whether this thread's last partition delivery stopped just below a barrier."""
        return bool(getattr(self.local, "at_barrier", False))

    def deliver_barrier(self, queue: QueueInfo, attempt: int) -> int | None:
        """Deliver the entries every partition waits for, once all stand below them:
        how many messages, or None if they are not all there yet (or none waits)."""
        with self.writer, self.store.write() as conn:
            barrier = self.open_barrier(conn, queue)
            redone = self.calls.redeliver(conn, queue)  # parked entries released meanwhile
            if barrier is None:
                return redone or None
            if barrier.plan.kind is not PlanKind.STALE:
                calls = barrier.callbacks
                self.calls.call(conn, queue, barrier.plan, attempt, partition=None, calls=calls)
            expires = self.mark_barrier(conn, queue, barrier)
        self.barrier_saved(queue.queue_id, barrier, expires)
        return len(barrier.plan.messages) + redone


__all__ = [
    "Barrier",
    "Conflict",
    "LeaseLost",
    "LockFactory",
    "PartitionSteps",
    "PartitionedDelivery",
    "Taken",
    "is_keyed",
]
