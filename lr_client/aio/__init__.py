"""The asyncio API: an async listener and subscriber on SQLAlchemy's ``AsyncEngine``
(aiosqlite, asyncpg, psycopg's async driver), and an async snapshot provider, sharing
the sync API's rules and SQL."""

from __future__ import annotations

from lr_client.aio.listener import AsyncRoutingQueueListener
from lr_client.aio.snapshot import AsyncSnapshotContext, AsyncSnapshotProviderRunner
from lr_client.aio.subscriber import AsyncRoutingQueueSubscriber
from lr_client.store.async_engine import create_async_engine

__all__ = [
    "AsyncRoutingQueueListener",
    "AsyncRoutingQueueSubscriber",
    "AsyncSnapshotContext",
    "AsyncSnapshotProviderRunner",
    "create_async_engine",
]
