"""Site configuration: one TOML file per site, every key documented in docs/configuration.md.

Validated by pydantic, table by table (:mod:`~lr_server.config.models` says what
each key takes, :mod:`~lr_server.config.checks` the rules joining keys). Errors
name the offending key (``destinations[1].address: expected host:port``).
"""

from __future__ import annotations

from lr_server.config.checks import is_loopback
from lr_server.config.loading import load_config, parse_config, parse_listen
from lr_server.config.models import (
    CASCADE_KEYS,
    CLIENT_AUTH_MODES,
    LOOPBACK_NAMES,
    SECTIONS,
    SECURITY_TRANSPORTS,
    SITE_KEYS,
    SNAPSHOT_PROVIDERS,
    WIRE_BYTES_PER_BATCH,
    WIRE_BYTES_PER_ENTRY,
    CascadeConfig,
    CascadeRole,
    ClientConfig,
    DestinationConfig,
    MembersConfig,
    ReceiverConfig,
    ReplicationConfig,
    RetentionConfig,
    RetryConfig,
    SecurityConfig,
    SiteConfig,
    SnapshotProvider,
    SourceConfig,
    TracingConfig,
)
from lr_server.config.values import DATABASE_SCHEMES, SUPPORTED_DATABASES

__all__ = [
    "CASCADE_KEYS",
    "CLIENT_AUTH_MODES",
    "DATABASE_SCHEMES",
    "LOOPBACK_NAMES",
    "SECTIONS",
    "SECURITY_TRANSPORTS",
    "SITE_KEYS",
    "SNAPSHOT_PROVIDERS",
    "SUPPORTED_DATABASES",
    "WIRE_BYTES_PER_BATCH",
    "WIRE_BYTES_PER_ENTRY",
    "CascadeConfig",
    "CascadeRole",
    "ClientConfig",
    "DestinationConfig",
    "MembersConfig",
    "ReceiverConfig",
    "ReplicationConfig",
    "RetentionConfig",
    "RetryConfig",
    "SecurityConfig",
    "SiteConfig",
    "SnapshotProvider",
    "SourceConfig",
    "TracingConfig",
    "is_loopback",
    "load_config",
    "parse_config",
    "parse_listen",
]
