"""Async engines for an application, and the sync URL of the same database.

An application on SQLAlchemy's asyncio extension builds its engine with
SQLAlchemy's ``create_async_engine`` and one of the async drivers:

- ``sqlite+aiosqlite:///path/site.db``
- ``postgresql+psycopg://user@host/db`` (psycopg 3: ``create_async_engine``
  picks its async connection)
- ``postgresql+asyncpg://user@host/db``

:func:`create_async_engine` does that with the queue store's SQLite settings
(WAL, a busy timeout, transactions that begin when the application begins
them; a connection back in the pool is rolled back only if a transaction is
still open), reads a bare ``postgresql://`` as psycopg, and gives asyncpg the
``options=-c name=value`` of a libpq URL (a ``search_path``, say) as its
``server_settings``, so one URL serves every driver. The client still keeps
its own bookkeeping (flow state, route, registered sites) on a sync engine of
the same database: :func:`sync_url` names it.
"""

from __future__ import annotations

import shlex
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext import asyncio as sa_asyncio
from sqlalchemy.pool import PoolResetState

from lr_client.aio import sqlite_driver
from lr_client.errors import ConfigError
from lr_client.store import SQLITE_BUSY_TIMEOUT_S, configure_sqlite_engine

#: The sync driver of the store's own engine, for each async driver of an application.
SYNC_DRIVERS = {
    "sqlite+aiosqlite": "sqlite",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql+psycopg_async": "postgresql+psycopg",
    "postgresql+asyncpg": "postgresql+psycopg",
}


def create_async_engine(url: str | URL, **kwargs: Any) -> sa_asyncio.AsyncEngine:
    """An async engine for the application's own transactions, on a site's database.

    ``sqlite+aiosqlite`` (or a bare ``sqlite://``) gets the settings of the store's
    engine (:func:`lr_client.store.create_engine`); ``postgresql://`` means psycopg's
    async driver; ``postgresql+asyncpg`` takes a URL's ``options`` (``-c
    name=value`` only) as ``server_settings``. Other URLs and every keyword go
    to SQLAlchemy as they are.
    """
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    if text.startswith("postgresql://") or text.startswith("postgres://"):
        text = "postgresql+psycopg://" + text.split("://", 1)[1]
    elif text.startswith("sqlite://"):
        text = "sqlite+aiosqlite://" + text.split("://", 1)[1]
    if text.startswith("postgresql+asyncpg") and "options" in make_url(text).query:
        parsed = make_url(text)
        settings = _server_settings(str(parsed.query["options"]))
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args["server_settings"] = {**settings, **connect_args.get("server_settings", {})}
        return sa_asyncio.create_async_engine(parsed.difference_update_query(["options"]), **kwargs)
    if not text.startswith("sqlite"):
        return sa_asyncio.create_async_engine(text, **kwargs)
    kwargs.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
    reset = "pool_reset_on_return" not in kwargs
    if reset:
        kwargs["pool_reset_on_return"] = None  # rolled back by _reset_open below
    engine = sa_asyncio.create_async_engine(text, **kwargs)
    configure_sqlite_engine(engine.sync_engine)
    if "async_creator" not in kwargs:
        event.listen(engine.sync_engine, "do_connect", _one_trip_statements)
    if reset:
        event.listen(engine.sync_engine, "reset", _reset_open)
    return engine


def _one_trip_statements(
    _dialect: Any, _record: Any, _cargs: list[Any], cparams: dict[str, Any]
) -> None:
    """Connect with :func:`lr_client.aio.sqlite_driver.connect`: a statement is one
    trip to aiosqlite's thread, not four."""
    cparams["async_creator_fn"] = sqlite_driver.connect


def _reset_open(dbapi_conn: Any, _record: Any, state: PoolResetState) -> None:
    """The pool's reset of an aiosqlite connection: a rollback only if a transaction is
    open. Each call is a trip to aiosqlite's thread, and the engine's transactions
    begin with an explicit BEGIN: one returned after its COMMIT has none to undo."""
    if (
        state.asyncio_safe
        and not state.terminate_only
        and dbapi_conn.driver_connection.in_transaction
    ):
        dbapi_conn.rollback()


def _server_settings(options: str) -> dict[str, str]:
    """libpq's ``options`` (``-c name=value`` or ``-cname=value``, repeated) as a dict."""
    words = shlex.split(options)
    settings: dict[str, str] = {}
    while words:
        word = words.pop(0)
        if word == "-c" and words:
            word = "-c" + words.pop(0)
        name, eq, value = word[2:].partition("=")
        if not word.startswith("-c") or not eq or not name:
            raise ConfigError(f"asyncpg takes only '-c name=value' options, not {options!r}")
        settings[name] = value
    return settings


def sync_url(url: str | URL) -> URL:
    """The URL of the same database through the store's sync driver.

    Only the driver changes: credentials, host, database and query stay.
    Settings given to the async engine in ``connect_args`` (asyncpg's
    ``server_settings``, say) are not part of a URL; a client that needs
    them opens its store on an engine of its own instead.
    """
    parsed = make_url(url)
    driver = SYNC_DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ConfigError(
            f"no sync driver known for {parsed.drivername!r} "
            f"(async drivers: {', '.join(sorted(SYNC_DRIVERS))})"
        )
    if parsed.drivername == "sqlite+aiosqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigError("an in-memory SQLite database cannot be shared with the store")
    return parsed.set(drivername=driver)


__all__ = ["SYNC_DRIVERS", "create_async_engine", "sync_url"]
