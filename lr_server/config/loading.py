"""Reading a site config: the TOML file, then its tables in order, each checked as it is read.

Each table is validated by pydantic against its class (lr_server.config.models),
then the rules that join it to the tables before it (lr_server.config.checks),
in the order of ``SECTIONS``: the first fault is reported.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic_core import PydanticCustomError

from lr_client.errors import ConfigError
from lr_server.config.checks import (
    cascades,
    check_members,
    check_metrics,
    check_replication,
    check_security,
    tables,
)
from lr_server.config.errors import in_order, validate
from lr_server.config.models import (
    FORBID_EXTRA,
    SECTIONS,
    SITE_KEYS,
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
from lr_server.config.values import DatabaseUrl, Flag, Listen, Name, Port, Text, host_port
from lr_server.protocol.codecs import check_codec


@dataclass(frozen=True)
class SiteTable:
    """``[site]`` as written (:class:`SiteConfig` holds its keys beside the other tables)."""

    __pydantic_config__ = FORBID_EXTRA

    id: Name
    database_url: DatabaseUrl
    listen: Listen = ""
    metrics_port: Port = 0
    metrics_listen: Listen = ""
    metrics_username: Text = ""
    metrics_password: Text = ""
    metrics_tls: Flag = False


def parse_listen(value: object, key: str = "site.listen") -> str:
    """A checked ``host:port`` (for ``site.listen`` and ``lr server --listen``)."""
    try:
        return host_port(value)
    except PydanticCustomError as exc:
        raise ConfigError(f"{key}: {exc.message()}") from None


def parse_config(raw: dict[str, Any], path: Path | None = None) -> SiteConfig:
    """Validate a parsed TOML document (a dict of its tables) into a :class:`SiteConfig`.

    ``path`` is where it was read from: relative file paths and SQLite URLs in
    it are taken from that file's directory. Raises
    :class:`~lr_client.errors.ConfigError` naming the offending key.
    """
    base = path.parent if path else None
    for k in raw:
        if k not in SECTIONS:
            raise ConfigError(f"{k}: unknown section (known: {', '.join(SECTIONS)})")
    site_raw = in_order(raw.get("site"), SITE_KEYS, absent_as_none=("id", "database_url"))
    site: SiteTable = validate(SiteTable, site_raw, "site", known=SITE_KEYS)
    url = site.database_url
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and base is not None:
        url = f"sqlite:///{(base / url[len('sqlite:///') :]).resolve()}"

    raw_security = raw.get("security", {})
    security = validate(SecurityConfig, raw_security, "security", base=base)
    if security.transport == "plaintext" and "client_auth" not in raw_security:
        security = replace(security, client_auth="none")
    check_security(security, raw, site.listen)
    check_metrics(site, security)

    clients = [_client(c, f"clients[{i}]") for i, c in enumerate(tables(raw, "clients"))]
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ConfigError("clients: duplicate client names")

    destinations = []
    for i, d in enumerate(tables(raw, "destinations")):
        key = f"destinations[{i}]"
        dest = validate(DestinationConfig, d, key)
        for j, cn in enumerate(dest.clients):
            if cn not in names:
                raise ConfigError(f"{key}.clients[{j}]: {cn!r} is not in [[clients]]")
        if dest.id == site.id:
            raise ConfigError(f"{key}.id: a site cannot replicate to itself")
        try:
            check_codec(dest.compression)
        except ConfigError as exc:
            raise ConfigError(f"{key}.compression: {exc}") from None
        if security.client_auth == "token" and not (dest.token or security.token):
            raise ConfigError(
                f"{key}.token: token auth needs security.token or a per-destination token"
            )
        destinations.append(dest)
    if len({d.id for d in destinations}) != len(destinations):
        raise ConfigError("destinations: duplicate ids")

    sources = []
    for i, s in enumerate(tables(raw, "sources")):
        src = validate(SourceConfig, s, f"sources[{i}]")
        if security.client_auth == "token" and not src.token:
            raise ConfigError(f"sources[{i}].token: required when security.client_auth = 'token'")
        sources.append(src)
    if len({s.id for s in sources}) != len(sources):
        raise ConfigError("sources: duplicate ids")
    if sources and not site.listen:
        raise ConfigError("site.listen: required when [[sources]] are configured")

    replication = validate(ReplicationConfig, raw.get("replication", {}), "replication")
    check_replication(replication)
    retry = validate(RetryConfig, raw.get("retry", {}), "retry")
    retention = validate(RetentionConfig, raw.get("retention", {}), "retention")
    receiver = validate(ReceiverConfig, raw.get("receiver", {}), "receiver")
    members = validate(MembersConfig, raw.get("members", {}), "members")
    check_members(members)
    tracing = validate(TracingConfig, raw.get("tracing", {}), "tracing")
    dest_ids, source_ids = {d.id for d in destinations}, {s.id for s in sources}
    return SiteConfig(
        id=site.id,
        database_url=url,
        listen=site.listen,
        metrics_port=site.metrics_port,
        metrics_listen=site.metrics_listen,
        metrics_username=site.metrics_username,
        metrics_password=site.metrics_password,
        metrics_tls=site.metrics_tls,
        security=security,
        destinations=tuple(destinations),
        sources=tuple(sources),
        clients=tuple(clients),
        replication=replication,
        retry=retry,
        retention=retention,
        receiver=receiver,
        members=members,
        cascades=cascades(raw.get("cascade", {}), site.id, names, dest_ids, source_ids),
        path=path,
        tracing=tracing,
    )


def _client(raw: object, key: str) -> ClientConfig:
    """One ``[[clients]]`` table; a Spark provider needs its source."""
    if isinstance(raw, dict):  # its name first, and a missing one named as a bad one
        raw = {"name": raw.get("name"), **raw}
    client = validate(ClientConfig, raw, key)
    if client.snapshot == SnapshotProvider.SPARK and not client.spark_source:
        raise ConfigError(f"{key}.spark_source: required when snapshot = 'spark'")
    return client


def load_config(path: str | Path) -> SiteConfig:
    """Read and validate a site config file (TOML).

    Raises :class:`~lr_client.errors.ConfigError` naming the file or the offending key.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {p}") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"config file {p} is a directory") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    try:
        return parse_config(raw, p.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in {p})") from exc
