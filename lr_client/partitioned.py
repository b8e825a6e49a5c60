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
from contextlib import AbstractContextManager, nullcontext

from sqlalchemy.engine import Connection

from lr_client.collector import collector_paused
from lr_client.delivery import Plan, PlanKind, messages, plan_delivery
from lr_client.listener_calls import ListenerCalls
from lr_client.partition_window import Window
from lr_client.partitioners import Partitioner, partition_of
from lr_client.queue_leases import QueueLeases
from lr_client.records import HeadEntry, QueueInfo, ReplicationType
from lr_client.store import SubscriberQueues

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


class PartitionedDelivery:
    """The two transactions of delivery by partition, for one subscriber: its store, its
    listener (``calls``) and its leases (``leases``: their owner and partition count)."""

    def __init__(
        self,
        store: SubscriberQueues,
        calls: ListenerCalls,
        leases: QueueLeases,
        *,
        partitioner: Partitioner,
        batch_size: int,
        batch_max_bytes: int,
    ) -> None:
        self.store, self.calls, self.leases = store, calls, leases
        self.owner, self.partitions = leases.owner, leases.partitions
        self.partitioner = partitioner
        self.batch_size, self.batch_max_bytes = batch_size, batch_max_bytes
        #: Per thread: whether its last partition delivery stopped below a barrier.
        self.local = threading.local()
        #: {(queue id, partition): its delivered_seq} as last committed or read here.
        #: Only a hint: each delivery's compare-and-set checks it (a stale one is a
        #: Conflict, and is read again), so a batch costs no read of the marks.
        self.marks: dict[tuple[int, int], int] = {}
        #: {queue id: its window}: the keyed entries read once for every partition.
        self.windows: dict[int, Window] = {}
        self.making = threading.Lock()
        #: SQLite has one writer: this subscriber's workers wait for it here, each
        #: woken as the one before commits (SQLite's busy handler sleeps and polls).
        self.writer: AbstractContextManager[object] = (
            threading.Lock() if store.single_writer else nullcontext()
        )

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
            marks = store.load_partitions(conn, queue_id)
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
                return store.scan_entries(conn, queue_id, after, limit, inline)

        def partition(key: bytes) -> int:
            return partition_of(self.partitioner, key, count)

        return Window(marks, read, partition, limit, cap=WINDOW_BATCHES * self.batch_size)

    def deliver_partition(self, queue: QueueInfo, partition: int, attempt: int) -> int | None:
        """Deliver the next keyed entries of ``partition``: how many, 0 if it only
        passed other partitions' entries, None if it stands at a barrier or the end."""
        store, qid = self.store, queue.queue_id
        window = self._window(qid)
        previous = self.marks.get((qid, partition))
        if previous is None:
            raise Conflict  # the window was made without it: made again
        self.local.at_barrier = False
        took = window.take(partition, previous, self.batch_size)
        if took is None:
            return None
        self.local.at_barrier = took.at_barrier
        upto = took.upto
        missing = [e.seq for e in took.entries if not e.payload]
        payloads: dict[int, bytes] = {}
        if missing:  # read apart from the delivery: its transaction takes no lock before
            with store.read() as conn:  # the listener's first statement (SQLite)
                payloads = store.read_payloads(conn, qid, missing)
        kept: list[HeadEntry] = []
        size = 0
        for e in took.entries:
            payload = payloads.get(e.seq, e.payload)
            if kept and size + len(payload) > self.batch_max_bytes:
                upto = e.seq - 1
                self.local.at_barrier = False
                break
            size += len(payload)
            kept.append(e._replace(payload=payload))
        if upto <= previous:
            return None
        seqs = [e.seq for e in kept]
        # The listener's transaction takes the write lock (SQLite) at its first statement,
        # or at the compare-and-set: a listener that waits without writing holds none.
        with store.late_write(self.writer) as conn:
            if kept:
                plan = Plan(PlanKind.LOG, seqs, messages(queue, kept), "", False, False, False)
                self.calls.call(conn, queue, plan, attempt, partition=partition)
            if not store.save_partition(
                conn,
                qid,
                self.owner,
                partition,
                previous_seq=previous,
                delivered_seq=upto,
                delivered_seqs=seqs,
            ):
                raise Conflict
        self.marks[(qid, partition)] = upto
        return len(kept)

    def _level(self, conn: Connection, queue_id: int, marks: dict[int, int]) -> None:
        """Raise every partition to the highest when no entry is left above the lowest.

        A partition stands below entries of other partitions until it scans past
        them; once those are gone (SQLite deletes what it delivers), it would stand
        there, apart, and another partition count would be refused though the
        queue is drained. Nothing is above it, so nothing is passed undelivered.
        """
        store, owner = self.store, self.owner
        if store.peek_head(conn, queue_id, after=min(marks.values())) is not None:
            return
        high = max(marks.values())
        for p, seq in marks.items():
            if seq < high and not store.save_partition(
                conn, queue_id, owner, p, previous_seq=seq, delivered_seq=high, delivered_seqs=[]
            ):
                raise Conflict
        self.forget(queue_id)  # read again after this commit

    def stopped_at_barrier(self) -> bool:
        """Whether this thread's last partition delivery stopped just below a barrier."""
        return bool(getattr(self.local, "at_barrier", False))

    def deliver_barrier(self, queue: QueueInfo, attempt: int) -> int | None:
        """Deliver the entries every partition waits for, once all stand below them:
        how many messages, or None if they are not all there yet (or none waits)."""
        store, qid, owner = self.store, queue.queue_id, self.owner
        count = self.partitions
        with self.writer, store.write() as conn:
            # Held: another worker's barrier run commits the state and the marks
            # together, so both are read after it, never the marks alone (a full
            # sync would start twice).
            state = store.load_state(conn, qid, lock=True)
            if state.lease_owner != owner:
                raise LeaseLost
            marks = store.load_partitions(conn, qid)
            if len(marks) != count:
                raise Conflict
            low = min(marks.values())
            if any(seq != low for seq in marks.values()):
                self._level(conn, qid, marks)
                return None
            head = store.peek_head(conn, qid, after=low)
            if head is None and state.delivered_seq < low:
                # Every partition passed everything: the queue's own mark catches up
                # (a worker's commit may have read its peers' marks before theirs).
                store.save_barrier(
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
                entries = store.read_head(
                    conn, qid, self.batch_size, self.batch_max_bytes, after=low
                )
                run = []
                for e in entries:
                    if is_keyed(e):
                        break
                    run.append(e)
                if not run or self.calls.waits_for_end(conn, qid, state, run):
                    return None
                plan = plan_delivery(queue, state, run)
            if plan.kind is not PlanKind.STALE:
                self.calls.call(conn, queue, plan, attempt, partition=None)
            expires = self.leases.expiry()
            if not store.save_barrier(
                conn,
                qid,
                owner,
                count=count,
                previous_seq=low,
                delivered_seq=plan.seqs[-1],
                snapshot_id=plan.snapshot_id,
                in_snapshot=plan.in_snapshot,
                delivered=state.delivered
                + (0 if plan.kind is PlanKind.DROP else len(plan.messages)),
                lease_expires=expires,
            ):
                raise Conflict
        for p in range(count):
            self.marks[(qid, p)] = plan.seqs[-1]
        self.windows.pop(qid, None)  # made again from the marks, all above the barrier
        self.leases.renewed(qid, expires)
        return len(plan.messages)


__all__ = ["Conflict", "LeaseLost", "PartitionedDelivery", "is_keyed"]
