"""What a sender session holds per client, and the states it reports."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from lr_client.records import SnapshotRequest
from lr_server.config import ClientConfig


class Mode(enum.StrEnum):
    """What one client's stream ships now."""

    LOG = "log_entry_sync"
    SNAPSHOT = "snapshot_sync"  # waiting for or shipping a snapshot
    STOPPED = "stream_stopped"  # the sink lacks entries the source no longer holds; no provider


class SessionState(enum.StrEnum):
    """A session's state, as written to ``lrq_session_status``."""

    STARTING = "starting"
    CONNECTED = "connected"
    LOG_ENTRY_SYNC = "log_entry_sync"
    SNAPSHOT_SYNC = "snapshot_sync"  # a client waits for or ships a snapshot
    STREAM_STOPPED = "stream_stopped"  # a client's stream is stopped (reason in last_error)
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"


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


def summary(streams: Iterable[ClientStream]) -> tuple[SessionState, str]:
    """The session's state from its clients' modes, and why streams are stopped."""
    streams = list(streams)
    modes = {cs.mode for cs in streams}
    stopped = "; ".join(cs.stop_reason for cs in streams if cs.mode is Mode.STOPPED)
    if Mode.SNAPSHOT in modes:
        return SessionState.SNAPSHOT_SYNC, stopped
    if Mode.STOPPED in modes:
        return SessionState.STREAM_STOPPED, stopped
    return SessionState.LOG_ENTRY_SYNC, stopped


__all__ = ["ClientStream", "Mode", "Notice", "SessionState", "summary"]
