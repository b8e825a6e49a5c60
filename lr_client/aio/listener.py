"""What an asyncio sink application implements: the listener of
:class:`~lr_client.aio.subscriber.AsyncRoutingQueueSubscriber`.

The callbacks of :class:`~lr_client.listener.RoutingQueueListener`, awaited,
with an :class:`~sqlalchemy.ext.asyncio.AsyncSession` joined to the delivery's
transaction; the same messages (:class:`~lr_client.listener.RoutingQueueMessage`).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from lr_client.listener import RoutingQueueMessage

log = logging.getLogger("lr_client.subscriber")


class AsyncRoutingQueueListener(abc.ABC):
    """Receives one client's entries from every source, in order, exactly once.

    As :class:`~lr_client.listener.RoutingQueueListener`, with coroutines: each
    callback gets ``session``, an ``AsyncSession`` joined to the transaction that
    marks the delivered entries delivered, so whatever the listener writes with
    it commits together with that mark, or not at all (``await session.commit()``
    inside a callback only flushes). Returning False from ``process_*`` or
    raising rolls the transaction back; the entries come again after a backoff
    and :meth:`on_error` is told why. A delivery whose task is cancelled while
    a callback awaits rolls back too: nothing of it is committed.

    ``on_full_sync_start`` and ``on_full_sync_end`` are told ``base_position``
    when their override takes a parameter of that name (or ``**kwargs``).
    """

    async def on_full_sync_start(
        self,
        session: AsyncSession,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        """A full sync from ``source_id`` begins (no-op by default)."""
        return None

    @abc.abstractmethod
    async def process_full_sync(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        """Apply one batch of snapshot entries; return True to commit it."""

    async def on_full_sync_end(
        self,
        session: AsyncSession,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        """The full sync ``snapshot_id`` is complete (no-op by default)."""
        return None

    @abc.abstractmethod
    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        """Apply one batch of log entries; return True to commit it."""

    async def on_stream_dropped(
        self, session: AsyncSession, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        """Entries of ``source_id`` from ``first_dropped_position`` on may never arrive
        (see :meth:`~lr_client.listener.RoutingQueueListener.on_stream_dropped`)."""
        return None

    async def on_error(self, error: BaseException) -> None:
        """A delivery failed and will be retried (logs a warning by default).

        Called outside the delivery transaction, after its rollback.
        """
        log.warning("routing queue delivery failed: %s", error)


__all__ = ["AsyncRoutingQueueListener"]
