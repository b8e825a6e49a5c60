"""In-process snapshot providers: the application writes a full sync itself.

A full sync of one client is a *snapshot*, shared by every destination that
asked for it while it could still serve them
(:meth:`~lr_client.store.contract.QueueStore.request_snapshot`): it is
written once and each destination ships it at its own pace. A provider
turns a request into entries of ``LRQ_Send_SnapSync`` and closes it with the
``LAST_FULL_SYNC_ENTRY`` marker; the sender session then ships it. Two kinds
of provider exist: the PySpark job (:mod:`spark_jobs.snapshot_job`) and the
in-process one here, for applications whose state fits a Python loop::

    def provide(ctx: SnapshotContext) -> None:
        with app_engine.connect() as conn:
            for batch in batches(conn.execute(select(policies))):
                if ctx.is_cancelled():
                    return
                ctx.transmit(encode(row) for row in batch)

    runner = SnapshotProviderRunner(engine, "policy", provide)
    runner.run(stop_event)  # or runner.poll_once() from your own loop

Entries are written in chunks, each in its own short transaction, keyed by
``(snapshot_id, part, seq)``: re-writing a chunk replaces it, so a provider
that is retried never duplicates entries. A snapshot that is cancelled, or
that every destination in it left (each superseded by a newer request, or
cancelled for it), while the provider runs makes
the next :meth:`SnapshotContext.transmit` raise
:class:`~lr_client.errors.SnapshotError`; :meth:`SnapshotContext.is_cancelled`
lets a provider stop earlier. Nothing of a cancelled snapshot is ever
delivered, and the runner releases whatever it had written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from sqlalchemy.engine import Engine

from lr_client.encryption import sealer
from lr_client.errors import LRError, SnapshotError, TransientError
from lr_client.keys import Keyring
from lr_client.names import validate_name
from lr_client.records import SnapshotRequest, SnapshotStatus
from lr_client.snapshot_context import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES,
    SnapshotContext,
)
from lr_client.snapshot_heartbeat import HEARTBEAT_INTERVAL_S, SnapshotHeartbeat
from lr_client.store import SnapshotStore, open_store

log = logging.getLogger("lr_client.snapshot")


def wait_for_base(
    store: SnapshotStore,
    snapshot_id: str,
    stop: threading.Event | None = None,
    interval: float = 0.1,
) -> None:
    """Return once this node's data covers the base of a started snapshot, so that its
    source may be read: at once where the node originates the client, at a branch of
    a cascade once its subscriber has delivered the relayed entries through the base
    (docs/cascading.md). Each check keeps the snapshot alive. Raises
    :class:`~lr_client.errors.SnapshotError` if it stops running meanwhile, or ``stop``
    is set."""
    stop = stop or threading.Event()
    while not store.snapshots.snapshot_base_applied(snapshot_id):
        if not store.snapshots.heartbeat_snapshot(snapshot_id):
            raise SnapshotError(f"snapshot {snapshot_id} is no longer running")
        if stop.wait(interval):
            raise SnapshotError(f"snapshot {snapshot_id}: stopped waiting for its base")


#: A provider callback: fill the snapshot through the context.
Provider = Callable[[SnapshotContext], None]


class SnapshotProviderRunner:
    """Runs an in-process provider for every snapshot request of one client.

    Each :meth:`poll_once` takes the REQUESTED snapshots of ``client_name``
    (optionally only those for ``destinations``), starts each one (fixing its
    base position; a request another runner started, or one cancelled
    meanwhile, is skipped), calls ``provider`` with a :class:`SnapshotContext`
    and, when the provider returns without completing it, writes the end
    marker. A provider that raises marks the snapshot FAILED (the sender
    session asks for a new one) and its entries are released; a snapshot
    superseded while its provider ran is left CANCELLED, its entries released.
    While a provider runs, the runner sends heartbeats (every
    ``heartbeat_interval`` seconds): if its process dies, the sender session
    fails the snapshot once it has been silent for ``snapshot_stall_timeout``
    and asks for a new one, which a live runner then takes.

    At a branch of a cascade the provider is called once the node's
    subscriber has delivered the relayed entries through the snapshot's base
    (:meth:`~lr_client.store.contract.SnapshotRequests.snapshot_base_applied`): a
    started snapshot waits for that across polls, kept alive by each one. With
    ``keyring`` and ``source_id`` (the client's origin: this site, or a cascade's
    root) each row is encrypted as it is written, for every key of the keyring.
    """

    def __init__(
        self,
        engine_or_store: Engine | SnapshotStore,
        client_name: str,
        provider: Provider,
        *,
        destinations: Iterable[str] | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_payload_bytes: int = DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES,
        heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
        keyring: Keyring | None = None,
        source_id: str = "",
    ) -> None:
        self.store: SnapshotStore = (
            open_store(engine_or_store)
            if isinstance(engine_or_store, (Engine, str))
            else engine_or_store
        )
        self.client_name = validate_name(client_name, "client name")
        if not callable(provider):
            raise TypeError("provider must be callable with a SnapshotContext")
        self.provider = provider
        self.destinations = (
            None
            if destinations is None
            else frozenset(validate_name(d, "site id") for d in destinations)
        )
        self.chunk_size = chunk_size
        self.max_payload_bytes = max_payload_bytes
        if heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive")
        self.heartbeat_interval = heartbeat_interval
        self.seal = None if keyring is None else sealer(keyring, source_id, self.client_name)
        #: Started snapshots whose base this node's data does not cover yet, by id.
        self._waiting: dict[str, SnapshotRequest] = {}

    def pending(self) -> list[SnapshotRequest]:
        """REQUESTED snapshots this runner would handle, oldest first."""
        wanted = [SnapshotStatus.REQUESTED]
        found = self.store.snapshots.list_snapshots(client_name=self.client_name, statuses=wanted)
        if self.destinations is not None:
            found = [r for r in found if r.destination in self.destinations]
        # A shared snapshot is listed once per destination: handled once.
        return list(reversed(list({r.snapshot_id: r for r in reversed(found)}.values())))

    def poll_once(self, *, raise_errors: bool = True) -> int:
        """Handle every pending request once; return how many snapshots were handled
        (a branch's started snapshot still waiting for its base is not: a later poll is).

        A provider's exception is re-raised (after the snapshot is marked
        FAILED) unless ``raise_errors`` is false, in which case it is logged.
        """
        handled = 0
        for req in self.pending():
            started = self.store.snapshots.start_snapshot(req.snapshot_id)
            if started is not None:  # else another runner took it, or it was cancelled
                self._waiting[started.snapshot_id] = started
        for sid, started in list(self._waiting.items()):
            requests = self.store.snapshots
            if not requests.snapshot_base_applied(sid):
                if not requests.heartbeat_snapshot(sid):  # cancelled or failed meanwhile
                    del self._waiting[sid]
                continue
            del self._waiting[sid]
            handled += 1
            try:
                self.provide(started)
            except Exception:
                if raise_errors:
                    raise
                log.exception("snapshot %s of %s failed", sid, self.client_name)
        return handled

    def provide(self, request: SnapshotRequest) -> SnapshotContext:
        """Run the provider for one RUNNING snapshot; return its context."""
        ctx = SnapshotContext(
            self.store,
            request,
            chunk_size=self.chunk_size,
            max_payload_bytes=self.max_payload_bytes,
            seal=self.seal,
        )
        sid = request.snapshot_id
        try:
            with self.heartbeat(sid):
                self.provider(ctx)
            if not ctx.completed and not ctx.is_cancelled():
                ctx.mark_completed()
        except BaseException as exc:
            if ctx.is_cancelled():
                # Superseded or cancelled while the provider ran: release, not a failure.
                log.info("snapshot %s of %s was cancelled (%r)", sid, self.client_name, exc)
                self._release(sid)
                if isinstance(exc, SnapshotError):
                    return ctx
                raise
            self._fail(sid, f"provider failed: {exc!r}"[:500])
            self._release(sid)
            raise
        if not ctx.completed:
            log.info("snapshot %s of %s was cancelled or superseded", sid, self.client_name)
            self._release(sid)
        else:
            log.info(
                "snapshot %s of %s for %s: %s entries",
                sid,
                self.client_name,
                request.destination,
                ctx.entry_count,
            )
        return ctx

    def heartbeat(self, snapshot_id: str) -> AbstractContextManager[object]:
        """What keeps a snapshot alive while its provider runs (a thread's heartbeats)."""
        return SnapshotHeartbeat(self.store, snapshot_id, self.heartbeat_interval)

    def _fail(self, snapshot_id: str, reason: str) -> None:
        self.store.snapshots.update_snapshot(
            snapshot_id,
            expect=[SnapshotStatus.RUNNING],
            status=SnapshotStatus.FAILED,
            reason=reason,
        )

    def _release(self, snapshot_id: str) -> None:
        """Delete whatever the provider wrote (the request is already closed)."""
        try:
            self.store.snapshots.cancel_snapshot(snapshot_id, "released by the provider runner")
        except LRError:
            log.warning("could not release the entries of snapshot %s", snapshot_id)

    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set.

        Provider failures and transient store errors are logged, not raised.
        """
        while not stop.is_set():
            try:
                self.poll_once(raise_errors=False)
            except TransientError as exc:
                log.warning("snapshot runner of %s: %s", self.client_name, exc)
            stop.wait(interval)


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_SNAPSHOT_PAYLOAD_BYTES",
    "HEARTBEAT_INTERVAL_S",
    "Provider",
    "SnapshotContext",
    "SnapshotHeartbeat",
    "SnapshotProviderRunner",
    "wait_for_base",
]
