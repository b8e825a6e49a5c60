"""The records ``lr status`` shows (``--json``: :meth:`SiteStatus.to_dict`): a site's
send streams, sink streams, sender sessions and cascaded clients, as
:func:`lr_server.ops.status.collect_status` reads them."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from lr_client.records import QueueSlot, SnapshotRequest


class StreamState(enum.StrEnum):
    """Where a send stream stands, as ``lr status`` shows it."""

    NOT_CONFIGURED = "not configured"
    LOG_ENTRY_SYNC = "log entry sync"
    SNAPSHOT_SYNC = "snapshot sync"
    DROPPED = "dropped"
    STOPPED = "stopped"
    BACKPRESSURE = "backpressure"


@dataclass(frozen=True)
class SnapshotView:
    """One destination's view of a snapshot request: ``lr snapshot list``, and ``lr status``
    for a stream with an open one."""

    snapshot_id: str
    destination: str
    client: str
    status: str
    base_position: int | None
    rows_written: int
    entry_count: int | None
    shipped_position: int
    reason: str
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, x: SnapshotRequest) -> SnapshotView:
        """The view of the store's record."""
        return cls(
            snapshot_id=x.snapshot_id,
            destination=x.destination,
            client=x.client_name,
            status=x.status.value,
            base_position=x.base_position,
            rows_written=x.rows_written,
            entry_count=x.entry_count,
            shipped_position=x.shipped_position,
            reason=x.reason,
            created_at=x.created_at,
            updated_at=x.updated_at,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr snapshot list --json`` prints for it."""
        return asdict(self)


@dataclass
class DropInfo:
    first_dropped_position: int
    dropped_at: float
    reason: str


@dataclass
class StopInfo:
    reason: str
    resume_after: int
    stopped_at: float
    accepted: bool


@dataclass
class SessionInfo:
    """One row of ``lrq_session_status`` (written by the running server)."""

    destination: str
    state: str = ""
    connected: bool = False
    inflight_batches: int = 0
    inflight_bytes: int = 0
    last_error: str = ""
    updated_at: float = 0.0


@dataclass
class SendStream:
    destination: str
    client: str
    state: StreamState
    cursor: int
    lag_entries: int
    lag_bytes: int
    lag_seconds: float
    slow: bool
    last_ack: float | None
    inflight_batches: int | None  # None: no session has reported for the destination
    configured: bool
    snapshot: SnapshotView | None = None
    drop: DropInfo | None = None
    stop: StopInfo | None = None
    owner: str = ""  # the member that owns the stream's lease ("": none)


@dataclass
class SinkStream:
    source: str
    client: str
    queue: str
    last_position: int
    snapshot_state: str
    snapshot_id: str
    snapshot_position: int
    entries_received: int
    queue_depth: int
    updated_at: float
    configured: bool
    drop: DropInfo | None = None  # the last drop notice received


@dataclass
class CascadeChildInfo:
    """A node below this one, as it last reported itself (``lrq_cascade_children``)."""

    child_id: str
    epoch: int
    local_watermark: int
    acked_position: int
    reported_at: float | None  # None: never reported
    report_age: float | None
    dropped: bool
    counts: bool  # still part of the watermarks (see lr_server.cascade.watermarks)


@dataclass
class CascadeInfo:
    """This node's place in a cascaded client's set (``lrq_cascade``)."""

    client: str
    origin: str
    role: str
    provider: str
    epoch: int
    config_provider: str
    local_watermark: int
    global_watermark: int
    children: list[CascadeChildInfo] = field(default_factory=list)


@dataclass
class SiteStatus:
    site: str
    time: float
    head_position: int
    oldest_position: int | None
    sessions_known: bool
    sessions: list[SessionInfo] = field(default_factory=list)
    send: list[SendStream] = field(default_factory=list)
    sink: list[SinkStream] = field(default_factory=list)
    slots: list[QueueSlot] = field(default_factory=list)  # PostgreSQL's queue partitions
    cascades: list[CascadeInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``lr status --json``)."""
        return asdict(self)


__all__ = [
    "CascadeChildInfo",
    "CascadeInfo",
    "DropInfo",
    "SendStream",
    "SessionInfo",
    "SinkStream",
    "SiteStatus",
    "SnapshotView",
    "StopInfo",
    "StreamState",
]
