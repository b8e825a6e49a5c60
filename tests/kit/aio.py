"""The async subscriber under the sync subscriber's tests: one suite, both APIs.

:class:`AsAsync` awaits a sync test listener (each callback runs with the
``AsyncSession``'s sync session, in its greenlet: ``session.run_sync``), and
:class:`SyncDriven` drives an :class:`~lr_client.aio.AsyncRoutingQueueSubscriber`
from sync test code through one event loop of its own, so a test written against
``RoutingQueueSubscriber`` (``poll_once``, ``run(threading.Event)``, ``close``)
runs against the async one unchanged. :func:`async_engine` opens the async
engine of a test database URL with a given driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from lr_client.aio import AsyncRoutingQueueListener, AsyncRoutingQueueSubscriber
from lr_client.aio.engine import create_async_engine
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage, takes_base_position
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from tests.conftest import PgSchema
from tests.kit.templates import migrated_sqlite

#: The async drivers of each backend.
DRIVERS = {"sqlite": ("aiosqlite",), "postgresql": ("psycopg", "asyncpg")}
#: Every async driver, as the params of a fixture (PostgreSQL's marked).
DRIVER_PARAMS = [
    "aiosqlite",
    pytest.param("psycopg", marks=pytest.mark.postgres),
    pytest.param("asyncpg", marks=pytest.mark.postgres),
]


def async_engine(url: str, driver: str | None = None, **kwargs: Any) -> AsyncEngine:
    """The async engine of a test database URL (``sqlite:///...`` or the
    ``postgresql+psycopg://...?options=-csearch_path%3D<schema>`` of the fixtures),
    through ``driver`` (PostgreSQL: ``"psycopg"``, the default, or ``"asyncpg"``,
    which takes the search path as a server setting, not ``options``)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return create_async_engine(u.render_as_string(hide_password=False), **kwargs)
    if driver in (None, "psycopg"):
        u = u.set(drivername="postgresql+psycopg")
        return create_async_engine(u.render_as_string(hide_password=False), **kwargs)
    assert driver == "asyncpg", driver
    query = dict(u.query)
    options = query.pop("options", "")
    settings: dict[str, str] = {}
    for opt in str(urllib.parse.unquote(str(options))).split():
        name, _, value = opt.removeprefix("-c").partition("=")
        settings[name] = value
    u = u.set(drivername="postgresql+asyncpg", query=query)
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("server_settings", {}).update(settings)
    return create_async_engine(
        u.render_as_string(hide_password=False), connect_args=connect_args, **kwargs
    )


@dataclass
class Site:
    """A site's migrated database: its sync store (a receiver's, a requester's side),
    its URL and the async driver under test."""

    store: SQLAlchemyQueueStore
    url: str
    driver: str

    def engine(self) -> AsyncEngine:
        return async_engine(self.url, self.driver)


@contextlib.contextmanager
def aio_site(driver: str, tmp_path: Path) -> Iterator[Site]:
    """A migrated database of the backend of ``driver`` (dropped at the end)."""
    schema: PgSchema | None = None
    if driver == "aiosqlite":
        migrated_sqlite(tmp_path / "aio.db")
        url = f"sqlite:///{tmp_path / 'aio.db'}"
    else:
        schema = PgSchema(migrated=True)
        url = schema.url
    store = open_store(create_engine(url))
    try:
        yield Site(store, url, driver)
    finally:
        store.engine.dispose()
        if schema is not None:
            schema.drop()


class AsAsync(AsyncRoutingQueueListener):
    """A sync listener, awaited: each callback gets the async session's sync session."""

    def __init__(self, listener: RoutingQueueListener) -> None:
        self.sync = listener

    async def on_full_sync_start(
        self, session: AsyncSession, source_id: str, snapshot_id: str, **kwargs: Any
    ) -> None:
        fn = self.sync.on_full_sync_start
        if not takes_base_position(fn):
            kwargs.pop("base_position", None)
        await session.run_sync(lambda s: fn(s, source_id, snapshot_id, **kwargs))

    async def on_full_sync_end(
        self, session: AsyncSession, source_id: str, snapshot_id: str, **kwargs: Any
    ) -> None:
        fn = self.sync.on_full_sync_end
        if not takes_base_position(fn):
            kwargs.pop("base_position", None)
        await session.run_sync(lambda s: fn(s, source_id, snapshot_id, **kwargs))

    async def process_full_sync(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        fn = self.sync.process_full_sync
        return await session.run_sync(lambda s: fn(s, source_id, messages))

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        fn = self.sync.process_log_entries
        return await session.run_sync(lambda s: fn(s, source_id, messages))

    async def on_stream_dropped(
        self, session: AsyncSession, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        fn = self.sync.on_stream_dropped
        await session.run_sync(lambda s: fn(s, source_id, first_dropped_position, reason))

    async def on_error(self, error: BaseException) -> None:
        self.sync.on_error(error)


class SyncDriven:
    """An async subscriber of a sync listener, driven from sync code (one loop of its own).

    Attributes not defined here are the async subscriber's.
    """

    def __init__(
        self,
        url: str,
        client_name: str,
        listener: RoutingQueueListener,
        driver: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.runner = asyncio.Runner()
        self.engine = async_engine(url, driver)
        self.sub = AsyncRoutingQueueSubscriber(
            self.engine, client_name, AsAsync(listener), **kwargs
        )
        self.closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sub, name)

    def poll_once(self) -> int:
        return self.runner.run(self.sub.poll_once())

    @property
    def arrival_watch(self) -> Any:
        return self.sub.arrival_watch

    @arrival_watch.setter
    def arrival_watch(self, watch: Any) -> None:
        self.sub.arrival_watch = watch

    def _poll(self) -> tuple[int, bool]:
        return self.runner.run(self.sub._poll())

    def release_leases(self) -> None:
        self.runner.run(self.sub.release_leases())

    def run(self, stop: threading.Event) -> None:
        async def until_stopped() -> None:
            loop, stopped = asyncio.get_running_loop(), asyncio.Event()

            def watch() -> None:
                stop.wait()
                loop.call_soon_threadsafe(stopped.set)

            threading.Thread(target=watch, daemon=True).start()
            await self.sub.run(stopped)

        self.runner.run(until_stopped())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.runner.run(self.sub.close())
            self.runner.run(self.engine.dispose())
        finally:
            self.runner.close()

    def __enter__(self) -> SyncDriven:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DRIVERS", "DRIVER_PARAMS", "AsAsync", "Site", "SyncDriven", "aio_site", "async_engine"]
