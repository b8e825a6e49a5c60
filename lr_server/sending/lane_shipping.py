"""A client's log entries shipped over several lanes (``streams_per_destination``).

Keyed entries go on the lane their key hashes to (:func:`lr_client.lanes.lane_of`), a
batch per lane within the batch limits; an unkeyed entry waits until nothing of its
client is in flight and goes alone on lane 1, a barrier nothing passes until it is
acknowledged. Each lane batch carries ``low_water``, the position acknowledged on every
lane, to which the sink raises its own (docs/internals/lanes.md).
"""

from __future__ import annotations

from typing import Protocol

from lr_client._proto import replication_pb2 as pb
from lr_client.lanes import lane_of
from lr_client.records import SendEntry
from lr_client.store.byte_bounds import ByteCut
from lr_server.config import ReplicationConfig
from lr_server.sending import wire
from lr_server.sending.streams import ClientStream, Lanes, Mode
from lr_server.sending.window import Window
from lr_server.transport.base import BatchStream


class SendLaneBatch(Protocol):
    """How a lane batch is sent (:meth:`lr_server.sending.shipping.Shipper.send`)."""

    def __call__(
        self,
        stream: BatchStream,
        batch: pb.ReplicationBatch,
        name: str,
        entries: list[SendEntry],
        *,
        lane: int,
        low_water: int,
    ) -> None: ...


class SourceOf(Protocol):
    """The source id of a client's batches (:meth:`~.shipping.Shipper.source_of`)."""

    def __call__(self, name: str) -> str: ...


class LaneShipper:
    """Sends the log entries of one destination's clients shipped over lanes."""

    def __init__(
        self, cfg: ReplicationConfig, window: Window, source_of: SourceOf, send: SendLaneBatch
    ) -> None:
        self.cfg = cfg
        self.window = window
        self.source_of = source_of
        self.send = send

    def may_ship(self, name: str, cs: ClientStream) -> bool:
        """Whether a client shipped over lanes may send now (see docs/architecture.md).

        A drop notice waits until nothing of the client is in flight, a snapshot
        until no lane batch is; log entries wait while an unkeyed batch is in
        flight or any lane's window is full.
        """
        if cs.notice is not None:
            return not self.window.busy(name)
        if cs.mode is Mode.SNAPSHOT:
            return not self.window.busy(name, lanes_only=True)
        if cs.mode is not Mode.LOG:
            return True
        count = self.cfg.streams_per_destination
        ls = cs.lanes
        if ls is None or (ls.acked != cs.sent and not self.window.busy(name)):
            # New, or the stream moved (a snapshot's end, an accepted loss): start again.
            ls = cs.lanes = Lanes.at(count, cs.sent)
        if ls.barrier:
            return False
        return not any(self.window.stream_full(i) for i in range(count))

    def send_entries(
        self, stream: BatchStream, name: str, cs: ClientStream, entries: list[SendEntry]
    ) -> list[SendEntry]:
        """Send entries on their lanes; those sent (a prefix).

        Keyed entries up to the first unkeyed one go at once, a batch per lane.
        Unkeyed entries go only when nothing of the client is in flight, alone
        on lane 1, and nothing else goes until they are acknowledged: they
        neither overtake nor are overtaken by any keyed entry.
        """
        ls = cs.lanes
        assert ls is not None
        unkeyed = next((i for i, e in enumerate(entries) if e.key is None), len(entries))
        if unkeyed == 0:
            if self.window.busy(name):
                return []
            end = next((i for i, e in enumerate(entries) if e.key is not None), len(entries))
            cut = ByteCut(self.cfg.batch_max_bytes)  # one batch: within the batch limits
            sent = []
            for e in entries[: min(end, self.cfg.batch_max_entries)]:
                if not cut.take(len(e.payload)):
                    break
                sent.append(e)
            ls.barrier = self.send_lane(stream, name, cs, 1, sent)
            ls.chunks.append((sent[-1].position, {ls.barrier}))
        else:
            sent = entries[:unkeyed]
            groups: dict[int, list[list[SendEntry]]] = {}
            cuts: dict[int, ByteCut] = {}
            for e in sent:  # each lane's entries, cut at the batch limits
                lane = lane_of(e.key, ls.count)
                batches = groups.setdefault(lane, [[]])
                cut = cuts.setdefault(lane, ByteCut(self.cfg.batch_max_bytes))
                if len(batches[-1]) >= self.cfg.batch_max_entries or not cut.take(len(e.payload)):
                    batches.append([])
                    cut = cuts[lane] = ByteCut(self.cfg.batch_max_bytes)
                    cut.take(len(e.payload))
                batches[-1].append(e)
            ids = {
                self.send_lane(stream, name, cs, lane, batch)
                for lane, batches in groups.items()
                for batch in batches
            }
            ls.chunks.append((sent[-1].position, ids))
        cs.sent = sent[-1].position
        return sent

    def send_lane(
        self, stream: BatchStream, name: str, cs: ClientStream, lane: int, entries: list[SendEntry]
    ) -> int:
        """Send one lane's batch (no entries: only the low-water mark); its id."""
        ls = cs.lanes
        assert ls is not None
        batch = wire.lane_batch(
            self.window.next_batch_id(),
            self.source_of(name),
            name,
            lane,
            ls.count,
            entries,
            ls.sent[lane - 1],
            ls.acked,
        )
        self.send(stream, batch, name, entries, lane=lane, low_water=ls.acked)
        if entries:
            ls.sent[lane - 1] = entries[-1].position
        ls.marked = ls.acked
        return batch.batch_id

    def send_mark(self, stream: BatchStream, name: str, cs: ClientStream) -> bool:
        """Caught up and all acknowledged: tell the sink how far (its durable position)."""
        ls = cs.lanes
        if ls is None or ls.acked <= ls.marked or self.window.busy(name):
            return False
        self.send_lane(stream, name, cs, 1, [])
        return True


__all__ = ["LaneShipper", "SendLaneBatch", "SourceOf"]
