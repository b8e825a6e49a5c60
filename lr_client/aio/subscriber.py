"""The async sink subscriber: delivers receive queues to an async listener, exactly once,
as a task of the application's event loop.

The rules are the sync subscriber's (:mod:`lr_client.subscriber`), shared, not
copied: one delivery is one transaction on a connection of the application's
``AsyncEngine``, where the read and plan (:meth:`QueueDelivery.open
<lr_client.queue_delivery.QueueDelivery.open>`) and the fenced mark
(:meth:`~lr_client.queue_delivery.QueueDelivery.mark`) run the store's SQL in
SQLAlchemy's greenlet bridge (``await conn.run_sync(...)``) and the listener
is awaited between them with an ``AsyncSession`` joined to that transaction.
So its writes and the mark commit together or not at all (I3), and a task
cancelled anywhere before the commit leaves the transaction to roll back:
nothing of a delivery cut short is committed, its entries come again.

Leases, retries with back-off, the settings and the full-sync rules are the
sync subscriber's (:mod:`lr_client.subscriber_settings`). Delivery by partition
(``partitions > 1``) runs ``workers`` tasks in the loop
(:mod:`lr_client.aio.partitions`), with the sync subscriber's steps and rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from lr_client.aio.engine import create_async_engine
from lr_client.aio.listener import AsyncRoutingQueueListener
from lr_client.aio.parking import AsyncParkingCalls
from lr_client.aio.partitions import AsyncPartitionWorkers, in_greenlet
from lr_client.errors import PartitionCountError
from lr_client.failure_policy import FailurePolicy
from lr_client.keys import Keyring
from lr_client.partitioned import Conflict, LeaseLost
from lr_client.partitioners import Partitioner
from lr_client.records import QueueInfo
from lr_client.store.async_engine import open_async_store, watch_arrivals
from lr_client.store.db_errors import mapped_errors
from lr_client.store.schema.lifecycle import SchemaStatus
from lr_client.store.watches import Watch
from lr_client.subscriber_settings import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_SNAPSHOT_BATCH_SIZE,
    SnapshotDelivery,
)

log = logging.getLogger("lr_client.subscriber")


class AsyncRoutingQueueSubscriber(AsyncPartitionWorkers):
    """Delivers one client's receive queues ``LRQ_Recv_<client>__*`` to an async listener.

    ``engine``: the application's ``AsyncEngine`` (aiosqlite, asyncpg or psycopg's
    async driver; see :func:`lr_client.aio.engine.create_async_engine`), or
    a URL (the subscriber opens an engine and disposes of it at :meth:`close`).
    The settings are those of :class:`~lr_client.subscriber.RoutingQueueSubscriber`;
    with ``partitions = N`` (N > 1) it delivers each queue by partition with
    ``workers`` tasks (default N) in the loop, each owning the partitions ``p``
    with ``p % workers`` equal to its number: the entries of one key in source
    order, different keys in parallel, entries without a key and full syncs
    after every entry before them and before every entry after them; the
    listener finds its partition in ``session.info["lr_partition"]``. Run it with
    ``await subscriber.run(stop)``; with ``wake_on_arrival`` it delivers as soon as a
    receiver commits entries of its client, else at most every ``poll_interval``
    seconds. Several subscribers (tasks or processes) of one client share its
    queues through their leases. ``keyring``: payloads are decrypted before the
    listener sees them, as by the sync subscriber.
    """

    def __init__(
        self,
        engine: AsyncEngine | str,
        client_name: str,
        listener: AsyncRoutingQueueListener,
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
        owned = isinstance(engine, str)
        self.engine = create_async_engine(engine) if isinstance(engine, str) else engine
        #: Whether this subscriber made the engine (and disposes of it at close()).
        self._owned = owned
        self.store = open_async_store(self.engine)
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
        self.listener = listener
        self._calls = self._planner(AsyncParkingCalls, listener, self.store)
        self._delivery = self._steps(self.store, self._calls)
        self._init_partitions()
        self.wake_on_arrival = wake_on_arrival
        #: While :meth:`run` runs with ``wake_on_arrival``: its watch (a thread).
        self.arrival_watch: Watch | None = None

    # -- public API ------------------------------------------------------------------
    async def create_schema(self) -> SchemaStatus:
        """Create or upgrade the queue store's tables (what ``lr init-db`` does); idempotent."""
        return await in_greenlet(self.store.create_schema)

    async def poll_once(self) -> int:
        """Deliver what is ready in every queue; return how many entries the listener got."""
        return (await self._poll())[0]

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set (or the task is cancelled), then release this
        subscriber's leases."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def woken() -> None:
            wake.set()
            self._ring()

        def ring() -> None:  # from the watch's thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(woken)

        if self.wake_on_arrival:
            self.arrival_watch = await asyncio.to_thread(
                watch_arrivals, self.engine, self.client_name, ring
            )
        stopping = asyncio.ensure_future(stop.wait())
        try:
            if self.partitions > 1:
                await self._run_partitions(stop)
            while not stop.is_set():
                wake.clear()  # before looking: a ring while it looks ends the next wait
                try:
                    again = (await self._poll())[1]
                except Exception as exc:  # the registry could not be read
                    await self._report(exc)
                    again = False
                if not again:
                    await self._idle(wake, stopping)
        finally:
            stopping.cancel()
            watch, self.arrival_watch = self.arrival_watch, None
            if watch is not None:
                await asyncio.to_thread(watch.close)
            await self.release_leases()

    async def _idle(self, wake: asyncio.Event, stopping: asyncio.Future[Any]) -> None:
        """Wait for the poll interval, a ring or the stop, whichever first."""
        ringing = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait(
                {ringing, stopping}, timeout=self._idle_wait(), return_when="FIRST_COMPLETED"
            )
        finally:
            ringing.cancel()

    async def release_leases(self) -> None:
        """Let other subscribers take this one's queues at once."""
        self._leases.until.clear()

        def release() -> None:
            with self.store.write() as conn:
                self.store.queues.release_leases(conn, self.owner)

        try:
            await in_greenlet(release)
        except Exception as exc:  # they expire anyway
            log.warning("could not release leases of %s: %s", self.owner, exc)

    async def close(self) -> None:
        """Release the leases; dispose of the engine if this subscriber made it from a URL."""
        await self.release_leases()
        if self._owned:
            await self.engine.dispose()

    async def __aenter__(self) -> AsyncRoutingQueueSubscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- polling ----------------------------------------------------------------------
    async def _poll(self) -> tuple[int, bool]:
        if self.partitions > 1:
            return await self._poll_by_partition()
        queues = await in_greenlet(self.store.queues.list_queues, self.client_name)
        due = self._due(queues)
        if not due:
            return 0, False
        ready = await in_greenlet(self._ready, due)
        delivered, again = 0, False
        for queue in ready:
            n, more = await self._drain(queue)
            delivered += n
            again = again or more
        return delivered, again

    def _ready(self, queues: list[QueueInfo]) -> list[QueueInfo]:
        with self.store.read_statements() as conn:  # one probe a queue, no snapshot shared
            return [q for q in queues if self._waiting(conn, q.queue_id)]

    async def _drain(self, queue: QueueInfo) -> tuple[int, bool]:
        """As :meth:`RoutingQueueSubscriber._drain <lr_client.subscriber.RoutingQueueSubscriber>`:
        (entries delivered, whether to poll again at once)."""
        qid = queue.queue_id
        delivered, progressed, drained = 0, False, False
        try:
            if not await self._hold(qid):
                return 0, False
            for i in range(self.max_batches):
                if self._probe_first(i, delivered) and not await in_greenlet(self._ready, [queue]):
                    drained = True
                    break
                n = await self._deliver(queue, self._failures.get(qid, 0) + 1)
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
            await self._report(error := self._failed(qid, exc))
            await in_greenlet(self._note_failure, qid, error)
        watch = self.arrival_watch
        announced = watch is not None and watch.listening
        return delivered, progressed and not (drained and announced)

    async def _report(self, error: BaseException) -> None:
        try:
            await self.listener.on_error(error)
        except Exception:
            log.exception("listener.on_error raised")

    # -- one delivery transaction -------------------------------------------------
    async def _deliver(self, queue: QueueInfo, attempt: int) -> int | None:
        """Deliver the head of ``queue``: the number of messages, or None if none is ready."""
        steps = self._delivery
        with mapped_errors():
            async with self.engine.connect() as conn:
                await conn.execution_options(lr_immediate=True)  # SQLite: BEGIN IMMEDIATE
                async with conn.begin():
                    opened = await conn.run_sync(steps.open, queue)
                    redone = await self._calls.redeliver(conn, queue)  # parked, released
                    if opened is None:
                        return redone or None
                    if opened.callbacks:  # none for the left-overs of an ended snapshot
                        calls = opened.callbacks
                        await self._calls.call(conn, queue, opened.plan, attempt, calls=calls)
                    expires = await conn.run_sync(steps.mark, queue, opened)
        self._leases.renewed(queue.queue_id, expires)
        if self._applied(queue, opened.plan):  # the stages' latency is due to be written
            await in_greenlet(self._flush_stages)
        return len(opened.plan.messages) + redone


__all__ = ["AsyncRoutingQueueSubscriber", "in_greenlet"]
