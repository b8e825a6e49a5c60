"""The async listener as a delivery awaits it: the callbacks planned by
:class:`~lr_client.listener_calls.CallPlanner` (the sync subscriber's), each awaited
with an ``AsyncSession`` joined to the delivering transaction."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from lr_client.aio.listener import AsyncRoutingQueueListener
from lr_client.delivery import Plan
from lr_client.errors import ListenerError
from lr_client.keys import Keyring
from lr_client.listener_calls import PARTITION_INFO_KEY, Callback, CallPlanner
from lr_client.records import QueueInfo
from lr_client.store import DeliveryStore


class AsyncListenerCalls(CallPlanner):
    """Awaits an async ``listener`` for planned batches, in the delivering transaction."""

    def __init__(
        self,
        listener: AsyncRoutingQueueListener,
        store: DeliveryStore,
        *,
        whole_snapshots: bool,
        keyring: Keyring | None = None,
    ) -> None:
        super().__init__(listener, store, whole_snapshots=whole_snapshots, keyring=keyring)
        self.listener = listener

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
        """Await ``plan``'s callbacks (``calls``, planned in the transaction) in ``conn``'s
        transaction (``partition``: the one it is delivered for, None for entries every
        partition waited for, or without partitions).

        :class:`~lr_client.errors.ListenerError` if a callback raised, returned a
        false value for a batch, or rolled the transaction back. A cancellation
        is not caught: the caller's transaction rolls back as it unwinds.
        """
        sync = conn.sync_connection
        txn = sync.get_transaction() if sync else None
        savepoint = sync.get_nested_transaction() if sync else None
        session = AsyncSession(bind=conn, join_transaction_mode="rollback_only")
        session.info[PARTITION_INFO_KEY] = partition
        name = ""
        try:
            with self.applying(queue, plan):
                for cb in calls:
                    name = cb.name
                    result = await getattr(self.listener, name)(session, *cb.args, **cb.kwargs)
                    if cb.batch and (why := self.rejected(result)):
                        raise self.failure(queue, plan, attempt, name, why)
            await session.flush()
        except ListenerError:
            raise
        except Exception as exc:
            raise self.failure(queue, plan, attempt, name, f"{type(exc).__name__}: {exc}") from exc
        finally:
            await session.close()
        if self.rolled_back(txn, savepoint):
            raise self.failure(queue, plan, attempt, name, self.ROLLED_BACK)


__all__ = ["AsyncListenerCalls"]
