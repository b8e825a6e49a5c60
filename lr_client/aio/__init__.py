"""The asyncio API, on SQLAlchemy's asyncio extension (aiosqlite, asyncpg, psycopg's
async driver), sharing the sync API's rules and SQL.

Sender side: :class:`AsyncRoutingQueueClient` transmits inside an ``AsyncSession``
or ``AsyncConnection``. Sink side: :class:`AsyncRoutingQueueSubscriber` delivers to
an :class:`AsyncRoutingQueueListener`, exactly once; :class:`AsyncSnapshotProviderRunner`
runs an async snapshot provider.
"""

from __future__ import annotations

from lr_client.aio.engine import create_async_engine, sync_url
from lr_client.aio.listener import AsyncRoutingQueueListener
from lr_client.aio.sender import AsyncRoutingQueueClient
from lr_client.aio.snapshot import AsyncSnapshotContext, AsyncSnapshotProviderRunner
from lr_client.aio.subscriber import AsyncRoutingQueueSubscriber

__all__ = [
    "AsyncRoutingQueueClient",
    "AsyncRoutingQueueListener",
    "AsyncRoutingQueueSubscriber",
    "AsyncSnapshotContext",
    "AsyncSnapshotProviderRunner",
    "create_async_engine",
    "sync_url",
]
