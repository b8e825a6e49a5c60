"""The failure policy for the async listener: :class:`~lr_client.parking.ParkingCalls`'
steps (:class:`~lr_client.parking.Parking`), the store's SQL run with
``conn.run_sync`` and the listener awaited, each try of a bisection or a
redelivery in a savepoint of the delivering transaction."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction

from lr_client.aio.calls import AsyncListenerCalls
from lr_client.aio.listener import AsyncRoutingQueueListener
from lr_client.delivery import Plan
from lr_client.errors import ListenerError
from lr_client.failure_policy import FailurePolicy
from lr_client.keys import Keyring
from lr_client.listener_calls import Callback
from lr_client.parking import Parking
from lr_client.records import QueueInfo
from lr_client.store import DeliveryStore


async def undone(conn: AsyncConnection, savepoint: AsyncTransaction) -> bool:
    """As :func:`lr_client.parking.undone`, for an async connection."""
    txn = conn.sync_connection.get_transaction() if conn.sync_connection else None
    if txn is None or not txn.is_active:
        return False
    if savepoint.is_active:
        await savepoint.rollback()
    return True


class AsyncParkingCalls(AsyncListenerCalls):
    """An async listener's calls under a subscriber's :class:`FailurePolicy`."""

    def __init__(
        self,
        listener: AsyncRoutingQueueListener,
        store: DeliveryStore,
        *,
        whole_snapshots: bool,
        policy: FailurePolicy,
        keyring: Keyring | None = None,
    ) -> None:
        super().__init__(listener, store, whole_snapshots=whole_snapshots, keyring=keyring)
        self.parking = Parking(policy)

    async def call(
        self,
        conn: AsyncConnection,
        queue: QueueInfo,
        plan: Plan,
        attempt: int,
        *,
        calls: list[Callback],
        partition: int | None = None,
    ) -> None:
        parking = self.parking
        guard = await conn.run_sync(parking.open, queue, plan, attempt, partition)
        if guard is None:
            await super().call(conn, queue, plan, attempt, calls=calls, partition=partition)
            await conn.run_sync(parking.unblock, queue, attempt, partition)
            return
        search = guard.search
        while (group := search.next()) is not None:
            savepoint = await conn.begin_nested() if guard.isolating else None
            part = guard.part(group)
            try:
                cbs = self.callbacks(conn.sync_connection, queue, part)  # type: ignore[arg-type]
                await super().call(conn, queue, part, attempt, calls=cbs, partition=partition)
            except ListenerError as exc:
                if savepoint is None or not await undone(conn, savepoint):
                    raise
                search.failed(str(exc))
            else:
                if savepoint is not None:
                    await savepoint.commit()
                search.ok()
        await conn.run_sync(parking.close, queue, guard, attempt)
        await conn.run_sync(parking.unblock, queue, attempt, partition)

    async def redeliver(self, conn: AsyncConnection, queue: QueueInfo) -> int:
        """Deliver the queue's released rows in ``conn``'s transaction: how many applied."""
        parking = self.parking
        applied, stopped = 0, set()
        for row, message in await conn.run_sync(parking.released, queue):
            if row.key is not None and row.key in stopped:
                continue
            await conn.run_sync(parking.take, row)
            plan, calls = parking.single(row, self.readable(queue, [message])[0])
            savepoint = await conn.begin_nested()
            try:
                await super().call(conn, queue, plan, row.attempts + 1, calls=calls)
            except ListenerError as exc:
                if not await undone(conn, savepoint):
                    raise
                await conn.run_sync(parking.failed_again, row, str(exc))
                stopped.add(row.key)
                continue
            await savepoint.commit()
            applied += 1
        return applied


__all__ = ["AsyncParkingCalls", "undone"]
