"""Several streams to one destination, one per lane, behind the transport seam.

:class:`LaneTransport` opens one :class:`~lr_server.transport.base.Transport`
per lane (with gRPC, each on its own connection), negotiates over the first
and opens a stream on each. :class:`LaneStreams` sends a batch on its lane's
stream (lane 0, a snapshot's or a drop notice's batch, and lane 1 share the
first) and hands back each acknowledgement with the index of the stream it
came on (a thread per stream waits for them): acknowledgements are
cumulative per stream only. A stream's error is raised by the next call
for an acknowledgement; the session then closes them all.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_server.transport.base import BatchStream, Transport

_WAIT = 0.2  # seconds a waiter blocks on its stream before looking whether it is closed


def stream_index(lane: int) -> int:
    """The stream a batch of ``lane`` travels on (lane 0 and lane 1: the first)."""
    return max(lane, 1) - 1


class LaneStreams(BatchStream):
    """One open stream per lane; a thread per stream hands its acknowledgements over."""

    def __init__(self, streams: list[BatchStream]) -> None:
        self.streams = streams
        #: None: :meth:`interrupt` (the wait returns None).
        self._acks: queue.Queue[tuple[int, pb.ReplicationAck | BaseException] | None] = (
            queue.Queue()
        )
        self._closed = threading.Event()
        self._waiters = [
            threading.Thread(target=self._wait, args=(i,), name=f"lr-lane-acks-{i}", daemon=True)
            for i in range(len(streams))
        ]
        for t in self._waiters:
            t.start()

    def _wait(self, index: int) -> None:
        stream = self.streams[index]
        while not self._closed.is_set():
            try:
                ack = stream.next_ack(_WAIT)
            except BaseException as exc:  # handed to the session, which reconnects
                self._acks.put((index, exc))
                return
            if ack is not None:
                self._acks.put((index, ack))

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.streams[stream_index(batch.lane)].send(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        got = self.next_ack_from(timeout)
        return None if got is None else got[1]

    def next_ack_from(self, timeout: float) -> tuple[int, pb.ReplicationAck] | None:
        """The next acknowledgement of any stream and that stream's index, or None."""
        try:
            got = self._acks.get(timeout=timeout) if timeout > 0 else self._acks.get_nowait()
        except queue.Empty:
            return None
        if got is None:
            return None
        index, item = got
        if isinstance(item, BaseException):
            raise item
        return index, item

    def interrupt(self) -> None:
        self._acks.put(None)

    def close(self) -> None:
        self._closed.set()
        for s in self.streams:
            s.close()
        for t in self._waiters:
            t.join(timeout=5)


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
