"""Routing-queue log replication for asyncio applications (SQLAlchemy's asyncio extension).

Sender side: :class:`AsyncRoutingQueueClient` transmits inside an
``AsyncSession`` or ``AsyncConnection``, with the sync client's rules.
"""

from __future__ import annotations

from lr_client.aio.engine import create_async_engine, sync_url
from lr_client.aio.sender import AsyncRoutingQueueClient

__all__ = [
    "AsyncRoutingQueueClient",
    "create_async_engine",
    "sync_url",
]
