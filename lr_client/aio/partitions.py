"""Delivery by partition for the async subscriber: ``workers`` tasks in the event loop.

The steps and their rules are the sync subscriber's
(:class:`~lr_client.partitioned.PartitionSteps`): a partition's keyed entries are
read once for all (its window) and taken outside the delivery's transaction;
the transaction then awaits the listener with an ``AsyncSession`` joined to it
and saves the partition's mark with a compare-and-set from the mark it read,
all on one connection of the application's ``AsyncEngine``, the store's SQL in
``await conn.run_sync(...)``. Entries without a key, full syncs and drop
notices are barriers, delivered once every partition stands below them.

Nothing here blocks the loop: the shared read cache and the lease renewals
are serialised with ``asyncio.Lock`` (the steps' own locks are no-ops here),
SQLite's one writer is taken in turn with another, and whether a task's last
delivery stopped below a barrier is the value its delivery returns, not a
thread's state. A task cancelled mid-delivery leaves its transaction to roll
back: nothing of that delivery is committed and its entries come again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only, greenlet_spawn

from lr_client.aio.parking import AsyncParkingCalls
from lr_client.delivery import PlanKind
from lr_client.errors import PartitionCountError
from lr_client.partitioned import Conflict, LeaseLost, PartitionSteps
from lr_client.queue_marks import QueueMarks
from lr_client.records import QueueInfo
from lr_client.store import QueueStore
from lr_client.store.db_errors import mapped_errors
from lr_client.store.sqlite import LateTurn
from lr_client.subscriber_settings import SubscriberCore

log = logging.getLogger("lr_client.subscriber")

T = TypeVar("T")

#: Seconds between raises of a queue's own mark to the minimum over its partitions
#: while they deliver (as the sync subscriber's).
QUEUE_MARK_INTERVAL = 0.5


async def in_greenlet(fn: Callable[..., T], *args: Any) -> T:
    """Run a sync store method that opens its own connections on an async engine."""
    result: T = await greenlet_spawn(fn, *args)
    return result


class LoopTurn:
    """The async tasks' turn at SQLite's one writer, as a late write's ``turn``: taken
    in the greenlet of the transaction's first statement, awaiting ``lock`` there (the
    loop runs on meanwhile)."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        await_only(self.lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class AsyncPartitionWorkers(SubscriberCore):
    """The async subscriber's delivery by partition (a part of
    :class:`~lr_client.aio.subscriber.AsyncRoutingQueueSubscriber`)."""

    engine: AsyncEngine
    store: QueueStore
    _calls: AsyncParkingCalls

    def _init_partitions(self) -> None:
        self._partition_steps = PartitionSteps(
            self.store,
            self._calls,
            self._leases,
            partitioner=self.partitioner,
            batch_size=self.batch_size,
            batch_max_bytes=self.batch_max_bytes,
            lock=contextlib.nullcontext,
        )
        #: Queues whose partitions moved since their own mark was raised.
        self._queue_marks = QueueMarks(self.store, self.owner)
        #: One task at a time takes from the windows (each take may read the queue).
        self._reading = asyncio.Lock()
        #: One task at a time takes or renews a lease.
        self._holding = asyncio.Lock()
        #: SQLite has one writer: the tasks take their turns here, not in its busy handler;
        #: a partition's delivery at its first statement (a late write: what its listener
        #: awaits before it touches the database holds no lock), a barrier run at BEGIN.
        self._writer = asyncio.Lock() if self.store.single_writer else None
        self._writing: contextlib.AbstractAsyncContextManager[object] = (
            self._writer if self._writer is not None else contextlib.nullcontext()
        )
        #: Set (and replaced) when a barrier run commits, entries arrive or the run stops.
        self._bell = asyncio.Event()

    async def _report(self, error: BaseException) -> None:  # the subscriber's
        raise NotImplementedError

    def _ring(self) -> None:
        """Wake every task waiting for the bell."""
        bell, self._bell = self._bell, asyncio.Event()
        bell.set()

    async def _hold(self, queue_id: int) -> bool:
        """Whether this subscriber holds the queue's lease (taken or renewed if due)."""
        if self._leases.fresh(queue_id):
            return True
        async with self._holding:
            return await in_greenlet(self._leases.hold, queue_id)

    async def _raise_marks(self, every: float) -> None:
        await in_greenlet(self._queue_marks.raise_due, every)

    # -- the tasks --------------------------------------------------------------------
    async def _poll_by_partition(self) -> tuple[int, bool]:
        """Every partition in turn until none moves (barriers included)."""
        total, moved = 0, False
        while True:
            n, progressed = await self._poll_partitions(range(self.partitions))
            total += n
            moved = moved or progressed
            if not progressed:
                await self._raise_marks(0.0)
                return total, moved

    async def _run_partitions(self, stop: asyncio.Event) -> None:
        """Deliver with ``workers`` tasks until ``stop`` is set."""

        async def ring_at_stop() -> None:
            await stop.wait()
            self._ring()

        ringer = asyncio.ensure_future(ring_at_stop())
        tasks = [
            asyncio.ensure_future(self._work(range(w, self.partitions, self.workers), stop))
            for w in range(self.workers)
        ]
        try:
            await asyncio.gather(*tasks)
            try:
                await self._raise_marks(0.0)
            except Exception as exc:  # raised by the next subscriber
                await self._report(exc)
        finally:
            ringer.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self, parts: range, stop: asyncio.Event) -> None:
        while not stop.is_set():
            bell = self._bell
            try:
                progressed = (await self._poll_partitions(parts))[1]
                await self._raise_marks(
                    QUEUE_MARK_INTERVAL
                    if progressed
                    else min(self.poll_interval, QUEUE_MARK_INTERVAL)
                )
            except Exception as exc:  # the registry could not be read, or a count refused
                await self._report(exc)
                progressed = False
            if not progressed and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(bell.wait(), self._idle_wait())

    async def _poll_partitions(self, parts: range) -> tuple[int, bool]:
        """One turn of ``parts`` over every queue: (messages delivered, any progress)."""
        steps = self._partition_steps
        delivered, progressed = 0, False
        for queue in await in_greenlet(self.store.queues.list_queues, self.client_name):
            qid = queue.queue_id
            for p in parts:
                key = (qid, p)
                if self._retry_at.get(key, 0.0) > time.monotonic():
                    continue
                try:
                    if not await self._hold(qid):
                        break
                    for _ in range(self.max_batches):
                        attempt = self._failures.get(key, 0) + 1
                        n, barrier = await self._deliver_partition(queue, p, attempt)
                        if n is None:
                            n = await self._deliver_barrier(queue, attempt)
                            if n is None:
                                break
                        self._succeeded(key)
                        delivered += n
                        progressed = True
                        self._queue_marks.moved(qid)
                        if barrier:  # the tasks waiting there look again
                            self._ring()
                except PartitionCountError:
                    raise
                except LeaseLost:
                    self._leases.lost(qid)
                    steps.forget(qid)
                    break
                except Conflict:  # retried at its next turn
                    log.debug("partition %d of %s changed; retrying", p, queue.queue_name)
                    steps.forget(qid)
                except Exception as exc:
                    steps.forget(qid)
                    await self._report(error := self._failed(key, exc))
                    await in_greenlet(self._note_failure, key, error)
        return delivered, progressed

    # -- the two delivery transactions ------------------------------------------------
    async def _deliver_partition(
        self, queue: QueueInfo, partition: int, attempt: int
    ) -> tuple[int | None, bool]:
        """Deliver the next keyed entries of ``partition``: (how many, 0 if it only
        passed others' entries, None if it stands at a barrier or the end; whether
        it stopped just below a barrier)."""
        steps = self._partition_steps
        async with self._reading:
            taken = await in_greenlet(steps.take, queue, partition)
        if taken is None:
            return None, True
        plan = taken.plan(queue)
        late = None if self._writer is None else LateTurn(LoopTurn(self._writer))
        try:
            with mapped_errors():
                # SQLite: BEGIN deferred, the locks taken at the first statement.
                async with self.engine.connect() as conn, conn.begin():
                    if late is not None:
                        await conn.execution_options(lr_turn=late)
                    if plan is not None:
                        calls = await conn.run_sync(self._calls.callbacks, queue, plan)
                        await self._calls.call(
                            conn, queue, plan, attempt, calls=calls, partition=partition
                        )
                    await conn.run_sync(steps.save, queue, partition, taken)
                    if late is not None:  # the commit holds the locks too
                        await conn.run_sync(lambda c: late.take(c.connection.dbapi_connection))
        finally:
            if late is not None:
                late.release()
        steps.saved(queue.queue_id, partition, taken)
        return len(taken.entries), taken.at_barrier

    async def _deliver_barrier(self, queue: QueueInfo, attempt: int) -> int | None:
        """Deliver the entries every partition waits for, once all stand below them:
        how many messages, or None if they are not all there yet (or none waits)."""
        steps = self._partition_steps
        with mapped_errors():
            async with self._writing, self.engine.connect() as conn:
                await conn.execution_options(lr_immediate=True)
                async with conn.begin():
                    barrier = await conn.run_sync(steps.open_barrier, queue)
                    redone = await self._calls.redeliver(conn, queue)  # parked, released
                    if barrier is None:
                        return redone or None
                    plan = barrier.plan
                    if plan.kind is not PlanKind.STALE:
                        calls = barrier.callbacks
                        await self._calls.call(
                            conn, queue, plan, attempt, calls=calls, partition=None
                        )
                    expires = await conn.run_sync(steps.mark_barrier, queue, barrier)
        steps.barrier_saved(queue.queue_id, barrier, expires)
        return len(barrier.plan.messages) + redone


__all__ = ["QUEUE_MARK_INTERVAL", "AsyncPartitionWorkers", "in_greenlet"]
