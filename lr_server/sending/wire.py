"""The protobuf messages a sender session sends and reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lr_client._proto import replication_pb2 as pb
from lr_client.headers import decode_headers
from lr_client.records import CascadeNode, ReplicationType, SendEntry
from lr_server.sending.negotiation import SinkState
from lr_server.sending.streams import Notice


def sink_states(response: pb.NegotiateResponse) -> dict[str, SinkState]:
    """The sink's state per client, as plain data."""
    return {
        c.client_name: SinkState(
            c.last_position,
            int(c.snapshot_state),  # a state this side does not know matches no rule
            c.snapshot_id,
            c.snapshot_position,
        )
        for c in response.clients
    }


def entry(e: SendEntry, origin_time: bool = False) -> pb.RoutingTableEntryMsg:
    """Strip destinations; the sink learns the source from the authenticated stream.

    ``origin_time``: a cascaded client's entry carries the origin's transmit time
    (``created_at``: at the root its transmit, at a branch the origin time it received).
    """
    msg = pb.RoutingTableEntryMsg(
        type=e.type.name,
        opaque_payload=e.payload,
        position=e.position,
        snapshot_id=e.snapshot_id,
        client_name=e.client_name,
        partition_key=e.key or b"",
        origin_time=e.created_at if origin_time else 0.0,
    )
    if e.headers is not None:  # sent to sinks of HEADERS_VERSION on (lr_server.sending.outbound)
        msg.headers.update(decode_headers(e.headers))
    return msg


_NAMES = {t: t.name for t in ReplicationType}


def snapshot_entries(
    entries: Sequence[SendEntry], base_position: int, count: int
) -> list[pb.RoutingTableEntryMsg]:
    """A snapshot batch's entries: each stamped with the snapshot's base position, the
    end marker also with its entry count. One constructor call per entry."""
    make, names, last = pb.RoutingTableEntryMsg, _NAMES, ReplicationType.LAST_FULL_SYNC_ENTRY
    return [
        make(
            type=names[e.type],
            opaque_payload=e.payload,
            position=e.position,
            snapshot_id=e.snapshot_id,
            client_name=e.client_name,
            base_position=base_position,
            snapshot_count=count if e.type is last else 0,
            partition_key=e.key or b"",
        )
        for e in entries
    ]


def relays(cascade: Mapping[str, CascadeNode], source_id: str) -> list[pb.RelayedClient]:
    """The clients a session relays for their origin (its node is a branch)."""
    return [
        pb.RelayedClient(client_name=name, origin_id=node.origin_id)
        for name, node in sorted(cascade.items())
        if node.origin_id != source_id
    ]


def log_batch(
    batch_id: int,
    source_id: str,
    client: str,
    entries: Sequence[SendEntry],
    previous: int,
    origin_time: bool = False,
) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=batch_id,
        source_id=source_id,
        client_name=client,
        kind=pb.BATCH_LOG_ENTRY,
        first_position=entries[0].position,
        last_position=entries[-1].position,
        previous_position=previous,
        entries=[entry(e, origin_time) for e in entries],
    )


def lane_batch(
    batch_id: int,
    source_id: str,
    client: str,
    lane: int,
    lanes: int,
    entries: Sequence[SendEntry],
    previous: int,
    low_water: int,
) -> pb.ReplicationBatch:
    """A log batch of one lane; without entries, it only tells the sink ``low_water``."""
    return pb.ReplicationBatch(
        batch_id=batch_id,
        source_id=source_id,
        client_name=client,
        kind=pb.BATCH_LOG_ENTRY,
        first_position=entries[0].position if entries else previous,
        last_position=entries[-1].position if entries else previous,
        previous_position=previous,
        entries=[entry(e) for e in entries],
        lane=lane,
        lanes=lanes,
        low_water=low_water,
    )


def snapshot_batch(
    batch_id: int,
    source_id: str,
    client: str,
    snapshot_id: str,
    entries: Sequence[SendEntry],
    previous: int,
    wire: list[pb.RoutingTableEntryMsg],
) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=batch_id,
        source_id=source_id,
        client_name=client,
        kind=pb.BATCH_SNAPSHOT,
        snapshot_id=snapshot_id,
        first_position=entries[0].position,
        last_position=entries[-1].position,
        previous_position=previous,
        entries=wire,
    )


def notice_batch(batch_id: int, source_id: str, client: str, notice: Notice) -> pb.ReplicationBatch:
    """A drop notice: one ``STREAM_DROPPED`` entry at the first position that may be missing."""
    msg = pb.RoutingTableEntryMsg(
        type=ReplicationType.STREAM_DROPPED.name,
        opaque_payload=notice.reason.encode(),
        position=notice.first_dropped_position,
        snapshot_id=notice.notice_id,
        client_name=client,
    )
    return pb.ReplicationBatch(
        batch_id=batch_id,
        source_id=source_id,
        client_name=client,
        kind=pb.BATCH_DROP_NOTICE,
        snapshot_id=notice.notice_id,
        first_position=notice.first_dropped_position,
        last_position=notice.first_dropped_position,
        entries=[msg],
    )


__all__ = [
    "entry",
    "log_batch",
    "notice_batch",
    "sink_states",
    "snapshot_batch",
    "snapshot_entries",
]
