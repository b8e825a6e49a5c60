"""How a site reaches one destination: a gRPC transport per connection attempt."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

from lr_server.config import DestinationConfig, SiteConfig
from lr_server.transport.base import Transport


def grpc_connector(cfg: SiteConfig, dest: DestinationConfig) -> Callable[[], Transport]:
    """A new gRPC transport to ``dest`` per call; each attempt (the session retries with
    backoff) tries the next address: a destination run by several members fails over
    between them."""
    from lr_server.transport.grpc_client import GrpcTransport

    addresses = dest.all_addresses()
    attempts = itertools.count()
    own = cfg.replication.streams_per_destination > 1  # a connection per lane

    def connect() -> Transport:
        address = addresses[next(attempts) % len(addresses)]
        return GrpcTransport(
            cfg.id,
            replace(dest, address=address),
            cfg.security,
            cfg.replication.max_message_bytes,
            own,
        )

    return connect


__all__ = ["grpc_connector"]
