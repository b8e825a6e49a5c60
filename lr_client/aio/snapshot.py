"""An async in-process snapshot provider: ``async def provide(ctx)``.

The rules are :class:`~lr_client.snapshot.SnapshotProviderRunner`'s (which
requests it takes, the base, completing, failing, releasing what a cancelled
or failed provider wrote) and the writes are :class:`~lr_client.snapshot.SnapshotContext`'s,
run on the application's ``AsyncEngine`` in SQLAlchemy's greenlet bridge: the
sync runner runs in a greenlet and awaits the provider there
(``await_only``), so the provider's awaits yield to the event loop. While it
runs, a task of the loop sends the snapshot's heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from lr_client.aio.engine import create_async_engine
from lr_client.aio.subscriber import in_greenlet
from lr_client.errors import TransientError
from lr_client.snapshot import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES,
    HEARTBEAT_INTERVAL_S,
    SnapshotContext,
    SnapshotProviderRunner,
)
from lr_client.store import SnapshotStore
from lr_client.store.async_engine import open_async_store

log = logging.getLogger("lr_client.snapshot")


class AsyncSnapshotContext:
    """What an async provider gets: :class:`~lr_client.snapshot.SnapshotContext`'s
    methods, awaited (each write in its own short transaction, as there)."""

    def __init__(self, context: SnapshotContext) -> None:
        self.context = context

    @property
    def snapshot_id(self) -> str:
        """The id every entry of this snapshot is stamped with."""
        return self.context.snapshot_id

    @property
    def destination(self) -> str:
        """The site this snapshot is for (the first of those it serves)."""
        return self.context.destination

    @property
    def client_name(self) -> str:
        """The application stream this snapshot is of."""
        return self.context.client_name

    @property
    def base_position(self) -> int:
        """Send-queue position the snapshot starts from (log entries after it follow)."""
        return self.context.base_position

    @property
    def progress(self) -> int:
        """Entries written so far by this context."""
        return self.context.progress

    async def transmit(
        self,
        payloads: Iterable[bytes | tuple[bytes, bytes | str | None]],
        *,
        part: int | None = None,
    ) -> int:
        """:meth:`SnapshotContext.transmit <lr_client.snapshot.SnapshotContext.transmit>`."""
        written: int = await in_greenlet(lambda: self.context.transmit(payloads, part=part))
        return written

    async def is_cancelled(self) -> bool:
        """Whether the request was cancelled or superseded (asks the database)."""
        return await in_greenlet(self.context.is_cancelled)

    async def mark_completed(self) -> int:
        """Write the end marker; the entry count."""
        return await in_greenlet(self.context.mark_completed)

    async def cancel(self, reason: str = "cancelled by the provider") -> None:
        """Give up this snapshot: cancel the request and release its entries."""
        await in_greenlet(self.context.cancel, reason)


#: An async provider: fill the snapshot through the context.
AsyncProvider = Callable[[AsyncSnapshotContext], Awaitable[None]]


class _LoopHeartbeat:
    """The heartbeats of a snapshot from a task of the running loop (entered in a greenlet
    of it), cancelled and awaited at the end of the block."""

    def __init__(self, store: SnapshotStore, snapshot_id: str, interval: float) -> None:
        self.store, self.snapshot_id, self.interval = store, snapshot_id, interval
        self.task: asyncio.Task[None] | None = None

    async def beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if not await in_greenlet(self.store.snapshots.heartbeat_snapshot, self.snapshot_id):
                    return  # completed, cancelled or failed
            except Exception:  # a missed beat is retried
                log.warning("snapshot %s: heartbeat failed", self.snapshot_id, exc_info=True)

    def __enter__(self) -> _LoopHeartbeat:
        self.task = asyncio.get_running_loop().create_task(self.beat())
        return self

    def __exit__(self, *exc: object) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await_only(asyncio.gather(task, return_exceptions=True))


class _InLoop(SnapshotProviderRunner):
    """The sync runner, run in a greenlet of the loop: awaits the async provider."""

    def __init__(
        self, store: SnapshotStore, client_name: str, provider: AsyncProvider, **kwargs: Any
    ) -> None:
        self.async_provider = provider
        super().__init__(store, client_name, self.call_provider, **kwargs)

    def call_provider(self, ctx: SnapshotContext) -> None:
        await_only(self.async_provider(AsyncSnapshotContext(ctx)))

    def heartbeat(self, snapshot_id: str) -> AbstractContextManager[object]:
        return _LoopHeartbeat(self.store, snapshot_id, self.heartbeat_interval)


class AsyncSnapshotProviderRunner:
    """Runs an async provider (``async def provide(ctx)``) for every snapshot request of
    one client, in the application's event loop; the rules of
    :class:`~lr_client.snapshot.SnapshotProviderRunner` (``engine``: an ``AsyncEngine``,
    or a URL, whose engine :meth:`close` disposes of)."""

    def __init__(
        self,
        engine: AsyncEngine | str,
        client_name: str,
        provider: AsyncProvider,
        *,
        destinations: Iterable[str] | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_payload_bytes: int = DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES,
        heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        if not callable(provider):
            raise TypeError("provider must be an async callable taking an AsyncSnapshotContext")
        self._owned = isinstance(engine, str)
        self.engine = create_async_engine(engine) if isinstance(engine, str) else engine
        self.runner = _InLoop(
            open_async_store(self.engine),
            client_name,
            provider,
            destinations=destinations,
            chunk_size=chunk_size,
            max_payload_bytes=max_payload_bytes,
            heartbeat_interval=heartbeat_interval,
        )

    async def poll_once(self, *, raise_errors: bool = True) -> int:
        """Handle every pending request once; how many snapshots were handled (see
        :meth:`~lr_client.snapshot.SnapshotProviderRunner.poll_once`)."""
        handled: int = await in_greenlet(lambda: self.runner.poll_once(raise_errors=raise_errors))
        return handled

    async def run(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set; provider failures and
        transient store errors are logged, not raised."""
        while not stop.is_set():
            try:
                await self.poll_once(raise_errors=False)
            except TransientError as exc:
                log.warning("snapshot runner of %s: %s", self.runner.client_name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def close(self) -> None:
        """Dispose of the engine if this runner made it from a URL."""
        if self._owned:
            await self.engine.dispose()


__all__ = ["AsyncProvider", "AsyncSnapshotContext", "AsyncSnapshotProviderRunner"]
