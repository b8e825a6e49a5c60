"""Hand-made gRPC calls to a sink's ``LogReplication`` service, for tests at the wire.

Calls whose messages the test sends when it wants (or never): a ``Negotiate``
opened as a client stream, a ``Replicate`` stream, a flood of idle ones.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from lr_client._proto import replication_pb2 as pb

NEGOTIATE = "/lr.v1.LogReplication/Negotiate"
REPLICATE = "/lr.v1.LogReplication/Replicate"
#: More idle calls of each method than the fixed pool of 16 threads the server once had.
FLOOD = 40
#: Generous: the CI machine is busy.
DEADLINE = 60.0

Metadata = list[tuple[str, str]]


def token_meta(source: str, token: str | None = None) -> Metadata:
    return [("x-lr-source", source), ("authorization", f"Bearer {token or 'token-' + source}")]


class Feed:
    """A request stream the test controls: ``put`` a message, ``end`` the stream."""

    def __init__(self) -> None:
        self._items: queue.Queue[Any] = queue.Queue()
        self.sent = 0

    def put(self, item: Any) -> None:
        self._items.put(item)

    def end(self) -> None:
        self._items.put(None)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._items.get()
            if item is None:
                return
            self.sent += 1
            yield item


class Calls:
    """Hand-made calls to a sink; all cancelled and closed at the end."""

    def __init__(self, target: str, credentials: grpc.ChannelCredentials | None = None) -> None:
        self.target = target
        self.credentials = credentials
        self.feeds: list[Feed] = []
        self.calls: list[Any] = []
        self.channels: list[grpc.Channel] = []

    def channel(self) -> grpc.Channel:
        # Each channel its own TCP connection.
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "sink")]
        if self.credentials is None:
            ch = grpc.insecure_channel(self.target, options=options)
        else:
            ch = grpc.secure_channel(self.target, self.credentials, options=options)
        self.channels.append(ch)
        return ch

    def negotiate(self, meta: Metadata, channel: grpc.Channel | None = None) -> tuple[Any, Feed]:
        """A Negotiate call opened as a client stream: its request is sent only on ``put``."""
        feed = Feed()
        call = (channel or self.channel()).stream_unary(
            NEGOTIATE,
            request_serializer=pb.NegotiateRequest.SerializeToString,
            response_deserializer=pb.NegotiateResponse.FromString,
        )
        future = call.future(iter(feed), metadata=meta)
        self.feeds.append(feed)
        self.calls.append(future)
        return future, feed

    def replicate(self, meta: Metadata, channel: grpc.Channel | None = None) -> tuple[Any, Feed]:
        feed = Feed()
        call = (channel or self.channel()).stream_stream(
            REPLICATE,
            request_serializer=pb.ReplicationBatch.SerializeToString,
            response_deserializer=pb.ReplicationAck.FromString,
        )(iter(feed), metadata=meta)
        self.feeds.append(feed)
        self.calls.append(call)
        return call, feed

    def flood(self, meta: Metadata, n: int = FLOOD) -> list[Any]:
        """``n`` idle Negotiate and ``n`` idle Replicate calls over a few connections."""
        out = []
        channels = [self.channel() for _ in range(8)]
        for i in range(n):
            out.append(self.negotiate(meta, channels[i % 8])[0])
            out.append(self.replicate(meta, channels[i % 8])[0])
        return out

    def close(self) -> None:
        for feed in self.feeds:
            feed.end()
        for call in self.calls:
            call.cancel()
        for ch in self.channels:
            ch.close()


def code_of(call: Any, timeout: float = DEADLINE) -> grpc.StatusCode:
    """The final status of a call, waiting for it to end."""
    exc = call.exception(timeout=timeout)
    return grpc.StatusCode.OK if exc is None else exc.code()


def next_ack(call: Any) -> pb.ReplicationAck:
    """The next acknowledgement of a Replicate call (grpc's iterator blocks until it comes)."""
    result: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        try:
            result.put(next(call, None))
        except grpc.RpcError as exc:
            result.put(exc)

    threading.Thread(target=read, daemon=True).start()
    ack = result.get(timeout=DEADLINE)
    assert isinstance(ack, pb.ReplicationAck), ack
    return ack
