"""The transport seam: negotiate, then stream batches and receive cumulative acks.

Implementations raise only :mod:`lr_client.errors` types: ``TransportError``
(transient: reconnect), ``AuthenticationError`` / ``PermissionDeniedError``
and ``ProtocolError`` (permanent for this connection).
"""

from __future__ import annotations

import abc

from lr_client._proto import replication_pb2 as pb


class BatchStream(abc.ABC):
    """One open replication stream."""

    @abc.abstractmethod
    def send(self, batch: pb.ReplicationBatch) -> None:
        """Queue a batch for sending (non-blocking)."""

    @abc.abstractmethod
    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        """The next acknowledgement, or None after ``timeout`` seconds."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the stream (idempotent)."""

    def interrupt(self) -> None:  # noqa: B027 - optional: a wait then lasts its timeout
        """End the current or the next :meth:`next_ack` wait at once (it returns None);
        from any thread. A session is woken so when there is something new to send."""


class Transport(abc.ABC):
    """Something that takes batches to a sink and returns its acks."""

    @abc.abstractmethod
    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        """Ask the sink what it has applied."""

    @abc.abstractmethod
    def open_stream(self) -> BatchStream:
        """Open a replication stream."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (idempotent)."""
