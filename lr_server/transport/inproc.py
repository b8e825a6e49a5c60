"""In-process transport: calls a :class:`~lr_server.receiving.receiver.Receiver` directly (for
tests)."""

from __future__ import annotations

import queue
import threading

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import LRError, TransportError
from lr_server.receiving.receiver import Receiver
from lr_server.transport.base import BatchStream, Transport


class InProcessStream(BatchStream):
    def __init__(self, transport: InProcessTransport) -> None:
        self._transport = transport
        self._acks: queue.Queue[pb.ReplicationAck | BaseException | None] = queue.Queue()
        self._closed = False

    def send(self, batch: pb.ReplicationBatch) -> None:
        if self._closed or not self._transport.up.is_set():
            raise TransportError("sink is down")
        try:
            # Round-trip through bytes, as the wire would.
            wire = pb.ReplicationBatch.FromString(batch.SerializeToString())
            ack = self._transport.receiver.apply(self._transport.source_id, wire)
        except LRError as exc:
            self._acks.put(exc)
            return
        self._acks.put(ack)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        try:
            item = self._acks.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def interrupt(self) -> None:
        self._acks.put(None)  # the wait returns None

    def close(self) -> None:
        self._closed = True


class InProcessTransport(Transport):
    """A sink in the same process; ``up`` can be cleared to simulate an outage."""

    def __init__(self, receiver: Receiver, source_id: str) -> None:
        self.receiver = receiver
        self.source_id = source_id
        self.up = threading.Event()
        self.up.set()

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        if not self.up.is_set():
            raise TransportError("sink is down")
        return self.receiver.negotiate(self.source_id, request)

    def open_stream(self) -> BatchStream:
        if not self.up.is_set():
            raise TransportError("sink is down")
        return InProcessStream(self)
