"""The sender session: one replication stream from this site to one destination.

Per client it either ships log entries tagged ``lrq_logentry_<dest>`` after its
cursor, or a full snapshot (``LRQ_Send_SnapSync``) followed by log entries
from the snapshot's base position. Batches are bounded in entries and bytes;
at most ``window_batches`` / ``window_bytes`` are unacknowledged at once; the
cursor is persisted only when the sink acknowledges. Connection loss:
reconnect with exponential backoff and jitter until the session is stopped,
renegotiate, resume exactly where the sink stopped.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import LRError, TransportError
from lr_client.records import (
    DropRecord,
    ReplicationType,
    SendEntry,
    SinkSnapshotState,
    SnapshotRequest,
    SnapshotStatus,
    StreamStop,
)
from lr_client.store import Inspection, Retention, Shipping, Snapshots
from lr_server import metrics, protocol
from lr_server.config import ClientConfig, ReplicationConfig, RetryConfig
from lr_server.fanout import LogFanout
from lr_server.negotiation import Action, decide
from lr_server.status import head_position as assigned_head
from lr_server.transport.base import BatchStream, Transport

log = logging.getLogger("lr.session")

SnapshotLauncher = Callable[[SnapshotRequest, ClientConfig], None]


class Mode(enum.StrEnum):
    LOG = "log_entry_sync"
    SNAPSHOT = "snapshot_sync"  # waiting for or shipping a snapshot
    STOPPED = "stream_stopped"  # the sink lacks entries the source no longer holds; no provider


@dataclass(frozen=True)
class Notice:
    """A drop notice to send before anything else of the stream."""

    notice_id: str
    first_dropped_position: int
    reason: str


@dataclass
class ClientStream:
    config: ClientConfig
    mode: Mode = Mode.LOG
    sent: int = 0  # last log position sent on this connection
    snapshot: SnapshotRequest | None = None
    snap_sent: int = 0  # last snapshot ordinal sent
    snap_done_sent: bool = False
    retry_at: float = 0.0  # when a failed snapshot may be asked for again
    partial_batch: int = 0  # id of the last log batch sent that was not full
    notice: Notice | None = None  # sent before the stream's next batch
    stop_reason: str = ""


@dataclass
class InFlight:
    batch_id: int
    client: str
    kind: int
    last_position: int
    entries: int
    nbytes: int
    sent_at: float
    snapshot_id: str = ""
    is_end: bool = False


class SessionStore(Shipping, Snapshots, Retention, Inspection, Protocol):
    """What a sender session needs of the store: reads and cursors, snapshots, the
    records of dropped and stopped streams, and its status row."""


class SenderSession:
    """Replicates every configured client of this site to one destination."""

    def __init__(
        self,
        store: SessionStore,
        source_id: str,
        destination: str,
        clients: list[ClientConfig],
        transport_factory: Callable[[], Transport],
        replication: ReplicationConfig | None = None,
        retry: RetryConfig | None = None,
        snapshot_launcher: SnapshotLauncher | None = None,
        reader: LogFanout | None = None,
    ) -> None:
        self.store = store
        self.reader = reader
        self.source_id = source_id
        self.destination = destination
        self.clients = {c.name: c for c in clients}
        self.transport_factory = transport_factory
        self.cfg = replication or ReplicationConfig()
        self.retry = retry or RetryConfig()
        self.launcher = snapshot_launcher
        self.state = "starting"
        self.connected = False
        self.last_error = ""
        self._launched: set[str] = set()
        self._inflight: deque[InFlight] = deque()
        self._pending_cursors: dict[str, int] = {}
        self._cursor_flushed = 0.0
        self._batch_id = 0
        self._notices = False  # the sink accepts drop notices
        self._stopped = ""  # why streams are stopped, for the session status
        self._log = logging.LoggerAdapter(log, {"destination": destination})

    # -- the loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Replicate until ``stop`` is set; never raises for transient trouble."""
        while not stop.is_set():
            transport: Transport | None = None
            try:
                transport, stream, streams = self._connect(stop)
                if stream is None:
                    break
                try:
                    self._pump(stop, stream, streams)
                finally:
                    stream.close()
            except LRError as exc:
                self._failed(exc)
                stop.wait(self.retry.initial_backoff)
            except Exception as exc:  # a bug or the database: log, back off, go on
                self._log.exception("session to %s failed", self.destination)
                self._failed(exc)
                stop.wait(self.retry.max_backoff)
            finally:
                self._inflight.clear()
                self._pending_cursors.clear()
                self.connected = False
                metrics.INFLIGHT_BATCHES.labels(self.destination).set(0)
                if transport is not None:
                    transport.close()
        self.state = "stopped"
        self._save_status()

    def _failed(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.state = "reconnecting"
        metrics.ERRORS.labels(type(exc).__name__).inc()
        self._log.warning("session %s -> %s: %s", self.source_id, self.destination, self.last_error)
        self._save_status()

    def _connect(
        self, stop: threading.Event
    ) -> tuple[Transport | None, BatchStream | None, dict[str, ClientStream]]:
        retrying = Retrying(
            retry=retry_if_exception_type(LRError),
            wait=wait_exponential(multiplier=self.retry.initial_backoff, max=self.retry.max_backoff)
            + wait_random(0, self.retry.jitter),
            stop=stop_when_event_set(stop),
            sleep=stop.wait,  # type: ignore[arg-type]  # returns early on stop
            before_sleep=lambda rs: (
                self._failed(rs.outcome.exception())  # type: ignore[arg-type]
                if rs.outcome
                else None
            ),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    transport = self.transport_factory()
                    try:
                        request = pb.NegotiateRequest(
                            source_id=self.source_id,
                            clients=sorted(self.clients),
                            protocol_version=protocol.PROTOCOL_VERSION,
                        )
                        response = transport.negotiate(request, timeout=10.0)
                        streams = self._plan(response)
                        stream = transport.open_stream()
                    except BaseException:
                        transport.close()
                        raise
                    self.connected = True
                    self.last_error = ""
                    self.state = "connected"
                    self._log.info("connected to %s", self.destination)
                    return transport, stream, streams
        except LRError:
            if stop.is_set():
                return None, None, {}
            raise
        return None, None, {}

    # -- negotiation ----------------------------------------------------------------------------
    def _plan(self, response: pb.NegotiateResponse) -> dict[str, ClientStream]:
        """Decide, per client, where to resume (Corfu's negotiation rules)."""
        protocol.require_compatible(response.protocol_version, f"sink {self.destination!r}")
        states = {c.client_name: c for c in response.clients}
        self._notices = bool(response.drop_notices)
        drop_records = {
            d.client_name: d for d in self.store.list_drops() if d.destination == self.destination
        }
        drops = set(drop_records)
        streams: dict[str, ClientStream] = {}
        for name, config in self.clients.items():
            cs = states.get(name, pb.ClientState(client_name=name))
            cursor = self.store.get_cursor(self.destination, name)
            has_provider = config.snapshot != "none"
            open_req = self._open_snapshot(name)
            if open_req is not None and not has_provider:
                self._refuse(open_req)
                open_req = None
            stream = ClientStream(config)
            stop = self.store.get_stream_stop(self.destination, name)
            if stop is not None and has_provider:
                # A provider was configured since: the loss becomes a full sync below.
                self.store.clear_stream_stop(self.destination, name)
                metrics.STREAM_STOPPED.labels(self.destination, name).set(0)
                stop = None
            if stop is not None and stop.accepted_at is not None and stop.resumed_at is None:
                self._resume_accepted(stream, stop)
                streams[name] = stream
                continue
            reason = ""
            if (
                open_req is not None
                and open_req.status is SnapshotStatus.READY
                and int(cs.snapshot_state) == SinkSnapshotState.COMPLETED
                and cs.snapshot_id == open_req.snapshot_id
            ):
                # The sink has the whole snapshot; only its acknowledgement was lost.
                self._finish_snapshot(name, open_req)
                self.store.set_cursor(self.destination, name, cs.last_position)
                open_req = None
                cursor = self.store.get_cursor(self.destination, name)
                drops.discard(name)
                drop_records.pop(name, None)
            if int(cs.snapshot_state) == SinkSnapshotState.ONGOING:
                if (
                    open_req
                    and open_req.snapshot_id == cs.snapshot_id
                    and open_req.status is SnapshotStatus.READY
                ):
                    stream.snap_sent = cs.snapshot_position  # resume the transfer
                elif not open_req:
                    reason = "interrupted snapshot"
            elif cursor.needs_snapshot or name in drops:
                reason = "dropped for falling behind"
            elif (
                int(cs.snapshot_state) == SinkSnapshotState.NONE
                and cs.last_position == 0
                and has_provider
            ):
                reason = "first contact"
            elif not open_req:
                if cs.last_position < cursor.position:
                    # Lower the cursor first: a trim from now on keeps what the
                    # replay needs, and the trim mark read next covers any before.
                    self.store.set_cursor(self.destination, name, cs.last_position)
                decision = decide(
                    cs.last_position,
                    cursor.position,
                    self.store.trimmed_through(self.destination, name),
                    # The highest position assigned, read without waiting for
                    # transmitters: the sink can never be past it.
                    assigned_head(self.store),
                    has_provider,
                    _accepted(stop),
                )
                if decision.action is Action.FULL_SYNC:
                    reason = decision.reason
                    drop = self.store.drop_stream(
                        self.destination, name, reason, decision.first_missing
                    )
                    if drop is not None:
                        drop_records[name] = drop
                elif decision.action is Action.STOP:
                    self._stop(stream, decision.reason, decision.resume_after)
                    streams[name] = stream
                    continue
            if stop is not None and stop.is_stopped and not reason and not open_req:
                # Stopped before, and the sink now holds what it needs (restored again?).
                self.store.clear_stream_stop(self.destination, name)
                metrics.STREAM_STOPPED.labels(self.destination, name).set(0)
                self._log.info("%s/%s: no longer stopped: %s", self.destination, name, stop.reason)
            if open_req or reason:
                if not has_provider:
                    drop_rec = drop_records.get(name)
                    after = cs.last_position
                    if drop_rec is not None:
                        after = min(after, drop_rec.first_dropped_position - 1)
                    self._stop(stream, f"needs a full sync ({reason})", after)
                else:
                    stream.mode = Mode.SNAPSHOT
                    if not open_req:
                        sid = self.store.request_snapshot(None, self.destination, name, reason)
                        open_req = self.store.get_snapshot(sid)
                        self._log.info(
                            "%s/%s: full sync %s (%s)", self.destination, name, sid, reason
                        )
                    stream.snapshot = open_req
                    if stream.snap_sent == 0:
                        stream.notice = self._drop_notice(drop_records.get(name))
            else:
                stream.sent = cs.last_position
                if cs.last_position > cursor.position:
                    self.store.set_cursor(self.destination, name, cs.last_position)
            streams[name] = stream
        return streams

    # -- losses, stops and drop notices -------------------------------------------------------
    def _refuse(self, req: SnapshotRequest) -> None:
        """Cancel a full-sync request of a client that has no snapshot provider."""
        reason = (
            f'client {req.client_name} has no snapshot provider (snapshot = "none"): '
            "log entries go on"
        )
        if self.store.cancel_snapshot(req.snapshot_id, reason):
            self._log.warning(
                "%s/%s: snapshot %s cancelled: %s",
                self.destination,
                req.client_name,
                req.snapshot_id,
                reason,
            )

    def _stop(self, cs: ClientStream, reason: str, resume_after: int) -> None:
        """Stop a stream whose sink lacks entries the source no longer holds."""
        name = cs.config.name
        cs.mode, cs.snapshot, cs.notice = Mode.STOPPED, None, None
        cs.stop_reason = f"{name}: {reason}"
        metrics.STREAM_STOPPED.labels(self.destination, name).set(1)
        if self.store.stop_stream(self.destination, name, reason, resume_after):
            self._log.error(
                "%s/%s stopped: %s. The client has no snapshot provider: configure one and "
                "restart the server (a full sync follows), or accept the loss with "
                "`lr accept-loss` (log entries then resume after %d)",
                self.destination,
                name,
                reason,
                resume_after,
            )

    def _resume_accepted(self, cs: ClientStream, stop: StreamStop) -> None:
        """An operator accepted the loss: notify the sink, then ship after ``resume_after``."""
        assert stop.accepted_at is not None
        name = cs.config.name
        cs.mode, cs.sent, cs.stop_reason = Mode.LOG, stop.resume_after, ""
        self._log.warning(
            "%s/%s: loss accepted by an operator; log entries resume after %d (%s)",
            self.destination,
            name,
            stop.resume_after,
            stop.reason,
        )
        if self._notices:
            cs.notice = Notice(
                f"a{int(stop.accepted_at * 1e6)}",
                stop.resume_after + 1,
                f"loss accepted by an operator: {stop.reason}",
            )
        else:  # the sink cannot be told; nothing to wait for
            self._resumed(name, stop.resume_after)

    def _resumed(self, name: str, resume_after: int) -> None:
        self.store.clear_drop(self.destination, name)
        self.store.set_cursor(self.destination, name, resume_after, needs_snapshot=False)
        self.store.mark_stream_resumed(self.destination, name)
        metrics.STREAM_STOPPED.labels(self.destination, name).set(0)

    def _drop_notice(self, drop: DropRecord | None) -> Notice | None:
        """The notice that precedes the full sync of a dropped stream (if the sink takes it)."""
        if drop is None or not self._notices:
            return None
        return Notice(
            f"d{int(drop.dropped_at * 1e6)}", drop.first_dropped_position, drop.reason or "dropped"
        )

    def _send_notice(self, stream: BatchStream, name: str, cs: ClientStream) -> bool:
        notice = cs.notice
        assert notice is not None
        cs.notice = None
        entry = pb.RoutingTableEntryMsg(
            type=ReplicationType.STREAM_DROPPED.name,
            opaque_payload=notice.reason.encode(),
            position=notice.first_dropped_position,
            snapshot_id=notice.notice_id,
            client_name=name,
        )
        batch = pb.ReplicationBatch(
            batch_id=self._next_batch_id(),
            source_id=self.source_id,
            client_name=name,
            kind=pb.BATCH_DROP_NOTICE,
            snapshot_id=notice.notice_id,
            first_position=notice.first_dropped_position,
            last_position=notice.first_dropped_position,
            entries=[entry],
        )
        self._inflight.append(
            InFlight(
                batch.batch_id,
                name,
                batch.kind,
                notice.first_dropped_position,
                0,
                0,
                time.monotonic(),
                notice.notice_id,
            )
        )
        stream.send(batch)
        return True

    def _open_snapshot(self, client: str) -> SnapshotRequest | None:
        found = self.store.list_snapshots(
            self.destination,
            client,
            [SnapshotStatus.REQUESTED, SnapshotStatus.RUNNING, SnapshotStatus.READY],
        )
        return found[0] if found else None

    # -- pumping ----------------------------------------------------------------------------------
    def _pump(
        self, stop: threading.Event, stream: BatchStream, streams: dict[str, ClientStream]
    ) -> None:
        last_status = last_check = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now - last_check > 0.5:
                self._check_requests(streams)
                last_check = now
            sent_any = self._ship(stream, streams)
            timeout = 0.0 if sent_any and not self._window_full() else self.cfg.poll_interval
            self._drain_acks(stream, streams, timeout)
            if self._inflight and now - self._inflight[0].sent_at > self.cfg.stream_idle_timeout:
                raise TransportError("no acknowledgement within stream_idle_timeout")
            if now - last_status > 1.0:
                self.state = self._summary(streams)
                self._save_status()
                last_status = now
        # Clean shutdown: give in-flight batches a moment to be acknowledged.
        deadline = time.monotonic() + 5.0
        while self._inflight and time.monotonic() < deadline:
            self._drain_acks(stream, streams, 0.1)
        self._flush_cursors()

    def _ship(self, stream: BatchStream, streams: dict[str, ClientStream]) -> bool:
        """One round over the clients: send what each may send now; whether any went.

        Log entries are read first, then the open snapshot requests of the
        clients read for are looked up in one query, and only then are the
        entries sent, cut at an open snapshot's base: see :meth:`_ship_log`.
        """
        sent_any = False
        reads: dict[str, list[SendEntry]] = {}
        batches = nbytes = 0  # what the reads will add to the window
        for name, cs in streams.items():
            if self._window_full(batches, nbytes):
                break
            if cs.notice is not None:  # a drop notice goes before anything else
                sent_any |= self._send_notice(stream, name, cs)
            elif cs.mode is Mode.LOG:
                entries = self._read_log(name, cs)
                if entries:
                    reads[name] = entries
                    batches += 1
                    nbytes += sum(len(e.payload) for e in entries)
            elif cs.mode is Mode.SNAPSHOT:
                sent_any |= self._send_snapshot(stream, name, cs)
        if reads:
            requests = self.store.open_snapshots(self.destination, list(reads))
            drops = {d.client_name: d for d in self.store.list_drops(self.destination)}
            for name, entries in reads.items():
                cs, request = streams[name], requests.get(name)
                if request is not None and cs.config.snapshot == "none":
                    self._refuse(request)  # a client without a provider keeps its log entries
                    request = None
                if name in drops:
                    # Dropped: nothing more past the hole before the notice and the full
                    # sync (or the stop) that ``_check_requests`` arranges.
                    entries = []
                    if request is None:
                        continue
                sent_any |= self._ship_log(stream, name, cs, entries, request, drops.get(name))
        return sent_any

    def _window_full(self, batches: int = 0, nbytes: int = 0) -> bool:
        """Whether the window is full, counting ``batches`` / ``nbytes`` about to be sent."""
        return len(self._inflight) + batches >= self.cfg.window_batches or (
            sum(f.nbytes for f in self._inflight) + nbytes >= self.cfg.window_bytes
        )

    def _next_batch_id(self) -> int:
        self._batch_id += 1
        return self._batch_id

    def _read_log(self, name: str, cs: ClientStream) -> list[SendEntry]:
        """The client's next batch of log entries (not sent yet: see :meth:`_ship_log`)."""
        if cs.partial_batch and self._inflight and self._inflight[0].batch_id <= cs.partial_batch:
            # Caught up: while a partial batch is in flight, let new entries gather
            # into the next batch rather than paying a sink transaction per trickle.
            return []
        read = self.reader.read if self.reader is not None else self.store.read_log_entries
        return read(
            self.destination,
            name,
            cs.sent,
            self.cfg.batch_max_entries,
            max_bytes=self.cfg.batch_max_bytes,
        )

    def _ship_log(
        self,
        stream: BatchStream,
        name: str,
        cs: ClientStream,
        entries: list[SendEntry],
        request: SnapshotRequest | None,
        drop: DropRecord | None = None,
    ) -> bool:
        """Send entries read before ``request`` (the client's open snapshot) was looked up.

        No log entry past a snapshot's base may reach the sink before the
        snapshot: the sink would deliver it, then again after the snapshot.
        With no open request, every entry read is sent: a request made later
        gets a base at or after every position committed before the lookup,
        so at or after every entry read (see docs/architecture.md). A request
        without a base yet stops log entries at once; one with a base lets
        through the entries up to it. Either way the stream turns to the
        snapshot, and log entries resume after its base once it is shipped.
        """
        if request is not None:
            base = request.base_position
            entries = [] if base is None else [e for e in entries if e.position <= base]
        if entries:
            batch = pb.ReplicationBatch(
                batch_id=self._next_batch_id(),
                source_id=self.source_id,
                client_name=name,
                kind=pb.BATCH_LOG_ENTRY,
                first_position=entries[0].position,
                last_position=entries[-1].position,
                previous_position=cs.sent,
                entries=[_wire(e) for e in entries],
            )
            self._send(stream, batch, name, entries)
            cs.sent = entries[-1].position
            cs.partial_batch = batch.batch_id if len(entries) < self.cfg.batch_max_entries else 0
        if request is None:
            return bool(entries)
        # Log batches already in flight reach the sink before the snapshot's, and
        # their acks never move the cursor past its base.
        self._log.info(
            "%s/%s: log entries stop at %d for full sync %s",
            self.destination,
            name,
            cs.sent,
            request.snapshot_id,
        )
        cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent = Mode.SNAPSHOT, request, 0, False
        cs.notice = self._drop_notice(drop)  # the listener learns of a drop before its full sync
        if request.status is SnapshotStatus.REQUESTED:
            self._launch(request, cs.config)
        return True

    def _send_snapshot(self, stream: BatchStream, name: str, cs: ClientStream) -> bool:
        req = cs.snapshot
        if req is None or cs.snap_done_sent:
            return False
        if req.status is not SnapshotStatus.READY:
            return False
        entries = self.store.read_snapshot_entries(
            req.snapshot_id, cs.snap_sent, self.cfg.batch_max_entries, self.cfg.batch_max_bytes
        )
        if not entries:
            return False
        wire = []
        for e in entries:
            msg = _wire(e)
            if e.type is ReplicationType.LAST_FULL_SYNC_ENTRY:
                msg.snapshot_count = req.entry_count or 0
                msg.base_position = req.base_position or 0
                cs.snap_done_sent = True
            wire.append(msg)
        batch = pb.ReplicationBatch(
            batch_id=self._next_batch_id(),
            source_id=self.source_id,
            client_name=name,
            kind=pb.BATCH_SNAPSHOT,
            snapshot_id=req.snapshot_id,
            first_position=entries[0].position,
            last_position=entries[-1].position,
            previous_position=cs.snap_sent,
            entries=wire,
        )
        self._send(stream, batch, name, entries, cs.snap_done_sent)
        cs.snap_sent = entries[-1].position
        return True

    def _send(
        self,
        stream: BatchStream,
        batch: pb.ReplicationBatch,
        name: str,
        entries: list[SendEntry],
        is_end: bool = False,
    ) -> None:
        self._inflight.append(
            InFlight(
                batch.batch_id,
                name,
                batch.kind,
                batch.last_position,
                len(entries),
                sum(len(e.payload) for e in entries),
                time.monotonic(),
                batch.snapshot_id,
                is_end,
            )
        )
        metrics.INFLIGHT_BATCHES.labels(self.destination).set(len(self._inflight))
        stream.send(batch)

    def _drain_acks(
        self, stream: BatchStream, streams: dict[str, ClientStream], timeout: float
    ) -> None:
        ack = stream.next_ack(timeout)
        while ack is not None:
            self._on_ack(ack, streams)
            ack = stream.next_ack(0.0)

    def _on_ack(self, ack: pb.ReplicationAck, streams: dict[str, ClientStream]) -> None:
        done: list[InFlight] = []
        while self._inflight and self._inflight[0].batch_id <= ack.batch_id:
            done.append(self._inflight.popleft())
        now = time.monotonic()
        log_cursors: dict[str, int] = {}
        for f in done:
            metrics.BATCH_LATENCY.labels(self.destination).observe(now - f.sent_at)
            metrics.BATCHES_ACKED.labels(self.destination).inc()
            metrics.ENTRIES_SHIPPED.labels(self.destination, f.client).inc(f.entries)
            metrics.BYTES_SHIPPED.labels(self.destination, f.client).inc(f.nbytes)
            if f.kind == pb.BATCH_LOG_ENTRY:
                log_cursors[f.client] = f.last_position
            elif f.kind == pb.BATCH_DROP_NOTICE:
                if f.snapshot_id.startswith("a"):  # an accepted loss: the stream runs again
                    self._resumed(f.client, f.last_position - 1)
            elif f.is_end:
                # Log acks from before the snapshot must not move the cursor past its base.
                log_cursors.pop(f.client, None)
                self._pending_cursors.pop(f.client, None)
                current = streams[f.client].snapshot
                if current is not None and current.snapshot_id == f.snapshot_id:
                    self._snapshot_done(f, streams[f.client])
                else:  # superseded while its end was in flight: the newer one goes on
                    self._log.info(
                        "%s/%s: end of superseded full sync %s acknowledged",
                        self.destination,
                        f.client,
                        f.snapshot_id,
                    )
            else:
                metrics.SNAPSHOT_ROWS.labels(self.destination, f.client).set(f.last_position)
                self.store.update_snapshot(
                    f.snapshot_id, expect=[SnapshotStatus.READY], shipped_position=f.last_position
                )
        self._pending_cursors.update(log_cursors)
        # Cursor writes are coalesced: a cursor persisted late only delays trim
        # (the sink skips what it already has), while a write per ack would
        # compete with the application's transactions for the database.
        if self._pending_cursors and (not self._inflight or now - self._cursor_flushed > 0.1):
            self._flush_cursors()
        metrics.INFLIGHT_BATCHES.labels(self.destination).set(len(self._inflight))

    def _flush_cursors(self) -> None:
        for client, position in self._pending_cursors.items():
            self.store.set_cursor(self.destination, client, position)
        self._pending_cursors.clear()
        self._cursor_flushed = time.monotonic()

    def _finish_snapshot(self, client: str, req: SnapshotRequest) -> None:
        """The sink has every entry of ``req``: log entries resume after its base."""
        self.store.complete_snapshot(req.snapshot_id)
        self.store.set_cursor(
            self.destination, client, req.base_position or 0, needs_snapshot=False
        )
        self.store.clear_drop(self.destination, client)

    def _snapshot_done(self, f: InFlight, cs: ClientStream) -> None:
        req = cs.snapshot
        assert req is not None
        base = req.base_position or 0
        self._finish_snapshot(f.client, req)
        self._log.info(
            "%s/%s: full sync %s complete (%s entries); log entries resume after %d",
            self.destination,
            f.client,
            req.snapshot_id,
            req.entry_count,
            base,
        )
        cs.mode, cs.snapshot, cs.sent = Mode.LOG, None, base
        cs.snap_sent, cs.snap_done_sent = 0, False

    def _check_requests(self, streams: dict[str, ClientStream]) -> None:
        """Pick up drops and new or changed snapshot requests; launch providers."""
        dropped = {
            d.client_name: d for d in self.store.list_drops() if d.destination == self.destination
        }
        for name, cs in streams.items():
            open_req = self._reclaim_stalled(self._open_snapshot(name))
            if open_req is not None and cs.config.snapshot == "none":
                self._refuse(open_req)
                open_req = None
            if cs.mode is Mode.STOPPED:
                stop = self.store.get_stream_stop(self.destination, name)
                if stop is not None and stop.accepted_at is not None and stop.resumed_at is None:
                    self._resume_accepted(cs, stop)
                continue
            if cs.mode is Mode.LOG and name in dropped and open_req is None:
                if cs.config.snapshot == "none":
                    drop = dropped[name]
                    self._stop(cs, f"dropped ({drop.reason})", drop.first_dropped_position - 1)
                    continue
                sid = self.store.request_snapshot(
                    None, self.destination, name, "dropped for falling behind"
                )
                open_req = self.store.get_snapshot(sid)
            if cs.mode is Mode.LOG:
                if open_req is None:
                    continue
                # Switch now: log batches still in flight reach the sink before the
                # snapshot's, and their acks never move the cursor past its base.
                cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent = (
                    Mode.SNAPSHOT,
                    open_req,
                    0,
                    False,
                )
                cs.notice = self._drop_notice(dropped.get(name))
            elif cs.mode is Mode.SNAPSHOT:
                if cs.snapshot is None or open_req is None:
                    if cs.snap_done_sent:
                        continue  # the end marker is in flight; its ack completes the snapshot
                    if open_req is None:
                        # Cancelled or failed with nothing newer: ask again, not too often.
                        if time.monotonic() < cs.retry_at:
                            continue
                        cs.retry_at = time.monotonic() + self.retry.max_backoff
                        sid = self.store.request_snapshot(
                            None, self.destination, name, "previous snapshot did not complete"
                        )
                        open_req = self.store.get_snapshot(sid)
                if open_req is not None and (
                    cs.snapshot is None or open_req.snapshot_id != cs.snapshot.snapshot_id
                ):
                    # Superseded, perhaps mid-transfer: the sink drops what it
                    # queued of the old snapshot when the new id arrives.
                    cs.snapshot, cs.snap_sent, cs.snap_done_sent = open_req, 0, False
                elif open_req is not None:
                    cs.snapshot = open_req
            else:
                continue
            req = cs.snapshot
            if req is not None and req.status is SnapshotStatus.REQUESTED:
                self._launch(req, cs.config)

    def _reclaim_stalled(self, req: SnapshotRequest | None) -> SnapshotRequest | None:
        """Fail a RUNNING snapshot whose worker went silent (it crashed); None if so."""
        if req is None or req.status is not SnapshotStatus.RUNNING:
            return req
        silent_since = time.time() - self.cfg.snapshot_stall_timeout
        if req.updated_at >= silent_since:
            return req
        reason = f"no heartbeat from its worker for {self.cfg.snapshot_stall_timeout:g}s"
        # Conditional on the silence, so a beat that came meanwhile keeps it.
        if self.store.fail_stalled_snapshot(req.snapshot_id, silent_since, reason):
            self._log.warning(
                "%s/%s: snapshot %s failed: %s",
                self.destination,
                req.client_name,
                req.snapshot_id,
                reason,
            )
        return self._open_snapshot(req.client_name)

    def _launch(self, req: SnapshotRequest, config: ClientConfig) -> None:
        if config.snapshot != "spark" or self.launcher is None:
            return  # an in-process provider of the application picks it up
        if req.snapshot_id in self._launched:
            return
        self._launched.add(req.snapshot_id)
        self._log.info(
            "%s/%s: launching snapshot job %s", self.destination, config.name, req.snapshot_id
        )
        self.launcher(req, config)

    # -- status ----------------------------------------------------------------------------------
    def _summary(self, streams: dict[str, ClientStream]) -> str:
        modes = {cs.mode for cs in streams.values()}
        self._stopped = "; ".join(
            cs.stop_reason for cs in streams.values() if cs.mode is Mode.STOPPED
        )
        if Mode.SNAPSHOT in modes:
            return Mode.SNAPSHOT.value
        if Mode.STOPPED in modes:
            return Mode.STOPPED.value
        return Mode.LOG.value

    def _save_status(self) -> None:
        try:
            self.store.save_session_status(
                self.destination,
                self.state,
                connected=self.connected,
                inflight_batches=len(self._inflight),
                inflight_bytes=sum(f.nbytes for f in self._inflight),
                last_error=self.last_error or self._stopped,
            )
        except LRError as exc:
            self._log.warning("cannot save session status: %s", exc)


def _accepted(stop: StreamStop | None) -> tuple[int, int] | None:
    """The loss an operator accepted for the stream, if the sink was told of it."""
    if stop is None or stop.resumed_at is None or stop.accepted_through is None:
        return None
    return stop.resume_after, stop.accepted_through


def _wire(e: SendEntry) -> pb.RoutingTableEntryMsg:
    """Strip destinations; the sink learns the source from the authenticated stream."""
    return pb.RoutingTableEntryMsg(
        type=e.type.name,
        opaque_payload=e.payload,
        position=e.position,
        snapshot_id=e.snapshot_id,
        client_name=e.client_name,
    )
