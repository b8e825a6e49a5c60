"""What a sender session holds per client, and the states it reports."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

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
class Lanes:
    """A client's log entries shipped over ``count`` lanes (one connection's worth).

    ``chunks`` are the ranges sent, in position order: (the last position of
    the range, the ids of its batches not acknowledged yet). Once the oldest
    ranges are wholly acknowledged, ``acked`` moves to their end: every entry
    up to it was acknowledged, on whatever lane.
    """

    count: int
    start: int  # where the lanes began (the stream's position then)
    sent: list[int] = field(default_factory=list)  # per lane: last position sent
    chunks: deque[tuple[int, set[int]]] = field(default_factory=deque)
    acked: int = 0  # every entry up to it acknowledged
    marked: int = 0  # the highest ``low_water`` sent
    cursor: int = 0  # the highest ``low_water`` acknowledged: the sink holds it
    barrier: int = 0  # the id of an unkeyed batch in flight (nothing else goes), or 0

    @classmethod
    def at(cls, count: int, position: int) -> Lanes:
        return cls(count, position, [position] * count, deque(), position, position, position)

    def settled(self, batch_id: int, low_water: int) -> bool:
        """Note an acknowledged lane batch; whether the stream's cursor may rise (to ``cursor``)."""
        if self.barrier == batch_id:
            self.barrier = 0
        for _, ids in self.chunks:
            ids.discard(batch_id)
        while self.chunks and not self.chunks[0][1]:
            self.acked = self.chunks.popleft()[0]
        if low_water > self.cursor:
            self.cursor = low_water
            return True
        return False


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
    #: The last read found no more entries than it returned: when the state it saw was
    #: current at the latest (``time.monotonic()``) and the position it read up to. Once
    #: sent up to there, there is nothing new to read until a wake-up rings after it
    #: (``Shipper.read_log``). None: the last read may have left some.
    caught_up: tuple[float, int] | None = None
    notice: Notice | None = None  # sent before the stream's next batch
    stop_reason: str = ""
    lanes: Lanes | None = None  # shipped over several lanes: their state


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


__all__ = ["ClientStream", "Lanes", "Mode", "Notice", "SessionState", "summary"]
