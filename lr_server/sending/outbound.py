"""A batch leaving a sender session: counted in flight, checked against what the sink
speaks, then sent.

Every batch :class:`~lr_server.sending.shipping.Shipper` sends goes through :func:`send`:
it refuses entries with headers to a sink of a wire protocol older than
:data:`~lr_server.protocol.versions.HEADERS_VERSION` (that sink would drop them unseen),
before anything is counted or sent; with tracing on, the send is the batch's
``lr.ship`` span (:mod:`lr_client.tracing`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from lr_client import tracing
from lr_client._proto import replication_pb2 as pb
from lr_client.records import SendEntry
from lr_server import metrics
from lr_server.protocol import versions as protocol
from lr_server.sending.window import InFlight, Window
from lr_server.transport.base import BatchStream


def send(
    window: Window,
    destination: str,
    peer_version: int,
    stream: BatchStream,
    batch: pb.ReplicationBatch,
    name: str,
    entries: Sequence[SendEntry],
    is_end: bool = False,
    lane: int = 0,
    low_water: int = 0,
    read_at: float = 0.0,
) -> None:
    """Count ``batch`` in flight (``lane``, ``low_water``: a lane batch's), then send it.
    ``read_at``: when its entries were read (``time.time()``; 0: not known), for the
    latency of a log batch's stages before the send (:mod:`lr_client.latency`)."""
    if peer_version < protocol.HEADERS_VERSION and any(e.headers is not None for e in entries):
        protocol.require("headers", peer_version, repr(destination))
    queued = sending = -1.0
    if read_at and entries and batch.kind == pb.BATCH_LOG_ENTRY and not batch.replay:
        queued, sending = read_at - entries[0].created_at, time.time() - read_at
    window.add(
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
            lane,
            low_water,
            queued=queued,
            sending=sending,
        )
    )
    metrics.INFLIGHT_BATCHES.labels(destination).set(len(window))
    contexts = ((e.position, e.headers) for e in entries)
    with tracing.batch_span("lr.ship", batch.source_id, name, contexts, **{"lr.to": destination}):
        stream.send(batch)


__all__ = ["send"]
