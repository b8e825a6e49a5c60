"""A session's in-flight window: unacknowledged batches, their limits, ack matching.

Batches are numbered in the order they are sent; the sink acknowledges them in
that order, so an ack for batch ``n`` settles every batch up to ``n``. The
cursors that settled log batches move to are coalesced: a cursor persisted
late only delays trim (the sink skips what it already has), while a write per
ack would compete with the application's transactions for the database.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from lr_client._proto import replication_pb2 as pb

FLUSH_INTERVAL = 0.1  # seconds between cursor writes while batches are in flight


@dataclass
class InFlight:
    batch_id: int
    client: str
    kind: int
    last_position: int
    entries: int
    nbytes: int
    sent_at: float
    snapshot_id: str = ""
    is_end: bool = False


class Window:
    """The unacknowledged batches of one connection and the cursors waiting to be saved."""

    def __init__(self, max_batches: int, max_bytes: int) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.batches: deque[InFlight] = deque()
        self.cursors: dict[str, int] = {}  # client -> acknowledged position, not saved yet
        self.flushed_at = 0.0
        self._batch_id = 0

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.batches)

    def next_batch_id(self) -> int:
        """Ids grow across reconnections: an ack always names a batch of this connection."""
        self._batch_id += 1
        return self._batch_id

    def add(self, batch: InFlight) -> None:
        self.batches.append(batch)

    def full(self, batches: int = 0, nbytes: int = 0) -> bool:
        """Whether the window is full, counting ``batches`` / ``nbytes`` about to be sent."""
        return len(self.batches) + batches >= self.max_batches or (
            self.nbytes + nbytes >= self.max_bytes
        )

    def oldest_sent_at(self) -> float | None:
        return self.batches[0].sent_at if self.batches else None

    def holds(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` (or an earlier one) is still unacknowledged."""
        return bool(self.batches) and self.batches[0].batch_id <= batch_id

    def acknowledge(self, batch_id: int) -> list[InFlight]:
        """The batches an ack for ``batch_id`` settles, oldest first, taken out of the window."""
        done: list[InFlight] = []
        while self.batches and self.batches[0].batch_id <= batch_id:
            done.append(self.batches.popleft())
        return done

    def coalesce(self, done: Iterable[InFlight]) -> None:
        """Note where settled log batches move their clients' cursors.

        The end of a snapshot discards what log acks from before it would
        set: the cursor must not move past the snapshot's base.
        """
        log_cursors: dict[str, int] = {}
        for f in done:
            if f.kind == pb.BATCH_LOG_ENTRY:
                log_cursors[f.client] = f.last_position
            elif f.is_end:  # a snapshot's end marker
                log_cursors.pop(f.client, None)
                self.cursors.pop(f.client, None)
        self.cursors.update(log_cursors)

    def flush_due(self, now: float) -> bool:
        """Whether to save the pending cursors now: the window is empty, or a while passed."""
        return bool(self.cursors) and (not self.batches or now - self.flushed_at > FLUSH_INTERVAL)

    def flushed(self, now: float) -> None:
        """The pending cursors were saved at ``now``."""
        self.cursors.clear()
        self.flushed_at = now

    def clear(self) -> None:
        """Forget the connection's batches and unsaved cursors (the sink is asked again)."""
        self.batches.clear()
        self.cursors.clear()


__all__ = ["FLUSH_INTERVAL", "InFlight", "Window"]
