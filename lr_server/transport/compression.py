"""Compression negotiated per destination: a transport wrapper (see
:mod:`lr_server.protocol.codecs`).

:func:`compressing` wraps a destination's transport factory: each transport
offers the configured codec at negotiation, and its streams compress batches
with it once the sink accepted it; a sink that did not (older than protocol
6, or without the codec) gets them uncompressed.
"""

from __future__ import annotations

from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_server.protocol.codecs import NONE, check_codec, pack
from lr_server.transport.base import BatchStream, Transport


class Negotiated:
    """A destination's codec: the one configured, once its sink accepted it at the last
    negotiation ("" until then, and when it did not)."""

    def __init__(self, configured: str) -> None:
        self.configured = configured
        self.codec = ""


class CompressingStream(BatchStream):
    """Sends batches compressed with the negotiated codec, if any."""

    def __init__(self, inner: BatchStream, choice: Negotiated) -> None:
        self.inner, self.choice = inner, choice

    def send(self, batch: pb.ReplicationBatch) -> None:
        codec = self.choice.codec
        self.inner.send(pack(batch, codec) if codec else batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        return self.inner.next_ack(timeout)

    def close(self) -> None:
        self.inner.close()

    def interrupt(self) -> None:
        self.inner.interrupt()


class CompressingTransport(Transport):
    """Offers the configured codec at negotiation; its streams compress with it if the
    sink accepted it. The transports of one destination's lanes share ``choice``."""

    def __init__(self, inner: Transport, choice: Negotiated) -> None:
        self.inner, self.choice = inner, choice

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        offer = pb.NegotiateRequest()
        offer.CopyFrom(request)
        offer.codecs[:] = [self.choice.configured]
        response = self.inner.negotiate(offer, timeout)
        self.choice.codec = (
            self.choice.configured if self.choice.configured in response.codecs else ""
        )
        return response

    def open_stream(self) -> BatchStream:
        return CompressingStream(self.inner.open_stream(), self.choice)

    def close(self) -> None:
        self.inner.close()


def compressing(factory: Callable[[], Transport], codec: str) -> Callable[[], Transport]:
    """``factory``'s transports, compressing with ``codec`` where the sink accepts it
    (``factory`` itself for ``none``)."""
    if codec == NONE:
        return factory
    check_codec(codec)
    choice = Negotiated(codec)
    return lambda: CompressingTransport(factory(), choice)


__all__ = ["CompressingStream", "CompressingTransport", "Negotiated", "compressing"]
