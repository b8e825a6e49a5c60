"""The records ``lr status`` shows (``--json``: :meth:`SiteStatus.to_dict`): a site's
send streams, sink streams, sender sessions and cascaded clients, as
:func:`lr_server.ops.status.collect_status` reads them."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from lr_client.records import QueueSlot
from lr_client.snapshot_status import SnapshotInfo


class StreamState(enum.StrEnum):
    """Where a send stream stands, as ``lr status`` shows it."""

    NOT_CONFIGURED = "not configured"
    LOG_ENTRY_SYNC = "log entry sync"
    SNAPSHOT_SYNC = "snapshot sync"
    DROPPED = "dropped"
    STOPPED = "stopped"
    BACKPRESSURE = "backpressure"


#: The keys ``lr snapshot list --json`` and ``lr status --json`` printed before a
#: snapshot's record was :class:`SnapshotInfo`'s, and the field each now is: printed
#: beside the new ones for one more release (docs/upgrading.md).
DEPRECATED_SNAPSHOT_KEYS = {
    "client": "client_name",
    "status": "state",
    "entry_count": "rows_total",
    "shipped_position": "rows_shipped",
}


def snapshot_json(info: SnapshotInfo) -> dict[str, Any]:
    """A snapshot's JSON object: :meth:`SnapshotInfo.to_dict`, and the deprecated keys."""
    out = info.to_dict()
    out.update({old: out[new] for old, new in DEPRECATED_SNAPSHOT_KEYS.items()})
    return out


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
    snapshot: SnapshotInfo | None = None
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
        out = asdict(self)
        for stream, row in zip(self.send, out["send"], strict=True):
            if stream.snapshot is not None:
                row["snapshot"] = snapshot_json(stream.snapshot)
        return out


__all__ = [
    "DEPRECATED_SNAPSHOT_KEYS",
    "CascadeChildInfo",
    "CascadeInfo",
    "DropInfo",
    "SendStream",
    "SessionInfo",
    "SinkStream",
    "SiteStatus",
    "StopInfo",
    "StreamState",
    "snapshot_json",
]
