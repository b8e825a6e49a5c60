"""The sender session: one replication stream from this site to one destination.

Per client it ships log entries after its cursor, or a full sync then log entries from its
base, in batches bounded in entries and bytes, a window of them unacknowledged at most
(:mod:`.window`); acknowledgements move the cursors (:mod:`.acks`). A lost connection is
opened again with backoff and jitter, and resumes where the sink stopped (:mod:`.resume`);
a sink whose receive queue is full is tried again after a wait doubling up to ``max_backoff``.
Full syncs: :mod:`.snapshot_requests`; stopped streams: :mod:`.stops`; replays:
:mod:`.replay`; relayed clients, woken as their batches arrive: :mod:`.arrivals`.

Idle, a session waits for a wake-up (:meth:`SenderSession.wake`, from the send queue's watch),
an ack or the probe's sweep; its safety poll backs off (:func:`.send_probe.next_wait`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from lr_client import ReceiveQueueFullError
from lr_client._proto import replication_pb2 as pb
from lr_client.errors import FencedError, LRError, NotProviderError, TransportError
from lr_client.records import CascadeNode, Fence, WireEntry
from lr_server import metrics
from lr_server.config import ClientConfig, ReplicationConfig, RetryConfig
from lr_server.protocol import versions as protocol
from lr_server.sending import wire
from lr_server.sending.acks import Acknowledgements
from lr_server.sending.arrivals import Arrivals
from lr_server.sending.fanout import LogFanout
from lr_server.sending.reconnect import reconnecting
from lr_server.sending.relay_inbox import RelayInbox
from lr_server.sending.replay import Replayer
from lr_server.sending.request_board import RequestBoard
from lr_server.sending.resume import Resumer
from lr_server.sending.send_probe import next_wait, on_grid
from lr_server.sending.shipping import Shipper
from lr_server.sending.snapshot_requests import SnapshotLauncher, SnapshotRequests
from lr_server.sending.status_row import STATUS_REFRESH, StatusRow
from lr_server.sending.stops import StreamStops
from lr_server.sending.streams import ClientStream, Mode, SessionState, summary
from lr_server.sending.window import Window
from lr_server.stores import SessionStore
from lr_server.transport.base import BatchStream, Transport
from lr_server.transport.lanes import LaneTransport

log = logging.getLogger("lr.session")

#: Seconds an idle session waits at most between two reads (its safety poll).
IDLE_POLL_MAX = 5.0
#: Seconds between two reads of full-sync requests, drops and stops while shipping.
REQUEST_CHECK = 0.5


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
        fences: Mapping[str, Fence] | None = None,
        lease_valid: Callable[[], bool] = lambda: True,
        cascade: Mapping[str, CascadeNode] | None = None,
        arrivals: Arrivals | None = None,
        board: RequestBoard | None = None,
    ) -> None:
        self.store = store
        #: Where it reads requests: the server's, shared by its sessions, or its own.
        self.board = board or RequestBoard(store)
        #: This node's rows of the cascaded clients it ships to the destination (a child).
        self.cascade = dict(cascade or {})
        #: The leases (per client) this session writes under; None: unfenced (one server).
        self.fences = None if fences is None else dict(fences)
        self.lease_valid = lease_valid
        self.source_id = source_id
        self.destination = destination
        self.clients = {c.name: c for c in clients}
        #: Tells the session when a batch of a client it relays is stored here (a
        #: branch): its wait for acknowledgements ends, and it reads the batch at once.
        self.arrivals = arrivals
        self._stream: BatchStream | None = None  # the open stream, whose wait a ring ends
        self._woken = False  # set by wake(): the next round polls fast again
        self._swept = False  # set by sweep(): the next round reads, at its back-off
        self._rung_at = 0.0  # the last wake-up or sweep (time.monotonic())
        #: Seconds an idle session waits at most between reads; between status rows.
        self.idle_poll_max, self.status_refresh = IDLE_POLL_MAX, STATUS_REFRESH
        #: The same while :meth:`steady` (longer under the server's probe of the head).
        self.steady_poll_max = IDLE_POLL_MAX
        self.transport_factory = transport_factory
        self.cfg = replication or ReplicationConfig()
        #: The batches of the clients it relays received here and not stored yet, which
        #: it may forward at once (:mod:`lr_server.sending.relay_inbox`); None: none relayed.
        self.inbox: RelayInbox | None = None
        relayed = [n for n, node in self.cascade.items() if node.origin_id != source_id]
        if arrivals is not None and relayed:
            self.inbox = RelayInbox(self.cfg.window_batches, self.cfg.batch_max_bytes * 2)
            arrivals.listen(relayed, self.wake, self._received)  # stored, received
        self.retry = retry or RetryConfig()
        self.state = SessionState.STARTING
        self.connected = False
        self.last_error = ""
        self.lanes = self.cfg.streams_per_destination
        self.window = Window(
            self.cfg.window_batches,
            self.cfg.window_bytes,
            self.lanes,
            self.cfg.batch_max_entries if self.lanes > 1 else 0,
        )
        self._stopped = ""  # why streams are stopped, for the session status
        self._log = logging.LoggerAdapter(log, {"destination": destination})
        self.status_row = StatusRow(store, destination, self._log)
        self.stops = StreamStops(store, destination, self._log, self.fence)
        self.requests = SnapshotRequests(
            store, destination, self.stops, self._log, self.cfg, self.retry, snapshot_launcher
        )
        self.shipper = Shipper(
            store,
            source_id,
            destination,
            self.cfg,
            self.window,
            self.stops,
            self.requests,
            reader,
            self._log,
            self.cascade,
            self.inbox,
            arrivals if self.inbox is not None else None,
            self.board,
        )
        self.replays = Replayer(store, source_id, destination, self.cfg, self.window, self._log)
        self.resume = Resumer(
            store,
            source_id,
            destination,
            self.cascade,
            self.requests,
            self.stops,
            self.fence,
            self._log,
        )
        self.acks = Acknowledgements(
            store,
            destination,
            self.window,
            self.stops,
            self.requests,
            self.replays,
            self.fence,
            lambda: self._woken or self._swept,
            self.status_row.stages,
        )

    def wake(self) -> None:
        """Entries may have come: end the session's wait, and poll fast again."""
        self._woken = True
        self._interrupt()

    def sweep(self) -> None:
        """Read now, as its safety poll would, without polling fast again (the probe's)."""
        self._swept = True
        self._interrupt()

    def _interrupt(self) -> None:
        self._rung_at = time.monotonic()  # a read begun since serves it (shared with others)
        if (stream := self._stream) is not None:
            stream.interrupt()

    def fence(self, client: str) -> Fence | None:
        """The lease ``client``'s writes are made under (None: unfenced)."""
        if self.fences is None:
            return None
        found = self.fences.get(client)
        if found is None:
            raise FencedError(f"{self.destination}/{client}: this member does not own the stream")
        return found

    # -- the loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Replicate until ``stop`` is set; never raises for transient trouble."""
        full = 0.0  # the last wait after a sink's full receive queue refused a batch
        while not stop.is_set():
            transport: Transport | None = None
            try:
                transport, stream, streams = self._connect(stop)
                if stream is None:
                    break
                self._stream = stream  # stored from now on: its wait ends
                try:
                    self._pump(stop, stream, streams)
                finally:
                    self._stream = None
                    if self.inbox is not None:
                        self.inbox.clear()
                    stream.close()
            except NotProviderError as exc:
                self._failed(exc)
                if not self._child_left(exc):
                    break
                stop.wait(self.retry.initial_backoff)
            except ReceiveQueueFullError as exc:  # until its subscriber drains: longer each time
                self._failed(exc)
                full = min(self.retry.max_backoff, max(self.retry.initial_backoff, full * 2))
                stop.wait(full)
            except LRError as exc:
                self._failed(exc)
                full = 0.0
                stop.wait(self.retry.initial_backoff)
            except Exception as exc:  # a bug or the database: log, back off, go on
                self._log.exception("session to %s failed", self.destination)
                self._failed(exc)
                stop.wait(self.retry.max_backoff)
            finally:
                self.window.clear()
                self.connected = False
                metrics.INFLIGHT_BATCHES.labels(self.destination).set(0)
                if transport is not None:
                    transport.close()
        if self.arrivals is not None:
            self.arrivals.forget(self.wake, self._received)
        self.state = SessionState.STOPPED
        self._save_status()

    def _child_left(self, exc: NotProviderError) -> bool:
        """The destination takes its cascaded clients from another provider now: mark it
        dropped for them and ship them no more (no retry). Whether clients are left."""
        for name in list(self.cascade):
            self.store.cascade.mark_child_dropped(name, self.destination)
            self.clients.pop(name, None)
            self.cascade.pop(name)
            left = "the child left (it refused this node as its provider)"
            self._log.warning("%s/%s: %s: %s", self.destination, name, left, exc)
        return bool(self.clients)

    def _failed(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.state = SessionState.RECONNECTING
        metrics.ERRORS.labels(type(exc).__name__).inc()
        self._log.warning("session %s -> %s: %s", self.source_id, self.destination, self.last_error)
        self._save_status()

    def _connect(
        self, stop: threading.Event
    ) -> tuple[Transport | None, BatchStream | None, dict[str, ClientStream]]:
        try:
            for attempt in reconnecting(self.retry, stop, self._failed):
                with attempt:
                    transport = self._transport()
                    try:
                        request = pb.NegotiateRequest(
                            source_id=self.source_id,
                            clients=sorted(self.clients),
                            protocol_version=protocol.PROTOCOL_VERSION,
                            relays=wire.relays(self.cascade, self.source_id),
                        )
                        response = transport.negotiate(request, timeout=10.0)
                        if request.relays:
                            protocol.require("cascade", response.protocol_version, self.destination)
                        if self.lanes > 1:
                            protocol.require("lanes", response.protocol_version, self.destination)
                        streams = self._plan(response)
                        self.replays.connected(response.protocol_version)
                        stream = transport.open_stream()
                    except BaseException:
                        transport.close()
                        raise
                    self.connected = True
                    self.last_error = ""
                    self.state = SessionState.CONNECTED
                    self._log.info("connected to %s", self.destination)
                    return transport, stream, streams
        except LRError:
            if stop.is_set():
                return None, None, {}
            raise
        return None, None, {}

    def _transport(self) -> Transport:
        """One transport, or one per lane (each its own connection) with several streams."""
        if self.lanes == 1:
            return self.transport_factory()
        return LaneTransport(self.transport_factory, self.lanes)

    # -- negotiation ----------------------------------------------------------------------------
    def _plan(self, response: pb.NegotiateResponse) -> dict[str, ClientStream]:
        """Decide, per client, where to resume (:mod:`lr_server.sending.resume`)."""
        peer = protocol.require_compatible(response.protocol_version, f"sink {self.destination!r}")
        self.shipper.peer_version = peer
        self.stops.negotiated(response, self.cfg.max_message_bytes)
        return self.resume.plan(wire.sink_states(response), self.clients)

    def _check_requests(self, streams: dict[str, ClientStream], asked: float | None = None) -> None:
        seen = self.board.read(asked)  # a step of its own, for tests to take
        self.requests.check(streams, seen)
        self.replays.check(streams, self.cascade, seen)

    # -- pumping ----------------------------------------------------------------------------------
    def _pump(
        self, stop: threading.Event, stream: BatchStream, streams: dict[str, ClientStream]
    ) -> None:
        last_status = last_check = 0.0
        fast = self.cfg.poll_interval
        idle = fast  # the next idle wait: doubles with each round that finds nothing
        due = time.monotonic()  # when the wait before the round was to end
        owed = 0.0  # the wake-up whose read of requests is owed still (0.0: none)
        acked = 0  # acknowledgements that ended the last wait
        while not stop.is_set():
            now = time.monotonic()
            woken, self._woken = self._woken, False
            swept, self._swept = self._swept, False
            # Reads begun since the round was due serve it: since the wake-up that ended
            # its wait, or the wait's end (on the grid, where other sessions end theirs).
            asked = min(now, self._rung_at if woken or swept else due)
            owed = (owed or asked) if woken or swept else owed
            # Requests, drops, stops: owed by a wake-up (read at most every REQUEST_CHECK s;
            # the wait ends when it is due), or polled.
            if now - last_check > (REQUEST_CHECK if owed else max(REQUEST_CHECK, idle)):
                self._check_requests(streams, owed or asked)
                last_check, owed = now, 0.0
            # A round after a wake-up or acknowledgements skips the streams caught up
            # since the last wake-up; one after a wait that ran out reads them all.
            rung = self._rung_at if (woken or acked) and not swept else None
            sent_any = self._ship(stream, streams, asked, rung)
            if sent_any or woken:
                idle = fast
            timeout = (idle if self.window.full() else 0.0) if sent_any else on_grid(idle)
            if owed:
                left = last_check + REQUEST_CHECK + 0.001 - time.monotonic()
                timeout = max(0.0, min(timeout, left))
            due = time.monotonic() + timeout
            acked = self.acks.wait(stop, stream, streams, timeout)
            if acked or sent_any:
                idle = fast
            elif not self._woken:
                steady = self.steady(streams)
                idle = next_wait(idle, steady, fast, self.idle_poll_max, self.steady_poll_max)
            oldest = self.window.oldest_sent_at()
            if oldest is not None and now - oldest > self.cfg.stream_idle_timeout:
                raise TransportError("no acknowledgement within stream_idle_timeout")
            if now - last_status > 1.0:
                self._report(streams)
                last_status = now
        self.acks.settle(stream, streams)  # a clean shutdown

    def steady(self, streams: dict[str, ClientStream]) -> bool:
        """Every stream in log entry sync, nothing in flight, replayed or relayed: all it
        waits for is new entries or requests, which wake it (the probe covers a lost one)."""
        return (
            not self.window.batches
            and self.inbox is None
            and not self.replays.runs
            and all(cs.mode is Mode.LOG for cs in streams.values())
        )

    def _received(
        self, origin: str, client: str, previous: int, entries: Sequence[WireEntry]
    ) -> None:
        """A batch of a client it relays was received from the provider (not stored yet):
        keep it to forward, and end the session's wait."""
        node = self.cascade.get(client)
        stream, inbox = self._stream, self.inbox
        if node is None or node.origin_id != origin or stream is None or inbox is None:
            return
        if inbox.put(client, previous, entries):
            self.wake()

    def _ship(
        self,
        stream: BatchStream,
        streams: dict[str, ClientStream],
        asked: float | None = None,
        rung: float | None = None,
    ) -> bool:
        if not self.lease_valid():  # this member's heartbeat lapsed: others may own it now
            raise FencedError(f"{self.destination}: this member's leases lapsed; not shipping")
        return self.shipper.ship(stream, streams, asked, rung) | self.replays.ship(stream, streams)

    # -- status ----------------------------------------------------------------------------------
    def _report(self, streams: dict[str, ClientStream]) -> None:
        """Record the session's state and whether each stream is in a full sync."""
        self.state, self._stopped = summary(streams.values())
        self.status_row.full_syncs(streams)
        self._save_status()

    def _save_status(self) -> None:
        """Write the status row if it changed, or if it is ``status_refresh`` s old."""
        status = (self.state, self.connected, len(self.window), self.window.nbytes)
        self.status_row.save((*status, self.last_error or self._stopped), self.status_refresh)


__all__ = ["SenderSession"]
