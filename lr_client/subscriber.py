"""The sink subscriber: delivers receive queues to a listener, exactly once.

One delivery is one database transaction: read the oldest undelivered entries
of a queue, call the listener with an ORM session bound to that transaction,
and record the queue's state (snapshot started or not, entries delivered, and
``delivered_seq`` raised past the entries) while checking that this
subscriber still holds the queue's lease and that no other delivery of the
queue committed since it read. The listener's writes and the state commit
together or not at all, so a crash anywhere loses nothing and applies nothing
twice (I3). Delivery deletes nothing: the store retires delivered entries in
bulk (:mod:`lr_client.store.recv.queues`).

Leases (see :mod:`lr_client.store.recv.queues`) let several subscribers of one
client run at once: each queue is delivered by one of them at a time, and one
that lost its lease cannot commit. A lease outlives a crashed holder by at
most ``lease_seconds``; a callback running longer than that may be rolled back
and redelivered, so choose ``lease_seconds`` well above the slowest batch.

A full sync is delivered only once it is complete at the sink (its end
marker received), so one superseded during its transfer never reaches the
listener; ``snapshot_delivery="streaming"`` delivers it as it arrives.

The cyclic garbage collector is paused while a delivery plans (:mod:`lr_client.collector`).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.engine import Engine

from lr_client.doorbell import Doorbell
from lr_client.errors import PartitionCountError
from lr_client.failure_policy import FailurePolicy
from lr_client.keys import Keyring
from lr_client.listener import RoutingQueueListener
from lr_client.listener_calls import PARTITION_INFO_KEY
from lr_client.parking import ParkingCalls
from lr_client.partition_workers import PartitionWorkers
from lr_client.partitioned import Conflict, LeaseLost, PartitionedDelivery
from lr_client.partitioners import Partitioner
from lr_client.queue_marks import QueueMarks
from lr_client.records import QueueInfo
from lr_client.store import (
    DeliveryStore,
    open_store,
)
from lr_client.store.schema.lifecycle import SchemaStatus
from lr_client.store.watches import Watch
from lr_client.subscriber_settings import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_SNAPSHOT_BATCH_SIZE,
    SnapshotDelivery,
    default_owner,
)

log = logging.getLogger("lr_client.subscriber")


class RoutingQueueSubscriber(PartitionWorkers):
    """Delivers one client's receive queues ``LRQ_Recv_<client>__*`` to a listener.

    ``batch_size`` bounds the entries per callback and ``batch_max_bytes``
    their payload bytes (a larger entry comes alone); ``snapshot_batch_size``
    the entries per ``process_full_sync`` call once a full sync has started
    (a snapshot is delivered in few, large transactions; the bytes bound is
    the same); ``max_batches`` the batches delivered per queue in one
    :meth:`poll_once` (so queues take turns). ``owner`` names this subscriber
    in lease rows (unique by default). A failed batch of a queue is retried
    after ``retry_initial`` seconds, doubling up to ``retry_max``, each delay
    shortened by up to ``retry_jitter`` of itself at random; other queues go
    on meanwhile; ``failure_policy`` blocks or parks after ``max_attempts``. ``keyring``
    decrypts payloads (:mod:`lr_client.sealed_messages`).

    ``snapshot_delivery`` (:class:`SnapshotDelivery`) says when a full sync
    reaches the listener: ``"complete"`` (the default) waits until the sink
    has all of it, ``"streaming"`` delivers its entries as they arrive.

    ``partitions = N`` (N > 1) delivers each receive queue by partition:
    keyed log entries go to partition ``partitioner(key, N)`` (``"hash"``, the
    default: BLAKE2b; ``"range"`` with ``partition_boundaries``; a
    ``"module:function"``; or a callable, see :mod:`lr_client.partitioners`)
    and :meth:`run` delivers them with ``workers`` threads (default N), each
    owning the partitions ``p`` with ``p % workers`` equal to its number. The
    entries of one key reach the listener in source order, each partition's
    progress commits with the listener's writes, and entries without a key
    (and full syncs, drop notices) are delivered after every entry before them
    and before every entry after them. The listener finds its partition in
    ``session.info["lr_partition"]`` (None for those). The count is stored
    with each queue: another count is refused with
    :class:`~lr_client.errors.PartitionCountError` until the queue is drained.

    Otherwise one instance serves one thread; run several instances (or
    processes) to deliver in parallel, the leases keep them apart.
    """

    def __init__(
        self,
        engine: Engine | DeliveryStore,
        client_name: str,
        listener: RoutingQueueListener,
        *,
        batch_size: int = 500,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        snapshot_batch_size: int = DEFAULT_SNAPSHOT_BATCH_SIZE,
        max_batches: int = 20,
        owner: str | None = None,
        lease_seconds: float = 30.0,
        poll_interval: float = 0.5,
        retry_initial: float = 0.5,
        retry_max: float = 60.0,
        retry_jitter: float = 0.5,
        snapshot_delivery: SnapshotDelivery | str = SnapshotDelivery.COMPLETE,
        partitions: int = 1,
        partitioner: str | Partitioner = "hash",
        partition_boundaries: list[bytes | str] | None = None,
        workers: int | None = None,
        wake_on_arrival: bool = True,
        keyring: Keyring | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> None:
        #: A store this subscriber opened from a URL: its connections are closed by close().
        self._owned = open_store(engine) if isinstance(engine, str) else None
        self.store: DeliveryStore
        if self._owned is not None:
            self.store = self._owned
        elif isinstance(engine, Engine):
            self.store = open_store(engine)
        else:
            self.store = engine
        try:
            super().__init__(
                self.store,
                client_name,
                listener,
                batch_size=batch_size,
                batch_max_bytes=batch_max_bytes,
                snapshot_batch_size=snapshot_batch_size,
                max_batches=max_batches,
                owner=owner,
                lease_seconds=lease_seconds,
                poll_interval=poll_interval,
                retry_initial=retry_initial,
                retry_max=retry_max,
                retry_jitter=retry_jitter,
                snapshot_delivery=snapshot_delivery,
                partitions=partitions,
                partitioner=partitioner,
                partition_boundaries=partition_boundaries,
                workers=workers,
                keyring=keyring,
                failure_policy=failure_policy,
            )
        except BaseException:
            if self._owned is not None:
                self._owned.close()
            raise
        self.listener = listener
        self._calls = self._planner(ParkingCalls, listener, self.store)
        self._delivery = self._steps(self.store, self._calls)
        self._partitioned = PartitionedDelivery(
            self.store,
            self._calls,
            self._leases,
            partitioner=self.partitioner,
            batch_size=batch_size,
            batch_max_bytes=batch_max_bytes,
        )
        #: Rung when a partition commits (workers waiting at a barrier look again), when
        #: entries arrive (``wake_on_arrival``) and at the stop.
        self._doorbell = Doorbell()
        self.wake_on_arrival = wake_on_arrival
        #: While :meth:`run` runs with ``wake_on_arrival`` on PostgreSQL: its listening watch.
        self.arrival_watch: Watch | None = None
        #: Queues whose partitions moved since their own mark was raised.
        self._marks = QueueMarks(self.store, self.owner)

    # -- public API ------------------------------------------------------------------
    def create_schema(self) -> SchemaStatus:
        """Create or upgrade the queue store's tables (what ``lr init-db`` does); idempotent.

        Safe when several processes run it at once. Returns the schema's status before.
        """
        return self.store.create_schema()

    def poll_once(self) -> int:
        """Deliver what is ready in every queue; return how many entries the listener got."""
        return self._poll()[0]

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set, then release this subscriber's leases.

        With ``partitions > 1`` the delivery runs in ``workers`` threads. Idle, it
        polls every ``poll_interval`` seconds and, with ``wake_on_arrival``, as soon
        as a receiver commits entries of its client (``store.watch_arrivals``:
        PostgreSQL's notification, SQLite's database file written).
        """
        if self.wake_on_arrival:
            self.arrival_watch = self.store.queues.watch_arrivals(
                self.client_name, self._doorbell.ring
            )
        try:
            if self.partitions > 1:
                self._run_workers(stop)
                return
            self._run_single(stop)
        finally:
            watch, self.arrival_watch = self.arrival_watch, None
            if watch is not None:
                watch.close()

    def _run_single(self, stop: threading.Event) -> None:
        done = threading.Event()
        relay = threading.Thread(
            target=self._ring_at_stop,
            args=(stop, done),
            name=f"lr-stop-relay-{self.client_name}",
            daemon=True,
        )
        relay.start()
        try:
            while not stop.is_set():
                turn = self._doorbell.turn()
                try:
                    again = self._poll()[1]
                except Exception as exc:  # the registry could not be read
                    self._report(exc)
                    again = False
                if not again:
                    self._idle(stop, turn)
        finally:
            done.set()
            self.release_leases()

    def close(self) -> None:
        """Release the leases; close the connections if this subscriber opened them from a URL.

        An engine or store given by the caller stays the caller's to close.
        """
        self.release_leases()
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> RoutingQueueSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- polling ----------------------------------------------------------------------
    def _poll(self) -> tuple[int, bool]:
        if self.partitions > 1:
            total, moved = 0, False
            while True:  # every partition in turn, until none moves (barriers included)
                n, progressed = self._poll_partitions(range(self.partitions))
                total += n
                moved = moved or progressed
                if not progressed:
                    self._marks.raise_due(0.0)
                    return total, moved
        queues = self.store.queues.list_queues(self.client_name)
        due = self._due(queues)
        if not due:
            return 0, False
        with self.store.read_statements() as conn:  # one probe a queue, no snapshot shared
            ready = [q for q in due if self._waiting(conn, q.queue_id)]
        delivered, again = 0, False
        for queue in ready:
            n, more = self._drain(queue)
            delivered += n
            again = again or more
        return delivered, again

    def _drain(self, queue: QueueInfo) -> tuple[int, bool]:
        """Deliver up to ``max_batches`` batches of ``queue``: (entries delivered, whether
        to poll again at once rather than wait). Again if it delivered and may hold
        more, or if entries stored meanwhile would not wake this subscriber (no
        listening :class:`~lr_client.store.watches.Watch`); a queue it drained waits for
        the wake-up."""
        qid = queue.queue_id
        delivered, progressed, drained = 0, False, False
        try:
            if not self._hold_lease(qid):
                return 0, False
            for i in range(self.max_batches):
                if self._probe_first(i, delivered) and not self._has_entries(qid):
                    drained = True  # a probe, not a delivery transaction that finds nothing
                    break
                n = self._deliver(queue, self._failures.get(qid, 0) + 1)
                if n is None:  # nothing ready (a full sync may wait for its end)
                    drained = True
                    break
                self._succeeded(qid)
                delivered += n
                progressed = True
        except LeaseLost:
            self._leases.lost(qid)
        except Conflict:
            log.debug("queue %s changed during delivery; retrying", queue.queue_name)
            self._leases.lost(qid)
            progressed = True
        except PartitionCountError:
            raise
        except Exception as exc:
            self._fail(qid, exc)
        return delivered, progressed and not (drained and self._announced())

    def _announced(self) -> bool:
        """Whether each batch stored from now on wakes this subscriber."""
        watch = self.arrival_watch
        return watch is not None and watch.listening

    def _has_entries(self, queue_id: int) -> bool:
        with self.store.read_statements() as conn:
            return self.store.heads.has_entries(conn, queue_id)

    # -- one delivery transaction -------------------------------------------------
    def _deliver(self, queue: QueueInfo, attempt: int) -> int | None:
        """Deliver the head of ``queue``: the number of messages, or None if none is ready."""
        with self.store.write() as conn:
            opened = self._delivery.open(conn, queue)
            redone = self._calls.redeliver(conn, queue)  # parked entries released meanwhile
            if opened is None:
                return redone or None
            if opened.callbacks:  # none for the left-overs of an ended snapshot
                self._calls.call(conn, queue, opened.plan, attempt, calls=opened.callbacks)
            expires = self._delivery.mark(conn, queue, opened)
        self._leases.renewed(queue.queue_id, expires)
        if self._applied(queue, opened.plan):  # the stages' latency is due to be written
            self._flush_stages()
        return len(opened.plan.messages) + redone


__all__ = [
    "DEFAULT_BATCH_MAX_BYTES",
    "DEFAULT_SNAPSHOT_BATCH_SIZE",
    "PARTITION_INFO_KEY",
    "RoutingQueueSubscriber",
    "SnapshotDelivery",
    "default_owner",
]
