"""One pump round of a sender session: what each client may send now, sent.

Log entries are read first, then the open snapshot requests of the clients
read for are looked up in one query, and only then are the entries sent, cut
at an open snapshot's base (see :meth:`Shipper.ship_log` and
docs/architecture.md). Snapshot batches and drop notices go as they come.

The look-up of open full syncs and drops is :mod:`lr_server.sending.send_checks`
(with its reuse for batches a branch forwards as received); a client shipped over
several lanes goes through :mod:`lr_server.sending.lane_shipping`.
"""

from __future__ import annotations

import logging
import time

from lr_client._proto import replication_pb2 as pb
from lr_client.records import (
    CascadeNode,
    DropRecord,
    ReplicationType,
    SendEntry,
    SnapshotRequest,
    SnapshotStatus,
)
from lr_client.store.byte_bounds import ENTRY_OVERHEAD
from lr_server import metrics
from lr_server.config import ReplicationConfig, SnapshotProvider
from lr_server.protocol import versions as protocol
from lr_server.sending import outbound, wire
from lr_server.sending.arrivals import Arrivals
from lr_server.sending.fanout import LogFanout
from lr_server.sending.lane_shipping import LaneShipper
from lr_server.sending.relay_inbox import RelayInbox
from lr_server.sending.request_board import RequestBoard
from lr_server.sending.send_checks import SendChecks
from lr_server.sending.snapshot_requests import SnapshotRequests
from lr_server.sending.stops import StreamStops
from lr_server.sending.streams import ClientStream, Mode
from lr_server.sending.window import InFlight, Window
from lr_server.stores import ShipperStore
from lr_server.transport.base import BatchStream


class Shipper:
    """Sends the batches of one destination's streams into its window."""

    def __init__(
        self,
        store: ShipperStore,
        source_id: str,
        destination: str,
        cfg: ReplicationConfig,
        window: Window,
        stops: StreamStops,
        requests: SnapshotRequests,
        reader: LogFanout | None,
        log: logging.LoggerAdapter[logging.Logger],
        cascade: dict[str, CascadeNode] | None = None,
        inbox: RelayInbox | None = None,
        arrivals: Arrivals | None = None,
        board: RequestBoard | None = None,
    ) -> None:
        self.store = store
        self.source_id = source_id
        #: Cascaded clients shipped to this destination (a child), by name; shared with
        #: the session, which removes those the child left.
        self.cascade = cascade if cascade is not None else {}
        self.destination = destination
        self.cfg = cfg
        self.window = window
        self.stops = stops
        self.requests = requests
        self.reader = reader
        self._log = log
        #: Batches of relayed clients received and not stored yet (None: none relayed).
        self.inbox = inbox
        #: What this process's receiver stored of them, and when (None: not known).
        self.arrivals = arrivals
        #: The look-ups of full syncs and drops before log entries are sent.
        self.lookup = SendChecks(
            store, destination, board, lambda: max(requests.wrote, stops.wrote)
        )
        #: When the state the round's reads returned was read at the latest (None: a
        #: read of its own, whose look-up is its own too).
        self.state_at: float | None = None
        #: The sending of clients shipped over lanes.
        self.lane_shipper = LaneShipper(cfg, window, self.source_of, self.send)
        self.read_at: dict[str, float] = {}  # each client's last read of log entries (time.time)
        self.asked: float | None = None  # when the round now shipping was due
        self.rung: float | None = None  # the session's last wake-up (None: a poll)
        #: The sink's wire protocol, as negotiated (the session sets it on each connect).
        self.peer_version = protocol.PROTOCOL_VERSION

    def ship(
        self,
        stream: BatchStream,
        streams: dict[str, ClientStream],
        asked: float | None = None,
        rung: float | None = None,
    ) -> bool:
        """One round over the clients: send what each may send now; whether any went.
        ``asked``: when the round was due (a shared read begun since then serves it);
        ``rung``: the session's last wake-up, when a wake-up or an acknowledgement ended
        its wait (None: the wait ran out, a poll, or a sweep: every stream is read)."""
        self.asked, self.rung = asked, rung
        self.state_at = float("-inf")
        sent_any = False
        reads: dict[str, list[SendEntry]] = {}
        self.lookup.new_round()
        batches = nbytes = 0  # what the reads will add to the window
        lanes = self.cfg.streams_per_destination
        for name, cs in streams.items():
            if self.window.full(batches, nbytes):
                break
            if lanes > 1 and name not in self.cascade and not self.lane_shipper.may_ship(name, cs):
                continue
            if cs.notice is not None:  # a drop notice goes before anything else
                sent_any |= self.send_notice(stream, name, cs)
            elif cs.mode is Mode.LOG:
                entries = self.stops.sized(cs, self.read_log(name, cs))
                self.read_at[name] = time.time()
                if lanes > 1 and not entries and name not in self.cascade:
                    sent_any |= self.lane_shipper.send_mark(stream, name, cs)
                    continue
                if entries:
                    reads[name] = entries
                    batches += lanes  # with lanes, a read holds up to a batch per lane
                    nbytes += sum(len(e.payload) for e in entries)
            elif cs.mode is Mode.SNAPSHOT:
                sent_any |= self.send_snapshot(stream, name, cs)
        if reads:
            requests, drops = self.lookup.checks(reads.keys(), self.state_at)
            for name, entries in reads.items():
                cs, request = streams[name], requests.get(name)
                if request is not None and cs.config.snapshot == SnapshotProvider.NONE:
                    self.requests.refuse(request)  # a client without a provider keeps its log
                    request = None
                if name in drops:
                    # Dropped: nothing more past the hole before the notice and the full
                    # sync (or the stop) that the request check arranges.
                    entries = []
                    if request is None:
                        continue
                sent_any |= self.ship_log(stream, name, cs, entries, request, drops.get(name))
            self.lookup.look_ahead()  # while the batches travel
        return sent_any

    def source_of(self, name: str) -> str:
        """The source id of the client's batches: its origin when this node relays it."""
        node = self.cascade.get(name)
        return self.source_id if node is None else node.origin_id

    def read_log(self, name: str, cs: ClientStream) -> list[SendEntry]:
        """The client's next batch of log entries (not sent yet: see :meth:`ship_log`)."""
        node = self.cascade.get(name)
        relayed = node is not None and node.origin_id != self.source_id
        if cs.partial_batch and self.window.holds(cs.partial_batch) and not relayed:
            # Caught up: while a partial batch is in flight, let new entries gather
            # into the next batch rather than paying a sink transaction per trickle.
            # A relayed client's entries arrive in its provider's batches, gathered
            # already: they go on as they are stored, within the window.
            return []
        if (
            self.rung is not None
            and cs.caught_up is not None
            and self.store.shipping.every_send_wakes
        ):
            # Sent all that a read saw, current after the last wake-up: the entries the
            # wake-ups told of were read (a lost one costs the safety poll). Where some
            # transmits ring no one, one after an acknowledgement is read at once.
            at, position = cs.caught_up
            if self.rung <= at and cs.sent == position:
                return []
        if node is not None:  # one lane: every entry of the client, in origin positions
            limit, max_bytes = self.cfg.batch_max_entries, self.cfg.batch_max_bytes
            if relayed:  # a branch: as received, or from the receive queue
                return self.read_relay(name, node.origin_id, cs.sent, limit, max_bytes)
            if self.reader is not None:  # the root: one read for all its children
                return self._stated(
                    self.reader.read_stated(None, name, cs.sent, limit, max_bytes, self.asked)
                )
            self.state_at = None
            return list(
                self.store.shipping.read_client_log(name, cs.sent, limit, max_bytes=max_bytes)
            )
        lanes = self.cfg.streams_per_destination  # a batch's worth per lane
        limit, max_bytes = self.cfg.batch_max_entries * lanes, self.cfg.batch_max_bytes * lanes
        began = time.monotonic() if self.asked is None else self.asked  # what it reflects
        if self.reader is not None:
            entries = self._stated(
                self.reader.read_stated(
                    self.destination, name, cs.sent, limit, max_bytes, self.asked
                )
            )
        else:
            self.state_at = None
            entries = self.store.shipping.read_log_entries(
                self.destination, name, cs.sent, limit, max_bytes=max_bytes
            )
        # Fewer than the limits allow: all there was (a read cut by the bytes of an entry
        # over half of them is taken for one that was not: the next poll reads again).
        nbytes = sum(len(e.payload) + ENTRY_OVERHEAD for e in entries)
        short = len(entries) < limit and 2 * nbytes <= max_bytes
        last = entries[-1].position if entries else cs.sent
        cs.caught_up = (began, last) if short and lanes == 1 else None
        return entries

    def _stated(self, read: tuple[list[SendEntry], float]) -> list[SendEntry]:
        """The entries of a shared read; when their state was read joins the round's."""
        entries, at = read
        if self.state_at is not None:
            self.state_at = max(self.state_at, at)
        return entries

    def read_relay(
        self, name: str, origin: str, after: int, limit: int, max_bytes: int
    ) -> list[SendEntry]:
        """A relayed client's entries after ``after``: from a batch received and perhaps
        not stored yet, if one follows ``after`` (:mod:`lr_server.sending.relay_inbox`), else
        from the receive queue (not read when this process stored nothing past
        ``after`` lately: :meth:`Arrivals.nothing_stored_past`)."""
        self.state_at = None  # its look-up is its own
        if self.inbox is not None:
            entries = self.inbox.take(name, after, limit, max_bytes)
            if entries:
                metrics.RELAY_BATCHES.labels(self.destination, name, "forwarded").inc()
                self.lookup.forwarded(name)
                return entries
        if self.arrivals is not None and self.arrivals.nothing_stored_past(origin, name, after):
            return []  # all stored here was forwarded: the read would find nothing
        entries = self.store.cascade.read_relay(name, origin, after, limit, max_bytes)
        if entries:
            metrics.RELAY_BATCHES.labels(self.destination, name, "stored").inc()
        return entries

    def ship_log(
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
        if entries and cs.lanes is not None:
            entries = self.lane_shipper.send_entries(stream, name, cs, entries)
        elif entries:
            batch_id = self.window.next_batch_id()
            batch = wire.log_batch(
                batch_id, self.source_of(name), name, entries, cs.sent, name in self.cascade
            )
            self.send(stream, batch, name, entries)
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
        cs.notice = self.stops.drop_notice(drop)  # the listener learns of a drop before its sync
        if request.status is SnapshotStatus.REQUESTED:
            self.requests.launch(request, cs.config)
        return True

    def send_snapshot(self, stream: BatchStream, name: str, cs: ClientStream) -> bool:
        """The stream's next batch of its READY snapshot, the end marker's included."""
        req = cs.snapshot
        if req is None or cs.snap_done_sent:
            return False
        node = self.cascade.get(name)
        if (
            node is not None
            and node.origin_id != self.source_id
            and cs.snap_sent == 0
            and req.base_position is not None
            and req.base_position < cs.sent
        ):
            self.requests.rebase(cs)  # relayed: the node holds entries past the base
            return False
        if req.status is not SnapshotStatus.READY:
            return False
        entries = self.store.snapshot_entries.read_snapshot_entries(
            req.snapshot_id,
            cs.snap_sent,
            self.cfg.snapshot_batch_entries,
            self.cfg.batch_max_bytes,
        )
        if not entries:
            return False
        # Each entry carries the base position (the sink tells its listener), the end
        # marker also the snapshot's entry count.
        msgs = wire.snapshot_entries(entries, req.base_position or 0, req.entry_count or 0)
        if entries[-1].type is ReplicationType.LAST_FULL_SYNC_ENTRY:
            cs.snap_done_sent = True
        batch = wire.snapshot_batch(
            self.window.next_batch_id(),
            self.source_of(name),
            name,
            req.snapshot_id,
            entries,
            cs.snap_sent,
            msgs,
        )
        self.send(stream, batch, name, entries, cs.snap_done_sent)
        cs.snap_sent = entries[-1].position
        return True

    def send_notice(self, stream: BatchStream, name: str, cs: ClientStream) -> bool:
        notice = cs.notice
        assert notice is not None
        cs.notice = None
        batch = wire.notice_batch(self.window.next_batch_id(), self.source_of(name), name, notice)
        self.window.add(
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

    def send(
        self,
        stream: BatchStream,
        batch: pb.ReplicationBatch,
        name: str,
        entries: list[SendEntry],
        is_end: bool = False,
        *,
        lane: int = 0,
        low_water: int = 0,
    ) -> None:
        """Count ``batch`` in flight, check it, send it (:func:`.outbound.send`)."""
        args = (self.window, self.destination, self.peer_version, stream, batch, name, entries)
        outbound.send(*args, is_end, lane, low_water, self.read_at.get(name, 0.0))


__all__ = ["Shipper"]
