"""The queue store on an application's async engine (made by
:func:`lr_client.aio.engine.create_async_engine`): SQLite through aiosqlite,
PostgreSQL through asyncpg or psycopg's async connection.

The store's SQL is the sync store's, run on the async engine's connections
in SQLAlchemy's greenlet bridge (``AsyncConnection.run_sync``).
"""

from __future__ import annotations

import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncEngine

from lr_client.store import open_store
from lr_client.store.contract import QueueStore
from lr_client.store.recv.arrival_watch import ArrivalWatch
from lr_client.store.watches import Wake, Watch


def open_async_store(engine: AsyncEngine) -> QueueStore:
    """The store backend of an async engine: its methods that take a ``Connection`` run
    on the engine's connections in ``run_sync``; those that open their own need the
    greenlet bridge too (``greenlet_spawn``)."""
    return open_store(engine.sync_engine)


def watch_arrivals(engine: AsyncEngine, client_name: str, wake: Wake) -> Watch | None:
    """A thread calling ``wake()`` when a receiver stores entries of ``client_name`` in
    ``engine``'s database (:meth:`~lr_client.store.contract.SubscriberQueues.watch_arrivals`).

    On PostgreSQL the watch listens on a psycopg connection of its own, whatever
    the async driver (the notifications are per database); on SQLite it reads the
    database file's ``data_version``.
    """
    if engine.dialect.name == "postgresql":
        url = engine.url.set(drivername="postgresql+psycopg", query={})
        listener = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        return ArrivalWatch(listener, client_name, wake)
    return open_store(engine.sync_engine).queues.watch_arrivals(client_name, wake)


__all__ = [
    "open_async_store",
    "watch_arrivals",
]
