"""Delivery by partition for the sync subscriber: ``workers`` threads (a part of
:class:`~lr_client.subscriber.RoutingQueueSubscriber`).

Each worker owns the partitions ``p`` with ``p % workers`` equal to its
number and takes its turn over every queue's partitions on a connection of
its own (:class:`~lr_client.partitioned.PartitionedDelivery` holds the
steps); a worker that finds nothing waits on the doorbell, rung when a
partition commits, when entries arrive and at the stop. What the single
loop shares with the workers is here too: the idle wait, leases held and
released, failures reported to the listener.
"""

from __future__ import annotations

import logging
import threading
import time

from lr_client.doorbell import Doorbell
from lr_client.errors import PartitionCountError
from lr_client.listener import RoutingQueueListener
from lr_client.partitioned import Conflict, LeaseLost, PartitionedDelivery
from lr_client.queue_marks import QueueMarks
from lr_client.store import DeliveryStore
from lr_client.subscriber_settings import SubscriberCore

log = logging.getLogger("lr_client.subscriber")

#: Seconds between raises of a queue's own ``delivered_seq`` to the minimum over its
#: partitions while they deliver (it lags by at most this; never runs ahead).
QUEUE_MARK_INTERVAL = 0.5
#: Seconds between the stop relay's looks at whether the delivery it serves has ended.
RELAY_CHECK = 30.0


class PartitionWorkers(SubscriberCore):
    """The sync subscriber's delivery by partition and its waits (set up by
    :class:`~lr_client.subscriber.RoutingQueueSubscriber`)."""

    store: DeliveryStore
    listener: RoutingQueueListener
    _doorbell: Doorbell
    _marks: QueueMarks
    _partitioned: PartitionedDelivery

    def _idle(self, stop: threading.Event, turn: int) -> None:
        """Wait for the poll interval or a ring after ``turn``, whichever first: the stop
        rings (:meth:`_ring_at_stop`), so the wait is one, not slices looking at it."""
        if not stop.is_set():  # set after ``turn`` was read: its ring is in ``turn``
            self._doorbell.wait(turn, self._idle_wait())

    def _ring_at_stop(self, stop: threading.Event, done: threading.Event) -> None:
        """Ring once ``stop`` is set (its setter may be the application's, which cannot
        ring); give up when ``done`` is set first (the delivery ended on an error)."""
        while not stop.wait(RELAY_CHECK):
            if done.is_set():
                return
        self._doorbell.ring()

    def release_leases(self) -> None:
        """Let other subscribers take this one's queues at once."""
        self._leases.until.clear()
        try:
            with self.store.write() as conn:
                self.store.queues.release_leases(conn, self.owner)
        except Exception as exc:  # they expire anyway
            log.warning("could not release leases of %s: %s", self.owner, exc)

    def _run_workers(self, stop: threading.Event) -> None:
        threads = [
            threading.Thread(
                target=self._work,
                args=(range(w, self.partitions, self.workers), stop),
                name=f"lr-partition-worker-{w}",
                daemon=True,
            )
            for w in range(self.workers)
        ]
        try:
            for thread in threads:
                thread.start()
            stop.wait()
            self._doorbell.ring()
            for thread in threads:
                thread.join()
            try:
                self._marks.raise_due(0.0)
            except Exception as exc:  # raised by the next subscriber
                self._report(exc)
        finally:
            self.release_leases()

    def _work(self, parts: range, stop: threading.Event) -> None:
        with self.store.pinned():  # one connection per worker, not a checkout per batch
            self._work_pinned(parts, stop)

    def _work_pinned(self, parts: range, stop: threading.Event) -> None:
        while not stop.is_set():
            turn = self._doorbell.turn()
            try:
                progressed = self._poll_partitions(parts)[1]
                self._marks.raise_due(
                    QUEUE_MARK_INTERVAL
                    if progressed
                    else min(self.poll_interval, QUEUE_MARK_INTERVAL)
                )
            except Exception as exc:  # the registry could not be read, or a count refused
                self._report(exc)
                progressed = False
            if not progressed:
                self._idle(stop, turn)

    def _poll_partitions(self, parts: range) -> tuple[int, bool]:
        """One turn of ``parts`` over every queue: (messages delivered, any progress)."""
        delivered, progressed = 0, False
        for queue in self.store.queues.list_queues(self.client_name):
            qid = queue.queue_id
            for p in parts:
                key = (qid, p)
                if self._retry_at.get(key, 0.0) > time.monotonic():
                    continue
                try:
                    if not self._hold_lease(qid):
                        break
                    for _ in range(self.max_batches):
                        attempt = self._failures.get(key, 0) + 1
                        n = self._partitioned.deliver_partition(queue, p, attempt)
                        barrier = n is None or self._partitioned.stopped_at_barrier()
                        if n is None:
                            n = self._partitioned.deliver_barrier(queue, attempt)
                            if n is None:
                                break
                        self._succeeded(key)
                        delivered += n
                        progressed = True
                        self._marks.moved(qid)
                        if barrier:  # the workers waiting there look again
                            self._doorbell.ring()
                except PartitionCountError:
                    raise
                except LeaseLost:
                    self._leases.lost(qid)
                    self._partitioned.forget(qid)
                    break
                except Conflict:  # retried at its next turn
                    log.debug("partition %d of %s changed; retrying", p, queue.queue_name)
                    self._partitioned.forget(qid)
                except Exception as exc:
                    self._partitioned.forget(qid)
                    self._fail(key, exc)
        return delivered, progressed

    def _hold_lease(self, queue_id: int) -> bool:
        return self._leases.hold(queue_id)

    def _fail(self, queue_id: object, error: BaseException) -> None:
        self._report(error := self._failed(queue_id, error))
        self._note_failure(queue_id, error)

    def _report(self, error: BaseException) -> None:
        try:
            self.listener.on_error(error)
        except Exception:
            log.exception("listener.on_error raised")


__all__ = ["QUEUE_MARK_INTERVAL", "RELAY_CHECK", "PartitionWorkers"]
