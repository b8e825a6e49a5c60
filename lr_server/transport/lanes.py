"""Several streams to one destination, one per lane, behind the transport seam.

:class:`LaneTransport` opens one :class:`~lr_server.transport.base.Transport`
per lane (with gRPC, each on its own connection), negotiates over the first
and opens a stream on each. :class:`LaneStreams` sends a batch on its lane's
stream (lane 0, a snapshot's or a drop notice's batch, and lane 1 share the
first) and hands back each acknowledgement with the index of the stream it
came on: acknowledgements are cumulative per stream only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_server.transport.base import BatchStream, Transport

_SLICE = 0.002  # seconds to wait on one stream before looking at the others


def stream_index(lane: int) -> int:
    """The stream a batch of ``lane`` travels on (lane 0 and lane 1: the first)."""
    return max(lane, 1) - 1


class LaneStreams(BatchStream):
    """One open stream per lane."""

    def __init__(self, streams: list[BatchStream]) -> None:
        self.streams = streams
        self._next = 0

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.streams[stream_index(batch.lane)].send(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        got = self.next_ack_from(timeout)
        return None if got is None else got[1]

    def next_ack_from(self, timeout: float) -> tuple[int, pb.ReplicationAck] | None:
        """The next acknowledgement of any stream and that stream's index, or None."""
        deadline = time.monotonic() + timeout
        while True:
            n = len(self.streams)
            for k in range(n):  # round robin: no stream starves the others
                i = (self._next + k) % n
                ack = self.streams[i].next_ack(0.0)
                if ack is not None:
                    self._next = (i + 1) % n
                    return i, ack
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ack = self.streams[self._next].next_ack(min(left, _SLICE))
            if ack is not None:
                i = self._next
                self._next = (i + 1) % n
                return i, ack

    def close(self) -> None:
        for s in self.streams:
            s.close()


class LaneTransport(Transport):
    """``lanes`` transports to one destination, made by ``factory``."""

    def __init__(self, factory: Callable[[], Transport], lanes: int) -> None:
        self.transports: list[Transport] = []
        try:
            for _ in range(lanes):
                self.transports.append(factory())
        except BaseException:
            self.close()
            raise

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        return self.transports[0].negotiate(request, timeout)

    def open_stream(self) -> LaneStreams:
        streams: list[BatchStream] = []
        try:
            for t in self.transports:
                streams.append(t.open_stream())
        except BaseException:
            for s in streams:
                s.close()
            raise
        return LaneStreams(streams)

    def close(self) -> None:
        for t in self.transports:
            t.close()


__all__ = ["LaneStreams", "LaneTransport", "stream_index"]
