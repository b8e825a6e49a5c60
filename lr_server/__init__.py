"""The per-site ``lr`` server: sender sessions, sink receiver, trim, status, metrics, CLI.

Embedding a site in an application's process: :class:`Site` runs what
``lr server`` runs, from a config file or a :class:`SiteConfig`
(:func:`load_config` reads a file, :func:`parse_config` checks a dict of the
same tables).
"""

from __future__ import annotations

from lr_server.config import (
    ClientConfig,
    DestinationConfig,
    ReceiverConfig,
    ReplicationConfig,
    RetentionConfig,
    RetryConfig,
    SecurityConfig,
    SiteConfig,
    SnapshotProvider,
    SourceConfig,
    load_config,
    parse_config,
)
from lr_server.site import Site, SiteError, SiteStartError, SiteTimeoutError

__all__ = [
    "ClientConfig",
    "DestinationConfig",
    "ReceiverConfig",
    "ReplicationConfig",
    "RetentionConfig",
    "RetryConfig",
    "SecurityConfig",
    "Site",
    "SiteConfig",
    "SiteError",
    "SiteStartError",
    "SiteTimeoutError",
    "SnapshotProvider",
    "SourceConfig",
    "load_config",
    "parse_config",
]
