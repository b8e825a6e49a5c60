"""How a sender session reaches a sink: one small seam, gRPC and in-process backends."""

from __future__ import annotations

from lr_server.transport.base import BatchStream, Transport
from lr_server.transport.inproc import InProcessTransport

__all__ = ["BatchStream", "InProcessTransport", "Transport"]
