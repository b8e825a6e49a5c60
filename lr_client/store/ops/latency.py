"""Per-stage latency of a hop, as the processes that measure it record it (revision 0017).

``lrq_stage_latency``: one row per (peer, client, stage), rewritten by the process that
measures the stage at most every few seconds while batches go through it: the sender
session of a destination (stages ``queued``, ``sent``, ``stored``; the peer is the
destination) and a subscriber of a receive queue (stage ``applied``; the peer is the
source). Each row sums up the stage's last batches: how many, the median, the 99th
percentile and the largest, in seconds. ``lr status`` shows them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Column, Double, Integer, PrimaryKeyConstraint, String, Table, select

from lr_client.store.role import Role
from lr_client.store.schema.metadata import metadata

stage_latency = Table(
    "lrq_stage_latency",
    metadata,
    Column("peer", String(63), nullable=False),  # the destination, or the source
    Column("client_name", String(63), nullable=False),
    Column("stage", String(16), nullable=False),
    Column("batches", Integer, nullable=False),  # the batches summed up
    Column("p50", Double, nullable=False),  # seconds
    Column("p99", Double, nullable=False),
    Column("max", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    PrimaryKeyConstraint("peer", "client_name", "stage"),
)


@dataclass(frozen=True, slots=True)
class StageLatency:
    """One stage of one (peer, client) hop over its last ``batches`` batches."""

    peer: str
    client_name: str
    stage: str
    batches: int
    p50: float
    p99: float
    max: float
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StageLatencyStore(Role):
    """``lrq_stage_latency`` rows."""

    def save_stage_latency(self, rows: Sequence[StageLatency]) -> None:
        now = time.time()
        with self.core.write() as conn:
            for row in rows:
                values = {**row.to_dict(), "updated_at": now}
                self.core.upsert(conn, stage_latency, values, ["peer", "client_name", "stage"])

    def list_stage_latency(self) -> list[StageLatency]:
        t = stage_latency
        with self.core.read() as conn:
            found = conn.execute(select(t).order_by(t.c.peer, t.c.client_name, t.c.stage)).all()
        return [StageLatency(**r._mapping) for r in found]


__all__ = ["StageLatency", "StageLatencyStore", "stage_latency"]
