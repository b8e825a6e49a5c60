"""A session's in-flight window: unacknowledged batches, their limits, ack matching.

Batches are numbered in the order they are sent; the sink acknowledges them in
that order, so an ack for batch ``n`` settles every batch up to ``n``. With
several streams (lanes), that holds per stream: an ack on stream ``i`` settles
the batches of stream ``i`` up to ``n``, and each stream has its own limits. The
cursors that settled log batches move to are coalesced: a cursor persisted
late only delays trim (the sink skips what it already has), while a write per
ack would compete with the application's transactions for the database.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from lr_client._proto import replication_pb2 as pb

FLUSH_INTERVAL = 0.1  # seconds between cursor writes (one per acknowledgement at live rates)


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
    lane: int = 0  # 0: the whole stream; else the lane of a log batch
    low_water: int = 0  # a lane batch's: every entry up to it was acknowledged when sent
    replay: bool = False  # entries shipped again (lr_server.sending.replay): no cursor moves
    queued: float = -1.0  # a log batch's first entry: seconds from its transmit to its read
    sending: float = -1.0  # and from its read to the send (-1: not known)

    @property
    def stream(self) -> int:
        """The index of the stream it travels on."""
        return max(self.lane, 1) - 1


class Window:
    """The unacknowledged batches of one connection and the cursors waiting to be saved."""

    def __init__(
        self, max_batches: int, max_bytes: int, streams: int = 1, batch_entries: int = 0
    ) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.streams = streams
        self.batch_entries = batch_entries  # with streams: what a full batch holds
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
        """Whether the window is full, counting ``batches`` / ``nbytes`` about to be sent
        (with several streams: every stream's limits together)."""
        if self.nbytes + nbytes >= self.max_bytes * self.streams:
            return True
        if self.batch_entries:  # lanes: counted in full batches' worth of entries
            held = sum(f.entries for f in self.batches) + batches * self.batch_entries
            return held >= self.max_batches * self.streams * self.batch_entries
        return len(self.batches) + batches >= self.max_batches * self.streams

    def stream_full(self, stream: int) -> bool:
        """Whether stream ``stream``'s own window is full: ``max_batches`` full batches'
        worth of entries (a lane's batches are cut from shared reads, so some are
        short), or ``max_bytes``."""
        mine = [f for f in self.batches if f.stream == stream]
        if sum(f.nbytes for f in mine) >= self.max_bytes:
            return True
        if self.batch_entries:
            return sum(f.entries for f in mine) >= self.max_batches * self.batch_entries
        return len(mine) >= self.max_batches

    def busy(self, client: str, lanes_only: bool = False) -> bool:
        """Whether a batch of ``client`` (a lane batch, with ``lanes_only``) is unacknowledged."""
        return any(f.client == client and (f.lane or not lanes_only) for f in self.batches)

    def oldest_sent_at(self) -> float | None:
        return self.batches[0].sent_at if self.batches else None

    def holds(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` (or an earlier one) is still unacknowledged."""
        return bool(self.batches) and self.batches[0].batch_id <= batch_id

    def acknowledge(self, batch_id: int, stream: int = 0) -> list[InFlight]:
        """The batches an ack for ``batch_id`` on ``stream`` settles, oldest first, taken
        out of the window."""
        done: list[InFlight] = []
        if self.streams == 1:
            while self.batches and self.batches[0].batch_id <= batch_id:
                done.append(self.batches.popleft())
            return done
        kept: deque[InFlight] = deque()
        for f in self.batches:
            (done if f.stream == stream and f.batch_id <= batch_id else kept).append(f)
        self.batches = kept
        return done

    def coalesce(self, done: Iterable[InFlight]) -> None:
        """Note where settled log batches move their clients' cursors.

        The end of a snapshot discards what log acks from before it would
        set: the cursor must not move past the snapshot's base.
        """
        log_cursors: dict[str, int] = {}
        for f in done:
            if f.kind == pb.BATCH_LOG_ENTRY:
                if f.lane or f.replay:  # a lane's cursor: the lowest acknowledged on all
                    continue
                log_cursors[f.client] = f.last_position
            elif f.is_end:  # a snapshot's end marker
                log_cursors.pop(f.client, None)
                self.cursors.pop(f.client, None)
        self.cursors.update(log_cursors)

    def flush_due(self, now: float) -> bool:
        """Whether to save the pending cursors now: ``FLUSH_INTERVAL`` s passed since the
        last save (at live rates a batch is acknowledged every millisecond or so, each
        alone in the window: a write per acknowledgement would cost more than the batch)."""
        return bool(self.cursors) and now - self.flushed_at > FLUSH_INTERVAL

    def flush_in(self, now: float) -> float | None:
        """Seconds until the pending cursors are due to be saved (None: none pending)."""
        if not self.cursors:
            return None
        return max(0.0, self.flushed_at + FLUSH_INTERVAL + 0.001 - now)

    def flushed(self, now: float) -> None:
        """The pending cursors were saved at ``now``."""
        self.cursors.clear()
        self.flushed_at = now

    def clear(self) -> None:
        """Forget the connection's batches and unsaved cursors (the sink is asked again)."""
        self.batches.clear()
        self.cursors.clear()


__all__ = ["FLUSH_INTERVAL", "InFlight", "Window"]
