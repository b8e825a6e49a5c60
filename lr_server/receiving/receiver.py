"""The sink receiver: applies batches from sources into receive queues.

Each batch is applied in one database transaction (entries appended to
``LRQ_Recv_<client>__<source>``, the last applied position recorded, the queue
registered), then acknowledged. A batch at or below the recorded position is
acknowledged without being applied again. A batch of one lane of a stream
(``lane`` > 0: the source ships the stream over several gRPC streams) is
checked and skipped by its lane's progress (:meth:`Receiving.apply_lane_batch`).

A batch of a cascaded client relayed by a branch names the client's origin
(the root) as ``source_id``, not the caller: it is applied to the origin's
queue only when the caller is this node's current provider of the client
(``lrq_cascade``), else refused with :class:`NotProviderError` (see
docs/cascading.md). A cascaded client's batches from the origin itself are
refused the same way once this node has another provider.

A compressed batch (protocol 6, :mod:`lr_server.protocol.codecs`) is expanded
first, up to ``max_message_bytes``, then checked and applied as any other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

from lr_client import tracing
from lr_client._proto import replication_pb2 as pb
from lr_client.errors import InvalidNameError, NotProviderError, ProtocolError
from lr_client.headers import received_headers
from lr_client.names import validate_name
from lr_client.records import (
    SNAPSHOT_TYPES,
    TYPES_BY_VALUE,
    CascadeNode,
    ReplicationType,
    SinkSnapshotState,
    WireEntry,
)
from lr_server import metrics
from lr_server.protocol import codecs
from lr_server.protocol import versions as protocol
from lr_server.receiving.limits import ReceiveLimits
from lr_server.stores import ReceiverStore

log = logging.getLogger("lr.receiver")

_SNAPSHOT_STATE = {
    SinkSnapshotState.NONE: pb.SNAPSHOT_NONE,
    SinkSnapshotState.ONGOING: pb.SNAPSHOT_ONGOING,
    SinkSnapshotState.COMPLETED: pb.SNAPSHOT_COMPLETED,
}
_LOG_TYPES = {ReplicationType.LOG_ENTRY_SYNC}


#: Seconds a cascade row read is used before it is read again (a refusal reads it again).
CASCADE_ROWS_TTL = 1.0


#: Serves one ``Cascade`` call: (the authenticated caller, its report) -> the reply.
CascadeHandler = Callable[[str, pb.CascadeReport], pb.CascadeReply]

#: Told (source or origin, client, last position) once a log batch is stored (its
#: transaction committed).
StoredHook = Callable[[str, str, int], None]
#: Given (source or origin, client, previous position, entries) of a log batch accepted
#: from its sender (its provider, for a cascaded client), before it is stored.
ReceivedHook = Callable[[str, str, int, Sequence[WireEntry]], None]


class Receiver:
    """Applies batches of accepted sources to the sink's store."""

    def __init__(
        self,
        store: ReceiverStore,
        sink_id: str,
        accepted_sources: Collection[str],
        *,
        max_batch_entries: int = 100_000,
        max_message_bytes: int = 65 * 1024 * 1024,
        limits: ReceiveLimits | None = None,
        cascade_reports: CascadeHandler | None = None,
        on_stored: StoredHook | None = None,
        on_received: ReceivedHook | None = None,
    ) -> None:
        self.store = store
        self.sink_id = sink_id
        self.accepted_sources = frozenset(accepted_sources)
        self.max_batch_entries = max_batch_entries
        #: The largest gRPC message this sink accepts (told to sources), and the most bytes
        #: a compressed batch's entries may expand to.
        self.max_message_bytes = max_message_bytes
        #: Bounds of the receive queues: log batches refused while one is full.
        self.limits = limits
        #: Serves ``Cascade`` calls (a child's report); None: not served here.
        self.cascade_reports = cascade_reports
        #: Told of every log batch stored: a branch's sessions relay it at once
        #: (:class:`lr_server.sending.arrivals.Arrivals`).
        self.on_stored = on_stored
        #: Given every log batch accepted, before it is stored: a branch's sessions
        #: forward it while this node stores it (:mod:`lr_server.sending.relay_inbox`).
        self.on_received = on_received
        self._cascade: dict[str, CascadeNode] = {}
        self._cascade_read_at = -CASCADE_ROWS_TTL
        self._cascade_lock = threading.Lock()
        #: The wire protocol each source announced when it last negotiated here.
        self.versions: dict[str, int] = {}

    def _cascade_rows(self, fresh: bool = False) -> dict[str, CascadeNode]:
        with self._cascade_lock:
            now = time.monotonic()
            if fresh or now - self._cascade_read_at >= CASCADE_ROWS_TTL:
                self._cascade = {n.client_name: n for n in self.store.cascade.list_cascade_nodes()}
                self._cascade_read_at = now
            return self._cascade

    def check_provider(self, caller: str, origin: str, client: str) -> None:
        """Refuse a batch of ``client`` from ``origin`` sent by ``caller`` unless ``caller``
        is this node's current provider of it (relayed, or from the origin itself)."""
        node = self._cascade_rows().get(client)
        if node is not None and node.origin_id == origin and node.provider_id == caller:
            return
        if node is None and origin == caller:
            return  # not cascaded here
        node = self._cascade_rows(fresh=True).get(client)  # read again before refusing
        if node is None:
            if origin == caller:
                return
            raise ProtocolError(f"batch claims source {origin!r}, sender is {caller!r}")
        if node.origin_id != origin:
            raise NotProviderError(
                f"{caller} is not the provider of {client} here (its origin is "
                f"{node.origin_id}, not {origin})"
            )
        if node.provider_id != caller:
            raise NotProviderError(
                f"{caller} is not the provider of {client} here "
                f"({node.provider_id or 'nobody'} is, epoch {node.epoch})"
            )

    def cascade(self, node_id: str, report: pb.CascadeReport) -> pb.CascadeReply:
        """Serve a child's ``Cascade`` report (see docs/cascading.md)."""
        if self.cascade_reports is None:
            raise ProtocolError(f"{self.sink_id} does not serve cascade reports")
        return self.cascade_reports(node_id, report)

    def negotiate(self, source_id: str, request: pb.NegotiateRequest) -> pb.NegotiateResponse:
        """Report, per client, what this sink has durably received from ``source_id``."""
        if request.source_id and request.source_id != source_id:
            raise ProtocolError(
                f"negotiation names source {request.source_id!r}, not {source_id!r}"
            )
        version = protocol.require_compatible(request.protocol_version, f"source {source_id!r}")
        self.versions[source_id] = version
        response = pb.NegotiateResponse(
            sink_id=self.sink_id,
            drop_notices=True,
            protocol_version=protocol.PROTOCOL_VERSION,
            codecs=codecs.accepted(request.codecs),
            max_message_bytes=self.max_message_bytes,
        )
        origins = {}
        for relay in request.relays:
            _valid(relay.client_name, "client name")
            origins[relay.client_name] = _valid(relay.origin_id, "origin id")
        for client in request.clients:
            _valid(client, "client name")
            origin = origins.get(client, "")
            p = self.store.recv.sink_progress(origin or source_id, client)
            response.clients.append(
                pb.ClientState(
                    client_name=client,
                    last_position=p.last_position,
                    snapshot_state=_SNAPSHOT_STATE[p.snapshot_state],
                    snapshot_id=p.snapshot_id,
                    snapshot_position=p.snapshot_position,
                    origin_id=origin,
                )
            )
        return response

    def _apply_log(
        self, source_id: str, client: str, batch: pb.ReplicationBatch, entries: list[WireEntry]
    ) -> tuple[bool, int]:
        """Store a log batch (of one lane, or the whole stream); (applied, last position)."""
        if batch.lane:
            return self.store.recv.apply_lane_batch(
                source_id,
                client,
                batch.lane,
                batch.lanes,
                entries,
                batch.previous_position,
                batch.low_water,
            )
        if self.on_received is not None:
            self.on_received(source_id, client, batch.previous_position, entries)
        return self.store.recv.apply_log_batch(source_id, client, entries, batch.previous_position)

    def apply(self, source_id: str, batch: pb.ReplicationBatch) -> pb.ReplicationAck:
        """Validate and apply one batch; return its acknowledgement."""
        client = _valid(batch.client_name, "client name")
        caller = source_id
        if batch.source_id and batch.source_id != caller:
            source_id = _valid(batch.source_id, "origin id")  # a relayed batch: the origin's
        self.check_provider(caller, source_id, client)
        batch = codecs.unpack(batch, self.max_message_bytes)
        if len(batch.entries) > self.max_batch_entries:
            raise ProtocolError(f"batch of {len(batch.entries)} entries exceeds the limit")
        entries = _entries(batch.entries, batch.previous_position)
        if self.limits is not None and batch.kind == pb.BATCH_LOG_ENTRY and entries:
            self.limits.check(source_id, client)
        if batch.replay:
            return self.apply_replay(caller, source_id, client, batch, entries)
        if batch.kind == pb.BATCH_LOG_ENTRY:
            if any(e.type not in _LOG_TYPES for e in entries):
                raise ProtocolError("log entry batch holds entries of another type")
            contexts = ((e.position, e.headers) for e in entries)
            with tracing.batch_span(
                "lr.receive", source_id, client, contexts, **{"lr.from": caller}
            ):
                applied, last = self._apply_log(source_id, client, batch, entries)
        elif batch.kind == pb.BATCH_SNAPSHOT:
            if not batch.snapshot_id:
                raise ProtocolError("snapshot batch without snapshot_id")
            _valid_snapshot_id(batch.snapshot_id)
            if any(
                e.type not in SNAPSHOT_TYPES or e.snapshot_id != batch.snapshot_id for e in entries
            ):
                raise ProtocolError("snapshot batch holds entries of another type or snapshot")
            applied, last = self.store.recv.apply_snapshot_batch(
                source_id, client, batch.snapshot_id, entries, batch.previous_position
            )
        elif batch.kind == pb.BATCH_DROP_NOTICE:
            if len(entries) != 1 or entries[0].type is not ReplicationType.STREAM_DROPPED:
                raise ProtocolError("a drop notice holds exactly one STREAM_DROPPED entry")
            _valid_snapshot_id(batch.snapshot_id)
            notice = entries[0]
            try:
                reason = notice.payload.decode()
            except UnicodeDecodeError as exc:
                raise ProtocolError("drop notice reason is not UTF-8") from exc
            applied = self.store.recv.apply_drop_notice(
                source_id, client, batch.snapshot_id, notice.position, reason
            )
            last = notice.position
            if applied:
                log.warning(
                    "%s/%s: stream dropped from position %d: %s",
                    source_id,
                    client,
                    notice.position,
                    reason,
                )
            return pb.ReplicationAck(
                batch_id=batch.batch_id,
                client_name=client,
                last_position=last,
                duplicate=not applied,
            )
        else:
            raise ProtocolError(f"unknown batch kind {batch.kind}")
        if applied:
            metrics.ENTRIES_APPLIED.labels(source_id, client).inc(len(entries))
            metrics.BYTES_APPLIED.labels(source_id, client).inc(
                sum(len(e.payload) for e in entries)
            )
            if batch.kind == pb.BATCH_LOG_ENTRY:
                _observe_relay_lag(client, source_id, batch.entries)
                if self.on_stored is not None:
                    self.on_stored(source_id, client, last)
        return pb.ReplicationAck(
            batch_id=batch.batch_id, client_name=client, last_position=last, duplicate=not applied
        )

    def apply_replay(
        self,
        caller: str,
        source_id: str,
        client: str,
        batch: pb.ReplicationBatch,
        entries: list[WireEntry],
    ) -> pb.ReplicationAck:
        """Queue a replayed batch again (``lr replay`` at the source), flagged; the
        stream's position stays. Only log entries, on no lane, from a source that
        negotiated protocol 6 or newer here."""
        if self.versions.get(caller, protocol.REPLAY_VERSION) < protocol.REPLAY_VERSION:
            raise ProtocolError(f"{caller} negotiated a protocol without replay")
        if batch.kind != pb.BATCH_LOG_ENTRY or batch.lane or not entries:
            raise ProtocolError("a replayed batch holds log entries, on no lane")
        if any(e.type not in _LOG_TYPES for e in entries):
            raise ProtocolError("log entry batch holds entries of another type")
        applied, last = self.store.replays.apply_replay_batch(source_id, client, entries)
        if applied:
            metrics.ENTRIES_REPLAYED.labels(source_id, client).inc(len(entries))
            first = entries[0].position
            log.info("%s/%s: replayed %d..%d queued again", source_id, client, first, last)
        return pb.ReplicationAck(
            batch_id=batch.batch_id, client_name=client, last_position=last, duplicate=not applied
        )


def _observe_relay_lag(client: str, origin: str, msgs: Sequence[pb.RoutingTableEntryMsg]) -> None:
    """``lr_relay_lag_seconds``: from the origin's transmit time to now, per entry that
    carries one (a cascaded client's entries)."""
    now = time.time()
    lag = None
    for msg in msgs:
        if msg.origin_time > 0:
            if lag is None:
                lag = metrics.RELAY_LAG.labels(client, origin)
            lag.observe(max(0.0, now - msg.origin_time))


def _valid(value: str, what: str) -> str:
    try:
        return validate_name(value, what)
    except InvalidNameError as exc:
        raise ProtocolError(str(exc)) from exc


def _valid_snapshot_id(value: str) -> None:
    if len(value) > 64 or not (value.isascii() and value.isalnum()):
        raise ProtocolError(f"invalid snapshot id {value[:80]!r}")


def _entries(msgs: Sequence[pb.RoutingTableEntryMsg], previous: int) -> list[WireEntry]:
    """The batch's entries, checked: each typed, without destinations, positions increasing.

    One pass, no enum call per entry (a snapshot batch holds thousands).
    """
    out: list[WireEntry] = []
    add, types = out.append, TYPES_BY_VALUE
    for msg in msgs:
        kind = types.get(msg.type)
        if not kind or msg.destinations:  # unknown, or NONE (0): _refuse says what is wrong
            _refuse(msg)
        position = msg.position
        if position <= previous:
            raise ProtocolError("batch positions must be strictly increasing")
        previous = position
        add(
            WireEntry(
                position,
                kind,
                msg.opaque_payload,
                msg.snapshot_id,
                msg.snapshot_count,
                msg.base_position,
                msg.partition_key or None,
                msg.origin_time,
                received_headers(msg.headers) if msg.headers else None,
            )
        )
    return out


def _refuse(msg: pb.RoutingTableEntryMsg) -> NoReturn:
    """Raise the error that says what is wrong with an entry :func:`_entries` refused:
    destinations not stripped, an unknown type, or none."""
    if msg.destinations:
        raise ProtocolError("entries must arrive with destinations stripped")
    try:
        ReplicationType(msg.type)
    except ValueError as exc:
        raise ProtocolError(f"unknown entry type {msg.type}") from exc
    raise ProtocolError("entry without a type")  # NONE (0)
