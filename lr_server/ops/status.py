"""Where every replication stream of a site stands: the data behind ``lr status``.

Send side, per (destination, client): the state, the lag from
:meth:`~lr_client.store.QueueStore.backlog`, the last ack, the session's
in-flight window (from ``lrq_session_status`` when the server has written it),
the open snapshot's progress and any drop record. Sink side, per (source,
client): the last applied source position, the snapshot state, how many
entries were received and how many still wait in the receive queue. Per
cascaded client: this node's role, provider and epoch, its local and the
set's global watermark, and the nodes below it as they last reported.

States of a send stream, first match wins:

* ``not configured``: entries are queued for a (destination, client) that
  this site's config does not list (the application registered or addressed
  the destination, or transmits a client the destination is not given). No
  session ships it; its entries are kept until a retention limit drops it.
* ``stopped``: the sink lacks entries the source no longer holds and the
  client has no snapshot provider; nothing is shipped until an operator
  acts (``lr accept-loss``, or a provider configured: a full sync follows).
* ``dropped``: a drop record exists (the destination fell past a retention
  limit); it will be re-synced by a full sync.
* ``snapshot sync``: a snapshot is open (requested, running or ready) or the
  cursor says one is needed.
* ``backpressure``: the server's retention policy has turned backpressure on
  for the client (more than half of its destinations are slow) and this
  destination is one of the slow ones; ``transmit`` refuses or waits.
* ``log entry sync``: otherwise.

``slow`` says whether the stream is past ``retention.soft_fraction`` of any
retention limit (entries, bytes, age of the oldest unacknowledged entry).
"""

from __future__ import annotations

import time

from lr_client.names import recv_queue_name
from lr_client.records import (
    OPEN_SNAPSHOT_STATUSES,
    SinkSnapshotState,
    SnapshotRequest,
)
from lr_client.snapshot_status import SnapshotInfo
from lr_client.store import Inspection, QueueStore, SendLog
from lr_server.cluster.placement import stream_unit
from lr_server.cluster.streams import configured_streams, unconfigured_streams
from lr_server.config import SiteConfig
from lr_server.ops.status_records import (
    CascadeChildInfo,
    CascadeInfo,
    DropInfo,
    SendStream,
    SessionInfo,
    SinkStream,
    SiteStatus,
    StopInfo,
    StreamState,
)


def read_session_status(store: Inspection) -> list[SessionInfo] | None:
    """Rows of ``lrq_session_status``, or None if this store version has no such table."""
    lister = getattr(store, "list_session_status", None)
    if lister is None:
        return None
    out = []
    for row in lister():
        out.append(
            SessionInfo(
                destination=str(row["destination"]),
                state=str(row.get("state") or ""),
                connected=bool(row.get("connected")),
                inflight_batches=int(row.get("inflight_batches") or 0),
                inflight_bytes=int(row.get("inflight_bytes") or 0),
                last_error=str(row.get("last_error") or ""),
                updated_at=float(row.get("updated_at") or 0.0),
            )
        )
    return out


def queue_depths(store: Inspection) -> dict[int, int]:
    """{queue_id: entries waiting in the receive queue}, in one query."""
    return store.queue_depths()


def head_position(store: Inspection) -> int:
    """The highest position assigned so far, read without waiting for transmitters."""
    return store.head_position_estimate()


def flow_states(store: SendLog, clients: set[str]) -> dict[str, set[str]]:
    """{client: slow destinations} for clients under backpressure (as the server set it)."""
    out = {}
    for client in sorted(clients):
        on, slow = store.flow_state(client)
        if on:
            out[client] = set(slow)
    return out


def _send_streams(
    config: SiteConfig, store: QueueStore, sessions: dict[str, SessionInfo] | None
) -> list[SendStream]:
    now = time.time()
    configured = configured_streams(config)
    cursors = {(c.destination, c.client_name): c for c in store.shipping.list_cursors()}
    drops = {(d.destination, d.client_name): d for d in store.retention.list_drops()}
    stops = {(x.destination, x.client_name): x for x in store.retention.list_stream_stops()}
    open_snaps: dict[tuple[str, str], SnapshotRequest] = {}
    # Newest first: keep the newest.
    for req in store.snapshots.list_snapshots(statuses=OPEN_SNAPSHOT_STATUSES):
        open_snaps.setdefault((req.destination, req.client_name), req)
    recorded = configured | set(cursors) | set(drops) | set(open_snaps)
    unlisted = unconfigured_streams(config, store.shipping)[0]
    backlogs = dict(zip(unlisted, store.shipping.backlogs(unlisted), strict=True))
    keys = sorted(recorded | {key for key, b in backlogs.items() if b.entries})
    missing = [key for key in keys if key not in backlogs]
    backlogs.update(zip(missing, store.shipping.backlogs(missing), strict=True))
    throttled = flow_states(store.send, {c for _, c in keys})
    owners = {x.unit: x.member_id for x in store.members.list_leases() if x.owner is not None}

    streams = []
    for dest, client in keys:
        backlog = backlogs[(dest, client)]
        age = now - backlog.oldest_created_at if backlog.oldest_created_at else 0.0
        cursor = cursors.get((dest, client))
        drop = drops.get((dest, client))
        snap = open_snaps.get((dest, client))
        session = sessions.get(dest) if sessions else None
        inflight = session.inflight_batches if session else None
        stop = stops.get((dest, client))
        if (dest, client) not in configured:
            state = StreamState.NOT_CONFIGURED
        elif stop and stop.is_stopped:
            state = StreamState.STOPPED
        elif drop:
            state = StreamState.DROPPED
        elif snap or (cursor and cursor.needs_snapshot):
            state = StreamState.SNAPSHOT_SYNC
        elif dest in throttled.get(client, ()):
            state = StreamState.BACKPRESSURE
        else:
            state = StreamState.LOG_ENTRY_SYNC
        streams.append(
            SendStream(
                destination=dest,
                client=client,
                state=state,
                cursor=cursor.position if cursor else 0,
                lag_entries=backlog.entries,
                lag_bytes=backlog.bytes,
                lag_seconds=max(age, 0.0),
                slow=config.retention.measure(backlog, now)[1],
                last_ack=cursor.acked_at if cursor and cursor.acked_at else None,
                inflight_batches=inflight,
                configured=(dest, client) in configured,
                snapshot=SnapshotInfo.from_request(snap) if snap else None,
                drop=DropInfo(drop.first_dropped_position, drop.dropped_at, drop.reason)
                if drop
                else None,
                stop=StopInfo(
                    stop.reason, stop.resume_after, stop.stopped_at, bool(stop.accepted_at)
                )
                if stop
                else None,
                owner=owners.get(stream_unit(dest, client), ""),
            )
        )
    return streams


def _sink_streams(config: SiteConfig, store: QueueStore) -> list[SinkStream]:
    depths = queue_depths(store.inspection)
    queues = {(q.source_id, q.client_name): q for q in store.queues.list_queues()}
    progress = {(p.source_id, p.client_name): p for p in store.recv.list_sink_progress()}
    notices = {(d.source_id, d.client_name): d for d in store.recv.list_sink_drops()}
    configured_sources = {x.id for x in config.sources}
    out = []
    for source, client in sorted(set(queues) | set(progress)):
        p = progress.get((source, client))
        q = queues.get((source, client))
        out.append(
            SinkStream(
                source=source,
                client=client,
                queue=q.queue_name if q else recv_queue_name(client, source),
                last_position=p.last_position if p else 0,
                snapshot_state=SinkSnapshotState(p.snapshot_state).name.lower()
                if p
                else SinkSnapshotState.NONE.name.lower(),
                snapshot_id=p.snapshot_id if p else "",
                snapshot_position=p.snapshot_position if p else 0,
                entries_received=p.entries_received if p else 0,
                queue_depth=depths.get(q.queue_id, 0) if q else 0,
                updated_at=p.updated_at if p else 0.0,
                configured=source in configured_sources,
                drop=DropInfo(n.first_dropped_position, n.received_at, n.reason)
                if (n := notices.get((source, client)))
                else None,
            )
        )
    return out


def _cascades(config: SiteConfig, store: QueueStore, now: float) -> list[CascadeInfo]:
    from lr_server.cascade.control import children_of, node_watermarks
    from lr_server.cascade.watermarks import counts

    grace = config.replication.cascade_grace
    out = []
    for node in store.cascade.list_cascade_nodes():
        local, _ = node_watermarks(store, node, grace, now)
        children = [
            CascadeChildInfo(
                c.child_id,
                c.epoch,
                c.local_watermark,
                c.acked_position,
                c.reported_at,
                None if c.reported_at is None else max(0.0, now - c.reported_at),
                c.dropped,
                counts(c, now, grace),
            )
            for c in children_of(store, node.client_name)
        ]
        out.append(
            CascadeInfo(
                node.client_name,
                node.origin_id,
                node.role,
                node.provider_id,
                node.epoch,
                node.config_provider,
                local,
                node.global_watermark,
                children,
            )
        )
    return out


def collect_status(config: SiteConfig, store: QueueStore) -> SiteStatus:
    """Everything ``lr status`` shows, read in a few short transactions."""
    session_rows = read_session_status(store.inspection)
    sessions = None if session_rows is None else {x.destination: x for x in session_rows}
    return SiteStatus(
        site=config.id,
        time=time.time(),
        head_position=head_position(store.inspection),
        oldest_position=store.shipping.oldest_position(),
        sessions_known=session_rows is not None,
        sessions=session_rows or [],
        send=_send_streams(config, store, sessions),
        sink=_sink_streams(config, store),
        slots=store.inspection.queue_slots(),
        cascades=_cascades(config, store, time.time()),
    )


__all__ = [
    "collect_status",
    "configured_streams",
    "flow_states",
    "queue_depths",
    "read_session_status",
    "unconfigured_streams",
]
