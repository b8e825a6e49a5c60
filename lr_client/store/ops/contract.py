"""The operator's role: read-only views, metrics reads and the sessions' status rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from lr_client.records import (
    QueueInfo,
    QueueSlot,
    StoredEntry,
)
from lr_client.store.ops.inspection import SinkBacklog, SinkFailures
from lr_client.store.ops.latency import StageLatency
from lr_client.store.ops.partition_lags import PartitionLag


class Inspection(Protocol):
    """Read-only views (``lr status``, ``lr browse``, metrics) and the sessions' status rows."""

    def sink_backlogs(self, client_name: str | None = None) -> list[SinkBacklog]:
        """Every receive queue's (of one client's) undelivered count and oldest arrival."""

    def sink_failures(self, client_name: str | None = None) -> SinkFailures:
        """Every receive queue's (of one client's) parked entries and blocked state."""

    def sink_partition_lags(self, client_name: str | None = None) -> list[PartitionLag]:
        """Every partition's (of one client's queues) entries above its delivered mark."""

    def save_session_status(
        self,
        destination: str,
        state: str,
        *,
        connected: bool,
        inflight_batches: int,
        inflight_bytes: int,
        last_error: str = "",
    ) -> None:
        """Record a sender session's state (one row per destination)."""

    def list_session_status(self) -> list[dict[str, Any]]:
        """The sender sessions' status rows, by destination."""

    def head_position_estimate(self) -> int:
        """The highest position assigned so far, read without waiting for transmitters
        (SQLite: it may count one whose transaction has not committed yet)."""

    def queue_depths(self) -> dict[int, int]:
        """{queue_id: entries waiting} of every non-empty receive queue."""

    def queue_sizes(self) -> tuple[int, int, list[tuple[QueueInfo, int]]]:
        """Entries in the send log, the snapshot queue, and each receive queue (by name)."""

    def queue_slots(self) -> list[QueueSlot]:
        """The send and receive queues' slots (PostgreSQL), in order; SQLite has none."""

    def browse_log_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Send log entries after ``after``; with ``destination``, those it still needs."""

    def browse_snapshot_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Snapshot queue entries after ``after`` (of one destination's, one client's)."""

    def browse_queue(self, queue_name: str, after: int, limit: int) -> list[StoredEntry] | None:
        """A receive queue's entries after ``seq`` ``after``; None if there is no such queue."""


class StageLatencies(Protocol):
    """The store's role for the per-stage latency rows (both ends of a hop)."""

    def save_stage_latency(self, rows: Sequence[StageLatency]) -> None:
        """Write ``rows`` (each replaces the row of its peer, client and stage)."""

    def list_stage_latency(self) -> list[StageLatency]:
        """Every row, by peer, client and stage."""


__all__ = ["Inspection", "StageLatencies"]
