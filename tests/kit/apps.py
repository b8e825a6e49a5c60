"""An application that transmits, in each flavour: the sync API, or the async API on a driver.

The transmit tests are written once against :class:`App` and run in every
flavour (:data:`FLAVOURS`, through :func:`every_flavour`):

- ``sync``: :class:`~lr_client.RoutingQueueClient` in a ``Session`` of the
  store's engine (sqlite3 or psycopg);
- ``aiosqlite``, ``psycopg_async``, ``asyncpg``:
  :class:`~lr_client.aio.AsyncRoutingQueueClient` in an ``AsyncSession`` of an
  async engine on the same database.

The async flavour is driven step by step from the sync test body: each thread
has its event loop (an ``asyncio.Runner``) and its async engine, and every call
runs to completion in it. A test therefore reads the same in every flavour,
threads included (concurrent writers are concurrent connections either way).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from lr_client import EntryRef, LRMessageWithDestinations, RoutingQueueClient
from lr_client.aio import AsyncRoutingQueueClient, create_async_engine
from lr_client.store import SQLAlchemyQueueStore

T = TypeVar("T")

#: (backend, flavour): the sync API and each async driver of the backend.
FLAVOURS = [
    ("sqlite", "sync"),
    ("sqlite", "aiosqlite"),
    ("postgresql", "sync"),
    ("postgresql", "psycopg_async"),
    ("postgresql", "asyncpg"),
]


def every_flavour(
    backends: Sequence[str] = ("sqlite", "postgresql"), only_async: bool = False
) -> pytest.MarkDecorator:
    """Parametrise a test over ``db_url`` (the backend) and ``flavour`` together."""
    return pytest.mark.parametrize(
        ("db_url", "flavour"),
        [
            pytest.param(
                b,
                f,
                id=f"{b}-{f}",
                marks=[pytest.mark.postgres] if b == "postgresql" else [],
            )
            for b, f in FLAVOURS
            if b in backends and not (only_async and f == "sync")
        ],
        indirect=["db_url"],
    )


def async_engine(sync_url: str, flavour: str) -> AsyncEngine:
    """An async engine of ``flavour``'s driver on the database of ``sync_url``."""
    drivers = {
        "aiosqlite": "sqlite+aiosqlite",
        "psycopg_async": "postgresql+psycopg",
        "asyncpg": "postgresql+asyncpg",  # the search path: lr_client.aio reads it for asyncpg
    }
    return create_async_engine(make_url(sync_url).set(drivername=drivers[flavour]))


class Tx:
    """One application transaction: its own writes and its transmits."""

    def __init__(self, app: App, handle: Any, run: Callable[[Awaitable[T]], T] | None) -> None:
        self.app = app
        self.handle = handle  # a Session/Connection, or an AsyncSession/AsyncConnection
        self._run = run

    def _do(self, value: Any) -> Any:
        return value if self._run is None else self._run(value)

    def execute(self, statement: Any) -> Any:
        return self._do(self.handle.execute(statement))

    def transmit(
        self, payload: Any, destinations: Any, key: Any = None, headers: Any = None
    ) -> EntryRef:
        c = self.app.client
        call = c.transmit_log_entry_message(self.handle, payload, destinations, key, headers)
        return self._do(call)  # type: ignore[no-any-return]

    def transmit_many(self, messages: Sequence[LRMessageWithDestinations]) -> list[EntryRef]:
        return self._do(self.app.client.transmit_log_entry_messages(self.handle, messages))  # type: ignore[no-any-return]

    def request_snapshot(self, destination: str, reason: str = "application") -> str:
        c = self.app.client
        return self._do(c.request_snapshot_sync(destination, self.handle, reason=reason))  # type: ignore[no-any-return]

    @contextmanager
    def undone(self) -> Iterator[None]:
        """A savepoint rolled back at the end of the block."""
        sp = self._do(self.handle.begin_nested())
        yield
        self._do(sp.rollback())

    def commit(self) -> None:
        self._do(self.handle.commit())

    def rollback(self) -> None:
        self._do(self.handle.rollback())

    def close(self) -> None:
        self._do(self.handle.close())


class App:
    """A transmitting application of one flavour on ``store``'s database."""

    def __init__(
        self, store: SQLAlchemyQueueStore, flavour: str, source_id: str, client_name: str, **kw: Any
    ) -> None:
        self.store = store
        self.flavour = flavour
        self.client: RoutingQueueClient | AsyncRoutingQueueClient
        if flavour == "sync":
            self.client = RoutingQueueClient(store, source_id, client_name, **kw)
        else:
            self.client = AsyncRoutingQueueClient(store, source_id, client_name, **kw)
        self._local = threading.local()
        self._loops: list[tuple[asyncio.Runner, AsyncEngine]] = []
        self._lock = threading.Lock()

    @property
    def is_async(self) -> bool:
        return self.flavour != "sync"

    def loop(self) -> tuple[asyncio.Runner, AsyncEngine]:
        """This thread's event loop and async engine."""
        mine: tuple[asyncio.Runner, AsyncEngine] | None = getattr(self._local, "loop", None)
        if mine is None:
            runner = asyncio.Runner()
            engine = async_engine(
                self.store.engine.url.render_as_string(hide_password=False), self.flavour
            )
            mine = (runner, engine)
            self._local.loop = mine
            with self._lock:
                self._loops.append(mine)
        return mine

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run a coroutine to its end in this thread's event loop."""
        runner, _ = self.loop()

        async def wrapped() -> T:
            return await awaitable

        return runner.run(wrapped())

    def open(self, kind: str = "session", begin: bool = True) -> Tx:
        """An open transaction (``kind`` "session" or "connection"; without ``begin``, a
        connection that begins at its first statement)."""
        if not self.is_async:
            handle: Any = Session(self.store.engine) if kind == "session" else None
            if handle is None:
                handle = self.store.engine.connect()
            if begin:
                handle.begin()
            return Tx(self, handle, None)
        _, engine = self.loop()
        if kind == "session":
            ahandle: AsyncSession | AsyncConnection = AsyncSession(engine)
        else:
            ahandle = self.run(engine.connect())
        if begin:
            self.run(_begin(ahandle))
        return Tx(self, ahandle, self.run)

    @contextmanager
    def transaction(self, kind: str = "session") -> Iterator[Tx]:
        """A transaction that commits at the end of the block, or rolls back on an error."""
        tx = self.open(kind)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise
        else:
            tx.commit()
        finally:
            tx.close()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The client's ``method`` (awaited in the async flavours)."""
        result = getattr(self.client, method)(*args, **kwargs)
        return self.run(result) if self.is_async else result

    def positions_of(self, refs: Sequence[EntryRef], timeout: float = 0.0) -> list[int | None]:
        if isinstance(self.client, AsyncRoutingQueueClient):
            return self.run(self.client.positions_of(refs, timeout))
        return self.client.positions_of(refs, timeout)

    def close(self) -> None:
        """Dispose of each thread's async engine in its loop, then close the loops."""
        for runner, engine in self._loops:
            runner.run(engine.dispose())
            runner.close()
        self._loops.clear()


async def _begin(handle: AsyncSession | AsyncConnection) -> None:
    await handle.begin()


__all__ = ["FLAVOURS", "App", "Tx", "async_engine", "every_flavour"]
