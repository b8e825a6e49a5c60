"""Async engines for the queue store: SQLite through aiosqlite, PostgreSQL through
asyncpg or psycopg's async connection.

The store's SQL is the sync store's, run on the async engine's connections
in SQLAlchemy's greenlet bridge (``AsyncConnection.run_sync``); an async
engine gets the same configuration as :func:`lr_client.store.create_engine`
gives a sync one (SQLite: WAL, a busy timeout, explicit ``BEGIN``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as sqla_create_async_engine

from lr_client.store import SQLITE_BUSY_TIMEOUT_S, configure_sqlite, open_store
from lr_client.store.arrival_watch import ArrivalWatch
from lr_client.store.contract import QueueStore
from lr_client.store.watches import Wake, Watch

#: The async driver of a URL without one (``sqlite://``, ``postgresql://``).
DEFAULT_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}


def async_url(url: str) -> str:
    """``url`` with an async driver: ``sqlite://`` becomes ``sqlite+aiosqlite://``,
    ``postgresql://`` (or ``postgres://``) ``postgresql+psycopg://`` (psycopg's async
    connection); a URL naming its driver (``postgresql+asyncpg://``) is kept."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {url!r}")
    if scheme == "postgres":
        scheme = "postgresql"
    return f"{DEFAULT_ASYNC_DRIVERS.get(scheme, scheme)}://{rest}"


def create_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine configured for the queue store (see :func:`async_url`)."""
    url = async_url(url)
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
        engine = sqla_create_async_engine(url, **kwargs)
        configure_sqlite(engine.sync_engine)
        return engine
    return sqla_create_async_engine(url, **kwargs)


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
    return open_store(engine.sync_engine).watch_arrivals(client_name, wake)


__all__ = [
    "DEFAULT_ASYNC_DRIVERS",
    "async_url",
    "create_async_engine",
    "open_async_store",
    "watch_arrivals",
]
