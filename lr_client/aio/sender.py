"""The sender API for asyncio applications: transmit inside an ``AsyncSession``.

The rules and each operation are :mod:`lr_client.sending`'s, the same as the
sync :class:`~lr_client.sender.RoutingQueueClient`'s; this client drives their
steps from the event loop (:func:`run_steps`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from lr_client.aio.engine import sync_url
from lr_client.errors import InvalidSessionError
from lr_client.keys import Keyring
from lr_client.records import EntryRef, LRMessageWithDestinations, SnapshotStatus
from lr_client.sender import SenderSettings
from lr_client.sending import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Backpressure,
    SenderRules,
    TransmitStore,
)
from lr_client.snapshot_status import SnapshotInfo
from lr_client.steps import Blocking, InTransaction, Steps
from lr_client.store import open_store
from lr_client.store.schema.lifecycle import SchemaStatus

T = TypeVar("T")


async def run_steps(steps: Steps[T], conn: AsyncSession | AsyncConnection | None = None) -> T:
    """Drive an operation's steps (:mod:`lr_client.sending`) without blocking the loop.

    - :class:`~lr_client.steps.InTransaction` (the append, a snapshot request
      in the caller's transaction) runs on ``conn`` through its ``run_sync``
      (``AsyncConnection``'s, or ``AsyncSession``'s with the session's
      connection): SQLAlchemy's greenlet bridge hands the store a sync
      ``Connection`` on the same DBAPI connection and transaction, so the
      store's SQL runs unchanged, in the application's transaction, with no
      round trip of its own.
    - :class:`~lr_client.steps.Blocking` (a reading of the client's own store:
      flow state, cascade route, registered sites; a snapshot request or a
      read of positions in a transaction of the store's own) runs in a worker
      thread (``asyncio.to_thread``), on the store's sync engine. Not on the
      application's connection: these readings are the client's, cached and
      shared by every task using it (one read serves them all, at most every
      ``flow_check_interval``); through the application's connection they would
      join its transaction (its snapshot, its locks, a statement in the middle
      of its work) and need a connection from its pool. They are rare: a
      transmit whose readings are cached and fresh yields none.
    - a pause (backpressure in ``"wait"`` mode, a poll for positions) is an
      ``asyncio.sleep``: other tasks run meanwhile.
    """
    try:
        step = next(steps)
        while True:
            if isinstance(step, InTransaction):
                if conn is None:
                    raise AssertionError("an operation with no connection wrote in one")
                result: Any = await _in_transaction(conn, step.call)
            elif isinstance(step, Blocking):
                result = await asyncio.to_thread(step.call)
            else:
                await asyncio.sleep(step)
                result = None
            step = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        steps.close()


async def _in_transaction(
    conn: AsyncSession | AsyncConnection, call: Callable[[Connection], T]
) -> T:
    if isinstance(conn, AsyncConnection):
        return await conn.run_sync(call)
    # One greenlet for the session's connection and the call.
    return await conn.run_sync(lambda session: call(session.connection()))


def _checked(session: object) -> AsyncSession | AsyncConnection:
    if isinstance(session, (AsyncSession, AsyncConnection)):
        return session
    raise InvalidSessionError(
        f"expected a SQLAlchemy AsyncSession or AsyncConnection, got {type(session).__name__}"
    )


class AsyncRoutingQueueClient(SenderSettings):
    """Transmits payloads to remote sites, atomically with an asyncio application's writes.

    The async twin of :class:`~lr_client.sender.RoutingQueueClient`, with the
    same settings, rules and errors: ``await client.transmit_log_entry_message(
    session, payload, destinations)`` takes an ``AsyncSession`` or
    ``AsyncConnection`` (aiosqlite, psycopg's async driver or asyncpg) and
    writes in its transaction: nothing is sent unless it commits, bad input
    raises its typed error before anything is written, and entries are given
    positions in commit order (I1).

    ``store`` is the client's own bookkeeping (registered sites, flow state,
    cascade route, snapshot requests): a sync engine or URL of the same
    database, or a store. :meth:`from_async_engine` opens one from the
    application's async engine. A client that opened its store closes it in
    :meth:`close` (or ``async with``).
    """

    def __init__(
        self,
        store: Engine | str | TransmitStore,
        source_id: str,
        client_name: str,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        backpressure: Backpressure | str = Backpressure.RAISE,
        backpressure_timeout: float = 30.0,
        flow_check_interval: float = 0.25,
        keyring: Keyring | None = None,
    ) -> None:
        self._owns_store = isinstance(store, str)
        self.store = open_store(store) if isinstance(store, (Engine, str)) else store
        self.rules = SenderRules(
            self.store,
            source_id,
            client_name,
            max_payload_bytes=max_payload_bytes,
            backpressure=backpressure,
            backpressure_timeout=backpressure_timeout,
            flow_check_interval=flow_check_interval,
            keyring=keyring,
        )

    @classmethod
    def from_async_engine(
        cls, engine: AsyncEngine, source_id: str, client_name: str, **settings: Any
    ) -> Self:
        """A client whose store is a sync engine of ``engine``'s database (its own,
        closed by :meth:`close`); ``settings`` as for the constructor.

        The URL is ``engine``'s with the sync driver (:func:`~lr_client.aio.engine.sync_url`):
        settings passed in ``connect_args`` are not carried over.
        """
        url = sync_url(engine.url).render_as_string(hide_password=False)
        return cls(url, source_id, client_name, **settings)

    async def close(self) -> None:
        """Close the store's connections if this client opened it."""
        if self._owns_store:
            await asyncio.to_thread(self.store.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def create_schema(self) -> SchemaStatus:
        """Create or upgrade the queue store's tables (what ``lr init-db`` does); idempotent."""
        return await asyncio.to_thread(self.store.create_schema)

    async def register_destinations(self, destinations: Iterable[str]) -> None:
        """Register sites this client may send to."""
        await asyncio.to_thread(self.store.sites.register_sites, list(destinations))

    # -- transmit ----------------------------------------------------------------------
    async def transmit_log_entry_message(
        self,
        session: AsyncSession | AsyncConnection,
        payload: bytes,
        destinations: Sequence[str],
        key: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> EntryRef:
        """Queue one payload for ``destinations`` in the caller's transaction.

        As :meth:`RoutingQueueClient.transmit_log_entry_message
        <lr_client.sender.RoutingQueueClient.transmit_log_entry_message>`.
        """
        conn = _checked(session)
        return await run_steps(self.rules.transmit(payload, destinations, key, headers), conn)

    async def transmit_log_entry_messages(
        self,
        session: AsyncSession | AsyncConnection,
        messages: Sequence[LRMessageWithDestinations],
    ) -> list[EntryRef]:
        """Queue several payloads in the caller's transaction; all or none are valid."""
        conn = _checked(session)
        return await run_steps(self.rules.transmit_many(messages), conn)

    async def positions_of(
        self, refs: Sequence[EntryRef], timeout: float = 0.0
    ) -> list[int | None]:
        """The positions of transmitted entries, waiting up to ``timeout`` s for all.

        As :meth:`RoutingQueueClient.positions_of
        <lr_client.sender.RoutingQueueClient.positions_of>`.
        """
        return await run_steps(self.rules.positions(refs, timeout))

    async def request_snapshot_sync(
        self,
        destination: str,
        session: AsyncSession | AsyncConnection | None = None,
        *,
        reason: str = "application",
    ) -> str:
        """Ask for a full sync of this client to ``destination``; return the snapshot id.

        With ``session`` the request is written in the caller's transaction (it
        exists only if that commits); without, in its own. As
        :meth:`RoutingQueueClient.request_snapshot_sync
        <lr_client.sender.RoutingQueueClient.request_snapshot_sync>`.
        """
        conn = None if session is None else _checked(session)
        steps = self.rules.request_snapshot(destination, conn is not None, reason)
        return await run_steps(steps, conn)

    async def snapshots(
        self,
        destination: str | None = None,
        states: Iterable[SnapshotStatus | str] | None = None,
    ) -> list[SnapshotInfo]:
        """This client's full syncs, newest first (as the sync client's ``snapshots``)."""
        return await run_steps(self.rules.snapshots(destination, states))

    async def snapshot(
        self, snapshot_id: str, destination: str | None = None
    ) -> SnapshotInfo | None:
        """One full sync of this client by id (as the sync client's ``snapshot``)."""
        return await run_steps(self.rules.snapshot(snapshot_id, destination))


__all__ = ["AsyncRoutingQueueClient", "run_steps"]
