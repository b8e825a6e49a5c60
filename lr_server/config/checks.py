"""The rules of the site config that join several keys (each key's own type is in its class).

Each raises :class:`~lr_client.errors.ConfigError` naming the key at fault.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Protocol

from lr_client.errors import ConfigError
from lr_client.names import NAME_RE
from lr_server.config.errors import in_order, name_error, validate
from lr_server.config.models import (
    CASCADE_KEYS,
    FORBID_EXTRA,
    LOOPBACK_NAMES,
    WIRE_BYTES_PER_BATCH,
    WIRE_BYTES_PER_ENTRY,
    CascadeConfig,
    MembersConfig,
    ReplicationConfig,
    SecurityConfig,
)
from lr_server.config.values import Name, NodeMap, NodeNames


def is_loopback(address: str) -> bool:
    """Whether a ``host:port`` names this host only (127.0.0.0/8, ::1, localhost)."""
    host = address.rpartition(":")[0].strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tables(raw: dict[str, Any], key: str) -> list[Any]:
    """The ``[[key]]`` tables of the document (none when absent)."""
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected [[{key}]] tables, got {value!r}")
    return value


def check_security(security: SecurityConfig, raw: dict[str, Any], listen: str) -> None:
    """TLS needs its three files; mTLS needs TLS; no client authentication only on loopback."""
    if security.transport == "tls":
        for k in ("ca_file", "cert_file", "key_file"):
            p = getattr(security, k)
            if p is None:
                raise ConfigError(f"security.{k}: required when security.transport = 'tls'")
            if not p.exists():
                raise ConfigError(f"security.{k}: no such file {p}")
    elif security.client_auth == "mtls":
        raise ConfigError("security.client_auth: 'mtls' needs security.transport = 'tls'")
    if security.client_auth == "none":
        _check_unauthenticated(raw, security, listen)


class MetricsKeys(Protocol):
    """The ``[site]`` keys of the metrics endpoint."""

    @property
    def metrics_port(self) -> int: ...
    @property
    def metrics_listen(self) -> str: ...
    @property
    def metrics_username(self) -> str: ...
    @property
    def metrics_password(self) -> str: ...
    @property
    def metrics_tls(self) -> bool: ...


def check_metrics(site: MetricsKeys, security: SecurityConfig) -> None:
    """One address (``metrics_listen`` or ``metrics_port``), a username and a password
    together, and TLS only with the site's certificate and key."""
    if site.metrics_listen and site.metrics_port:
        raise ConfigError(
            "site.metrics_listen: give either metrics_listen (host:port) or metrics_port"
        )
    if bool(site.metrics_username) != bool(site.metrics_password):
        missing = "metrics_password" if site.metrics_username else "metrics_username"
        raise ConfigError(f"site.{missing}: basic auth needs metrics_username and metrics_password")
    if site.metrics_tls:
        for k in ("cert_file", "key_file"):
            p = getattr(security, k)
            if p is None:
                raise ConfigError(f"security.{k}: required when site.metrics_tls = true")
            if not p.exists():
                raise ConfigError(f"security.{k}: no such file {p}")


def _check_unauthenticated(raw: dict[str, Any], security: SecurityConfig, listen: str) -> None:
    """``client_auth = "none"``: a trial on one host, so every address must be loopback.

    The receiver then takes the caller's word for its source id: only processes of
    this host can reach it. Tokens written in such a file would be ignored, so they
    are refused rather than silently unused.
    """
    why = (
        "without client authentication (security.transport = 'plaintext' and no "
        "security.client_auth) every address must be loopback (127.0.0.1, ::1, localhost); "
        "for other hosts use TLS, or client_auth = 'token' with tokens"
    )
    if security.transport != "plaintext":
        raise ConfigError("security.client_auth: 'none' needs security.transport = 'plaintext'")
    if listen and not is_loopback(listen):
        raise ConfigError(f"site.listen: {listen!r} is not loopback; {why}")
    for i, d in enumerate(tables(raw, "destinations")):
        address = d.get("address") if isinstance(d, dict) else None
        if isinstance(address, str) and ":" in address and not is_loopback(address):
            raise ConfigError(f"destinations[{i}].address: {address!r} is not loopback; {why}")
    tokens = [("security.token", raw.get("security", {}).get("token"))]
    for section in ("destinations", "sources"):
        for i, x in enumerate(tables(raw, section)):
            tokens.append(
                (f"{section}[{i}].token", x.get("token") if isinstance(x, dict) else None)
            )
    for key, token in tokens:
        if token:
            raise ConfigError(
                f"{key}: a token is only used with security.client_auth = 'token' (set it, "
                "or remove the token)"
            )


def check_replication(replication: ReplicationConfig) -> None:
    """The cascade grace covers a report interval; a full batch fits in a gRPC message."""
    if replication.cascade_grace < replication.cascade_report_interval:
        raise ConfigError(
            "replication.cascade_grace: expected at least replication.cascade_report_interval"
        )
    envelope = replication.batch_max_entries * WIRE_BYTES_PER_ENTRY + WIRE_BYTES_PER_BATCH
    if replication.batch_max_bytes + envelope > replication.max_message_bytes:
        raise ConfigError(
            "replication.batch_max_bytes: a batch must fit in a gRPC message: at most "
            f"max_message_bytes ({replication.max_message_bytes}) - {WIRE_BYTES_PER_ENTRY} "
            f"x batch_max_entries - {WIRE_BYTES_PER_BATCH} = "
            f"{replication.max_message_bytes - envelope}"
        )


def check_members(members: MembersConfig) -> None:
    """Heartbeats come at least twice per lease."""
    if (
        members.lease_timeout <= 0
        or not 0 < members.heartbeat_interval <= members.lease_timeout / 2
    ):
        raise ConfigError(
            "members.heartbeat_interval: expected a positive number of seconds, at most half"
            f" of members.lease_timeout ({members.lease_timeout:g})"
        )


@dataclass(frozen=True)
class CascadeTable:
    """``[cascade.<client>]`` as written: its client is the table's name."""

    __pydantic_config__ = FORBID_EXTRA

    root: Name
    nodes: NodeMap = field(default_factory=dict)
    branches: NodeNames = ()


def cascades(
    raw: object,
    site_id: str,
    clients: list[str],
    destinations: set[str],
    sources: set[str],
) -> tuple[CascadeConfig, ...]:
    """The ``[cascade.<client>]`` tables, checked (see docs/configuration.md)."""
    if not isinstance(raw, dict):
        raise ConfigError("cascade: expected a table")
    out = []
    for client, table in raw.items():
        key = f"cascade.{client}"
        if not isinstance(client, str) or NAME_RE.fullmatch(client) is None:
            raise ConfigError(name_error(client, key))
        if client not in clients:
            raise ConfigError(f"{key}: {client!r} is not in [[clients]]")
        data = in_order(table, CASCADE_KEYS, absent_as_none=("root",))
        written: CascadeTable = validate(CascadeTable, data, key, known=CASCADE_KEYS)
        root, nodes = written.root, written.nodes
        if root in nodes:
            raise ConfigError(f"{key}.nodes.{root}: the root {root!r} has no provider")
        for node, provider in nodes.items():
            if provider != root and provider not in nodes:
                raise ConfigError(
                    f"{key}.nodes.{node}: provider {provider!r} is neither the root nor a node"
                )
            seen, at = {node}, provider
            while at != root:
                if at in seen:
                    raise ConfigError(f"{key}.nodes.{node}: providers form a cycle through {at!r}")
                seen.add(at)
                at = nodes[at]
        branches = _branches(written.branches, f"{key}.branches", root, nodes)
        cfg = CascadeConfig(client, root, nodes, branches)
        if site_id != root and site_id not in nodes:
            raise ConfigError(f"{key}.nodes: this site {site_id!r} is not a node of the set")
        for child in cfg.children_of(site_id):
            if child not in destinations:
                raise ConfigError(
                    f"{key}.nodes.{child}: this site provides {child!r}, which is not "
                    "in [[destinations]]"
                )
        provider = cfg.provider_of(site_id)
        if provider and provider not in sources:
            raise ConfigError(
                f"{key}.nodes.{site_id}: this site's provider {provider!r} is not in [[sources]]"
            )
        out.append(cfg)
    return tuple(out)


def _branches(names: tuple[str, ...], key: str, root: str, nodes: dict[str, str]) -> frozenset[str]:
    """``[cascade.<client>] branches``: nodes of the set (not the root), each once."""
    for n in names:
        if n == root:
            raise ConfigError(f"{key}: {n!r} is the root, not a branch")
        if n not in nodes:
            raise ConfigError(f"{key}: {n!r} is not a node of the set (in nodes)")
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}: a node is named twice")
    return frozenset(names)
