"""Site configuration: one TOML file per site, every key documented in docs/configuration.md.

Errors name the offending key (``destinations[1].address: expected host:port``).
"""

from __future__ import annotations

import enum
import ipaddress
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from lr_client.cascade_roles import CascadeRole as CascadeRole  # re-exported: defined once there
from lr_client.errors import ConfigError, InvalidNameError
from lr_client.lanes import MAX_LANES
from lr_client.names import validate_name
from lr_client.records import Backlog

SECURITY_TRANSPORTS = ("tls", "plaintext")
CLIENT_AUTH_MODES = ("mtls", "token", "none")
#: ``site.database_url`` schemes the store runs on (``postgres`` is read as ``postgresql``).
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgres")
SUPPORTED_DATABASES = "sqlite:///PATH, postgresql://... or postgresql+psycopg://..."
LOOPBACK_NAMES = ("localhost",)
SECTIONS = (
    "site",
    "security",
    "clients",
    "destinations",
    "sources",
    "replication",
    "retry",
    "retention",
    "receiver",
    "members",
    "cascade",
)
SITE_KEYS = ("id", "database_url", "listen", "metrics_port")


class SnapshotProvider(enum.StrEnum):
    """Who makes a client's full syncs."""

    NONE = "none"  # nobody: a stream that needs one stops until an operator acts
    APP = "app"  # the application's in-process provider
    SPARK = "spark"  # the PySpark job, launched by the server


SNAPSHOT_PROVIDERS = tuple(p.value for p in SnapshotProvider)
#: Bytes of a gRPC message left for what a batch holds besides its payloads.
#: Wire bytes a batch adds on top of its payloads: per entry (its fields: type,
#: position, snapshot id, client name, counts, length prefixes) and per batch.
WIRE_BYTES_PER_ENTRY = 256
WIRE_BYTES_PER_BATCH = 4096


@dataclass(frozen=True)
class SecurityConfig:
    """How sites authenticate each other."""

    transport: str = "tls"  # "tls" or, only when written explicitly, "plaintext"
    # "mtls": the peer certificate names the source; "token"; "none": the caller's
    # claimed source id, on loopback only (the default with plaintext)
    client_auth: str = "mtls"
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str = ""  # the token this site presents to its destinations (token mode)


@dataclass(frozen=True)
class DestinationConfig:
    """A site this one ships to (``[[destinations]]``); ``clients`` empty: every client."""

    id: str
    address: str
    clients: tuple[str, ...] = ()  # empty: every client in [clients]
    token: str = ""  # overrides security.token for this destination
    server_name: str = ""  # TLS name to expect (default: the address host)
    addresses: tuple[str, ...] = ()  # more members of the destination, tried in turn

    def all_addresses(self) -> list[str]:
        """``address``, then ``addresses``: where the session connects, in turn."""
        return [self.address, *(a for a in self.addresses if a != self.address)]


@dataclass(frozen=True)
class SourceConfig:
    """A site this one accepts batches from (``[[sources]]``); ``token`` in token mode."""

    id: str
    token: str = ""  # expected token in token mode
    #: Where the source listens (host:port): a cascaded node sends its ``Cascade``
    #: reports to its provider there (docs/cascading.md). Empty: no reports to it.
    address: str = ""
    server_name: str = ""  # TLS name to expect at ``address`` (default: its host)


@dataclass(frozen=True)
class ClientConfig:
    """One application stream and how its full syncs are produced."""

    name: str
    snapshot: SnapshotProvider = SnapshotProvider.NONE
    spark_source: str = ""  # jdbc:/parquet:/csv:/module:function (spark_jobs.snapshot_job)
    spark_encoder: str = ""  # module:function row -> bytes
    spark_key_column: str = ""  # the column whose value is each row's partition key
    spark_master: str = "local[*]"
    spark_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "snapshot", SnapshotProvider(self.snapshot))


@dataclass(frozen=True)
class ReplicationConfig:
    """Batching, in-flight window and polling of the sender sessions (``[replication]``)."""

    batch_max_entries: int = 500
    batch_max_bytes: int = 4 * 1024 * 1024
    #: Entries per batch of a READY snapshot at most: log batches stay small for
    #: latency, a snapshot goes in as few sink transactions as its bytes allow.
    snapshot_batch_max_entries: int = 4000
    window_batches: int = 8
    window_bytes: int = 32 * 1024 * 1024
    poll_interval: float = 0.02
    max_message_bytes: int = 64 * 1024 * 1024 + 1024 * 1024
    stream_idle_timeout: float = 30.0
    snapshot_stall_timeout: float = 60.0
    shared_reader: bool = True
    shared_reader_entries: int = 20_000
    shared_reader_bytes: int = 64 * 1024 * 1024
    streams_per_destination: int = 1  # lanes per destination (1: one gRPC stream, as ever)
    #: Seconds between a cascaded node's reports to its provider (docs/cascading.md).
    cascade_report_interval: float = 1.0
    #: Seconds a dropped child whose last report is newer still counts in the watermarks
    #: (a node that just switched providers: see lr_server.watermarks).
    cascade_grace: float = 30.0

    @property
    def snapshot_batch_entries(self) -> int:
        """Entries per snapshot batch: ``snapshot_batch_max_entries``, fewer if its envelope
        would not fit in a gRPC message with ``batch_max_bytes`` (never below
        ``batch_max_entries``, which the config check makes fit)."""
        room = self.max_message_bytes - self.batch_max_bytes - WIRE_BYTES_PER_BATCH
        fits = max(self.batch_max_entries, room // WIRE_BYTES_PER_ENTRY)
        return min(self.snapshot_batch_max_entries, fits)


@dataclass(frozen=True)
class RetryConfig:
    """Reconnect backoff of the sender sessions (``[retry]``)."""

    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    jitter: float = 0.5


@dataclass(frozen=True)
class RetentionConfig:
    """Limits per destination; past a hard limit it is dropped to a full sync."""

    max_entries: int = 1_000_000
    max_bytes: int = 1024 * 1024 * 1024
    max_age_seconds: float = 24 * 3600.0
    soft_fraction: float = 0.5  # a destination past this fraction of a limit is "slow"
    trim_interval: float = 1.0
    trim_batch: int = 5000
    rotation_period: float = 30.0  # PostgreSQL: seconds a send queue slot stays current
    max_slots: int = 32  # PostgreSQL: send queue slots at most

    def measure(self, backlog: Backlog, now: float) -> tuple[float, bool, bool]:
        """(age of the oldest entry, slow, over a limit) of one stream's backlog.

        Slow: past ``soft_fraction`` of any limit; over: past a limit (dropped to a full sync).
        """
        oldest = backlog.oldest_created_at
        age = 0.0 if oldest is None else max(0.0, now - oldest)
        worst = max(
            backlog.entries / self.max_entries,
            backlog.bytes / self.max_bytes,
            age / self.max_age_seconds if self.max_age_seconds else 0.0,
        )
        return age, worst >= self.soft_fraction, worst >= 1.0


@dataclass(frozen=True)
class ReceiverConfig:
    """Limits of the receiver's gRPC server (the site's ``listen``), and how often its
    receive queues retire delivered entries."""

    max_concurrent_calls: int = 256
    max_calls_per_source: int = 4
    idle_call_timeout: float = 10.0
    rotation_period: float = 30.0  # seconds; 0: whenever a slot can be retired
    #: Wake subscribers of other processes when a batch is stored (PostgreSQL NOTIFY;
    #: see lr_client.store.arrival_watch): they deliver at once instead of at their poll.
    notify_subscribers: bool = True


@dataclass(frozen=True)
class MembersConfig:
    """This ``lr server`` as one member of the site (``[members]``): every key optional.

    Several servers of a site share its database (PostgreSQL); each unit of
    work (a sender stream, the trim job) is owned by one live member.
    """

    id: str = ""  # the member id; default: the host name, plus ":<port>" of site.listen
    address: str = ""  # what `lr members` shows; default: site.listen
    weight: int = 1  # share of the units (relative); `lr members weight` changes it at run time
    lease_timeout: float = 5.0  # seconds without a heartbeat after which a member is gone
    heartbeat_interval: float = 1.0  # seconds between heartbeats (and placement rounds)


CASCADE_KEYS = ("root", "nodes", "branches")


@dataclass(frozen=True)
class CascadeConfig:
    """One cascaded client's set (``[cascade.<client>]``), the same on every node.

    ``nodes`` maps every node of the set but the root to its provider;
    ``branches`` names nodes that are branches even with no node below them yet
    (they keep a relay copy, so that a node can be switched to them).
    """

    client: str
    root: str
    nodes: dict[str, str] = field(default_factory=dict)
    branches: frozenset[str] = frozenset()

    def members(self) -> list[str]:
        """Every node of the set: the root first, then the others in sorted order."""
        return [self.root, *sorted(self.nodes)]

    def provider_of(self, node: str) -> str:
        """The configured provider of ``node`` ('' for the root)."""
        return "" if node == self.root else self.nodes[node]

    def children_of(self, node: str) -> list[str]:
        """The nodes whose configured provider is ``node``, sorted."""
        return sorted(n for n, p in self.nodes.items() if p == node)

    def role_of(self, node: str) -> CascadeRole:
        """Root if ``node`` originates the client, branch if it is in ``branches`` or
        some node has it as its provider, else leaf. ``KeyError`` for a node outside
        the set."""
        if node == self.root:
            return CascadeRole.ROOT
        if node not in self.nodes:
            raise KeyError(node)
        if node in self.branches or self.children_of(node):
            return CascadeRole.BRANCH
        return CascadeRole.LEAF


@dataclass(frozen=True)
class SiteConfig:
    """One site's whole configuration, as :func:`load_config` reads it from its TOML file.

    Every key is documented in docs/configuration.md; build one in code with
    :func:`parse_config` (the same checks as a file) or directly.
    """

    id: str
    database_url: str
    listen: str = ""  # host:port of the receiver; empty: send only
    metrics_port: int = 0  # 0: no metrics endpoint
    security: SecurityConfig = field(default_factory=SecurityConfig)
    destinations: tuple[DestinationConfig, ...] = ()
    sources: tuple[SourceConfig, ...] = ()
    clients: tuple[ClientConfig, ...] = ()
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    members: MembersConfig = field(default_factory=MembersConfig)
    cascades: tuple[CascadeConfig, ...] = ()
    path: Path | None = None

    def client_names(self) -> list[str]:
        """The names of the configured clients, in config order."""
        return [c.name for c in self.clients]

    def clients_for(self, dest: DestinationConfig) -> list[str]:
        """The clients shipped to ``dest``: its own list, or every client."""
        return list(dest.clients) or self.client_names()

    def client(self, name: str) -> ClientConfig | None:
        """The client named ``name``, if configured."""
        return next((c for c in self.clients if c.name == name), None)

    def source(self, source_id: str) -> SourceConfig | None:
        """The source ``source_id``, if this site accepts it."""
        return next((s for s in self.sources if s.id == source_id), None)

    def cascade(self, client: str) -> CascadeConfig | None:
        """The set of cascaded client ``client`` (None: not cascaded)."""
        return next((c for c in self.cascades if c.client == client), None)


def _address(value: object, key: str) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{key}: expected host:port, got {value!r}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: expected host:port, got {value!r}")
    return value


def parse_listen(value: object, key: str = "site.listen") -> str:
    """A checked ``host:port`` (for ``site.listen`` and ``lr server --listen``)."""
    return _address(value, key)


def is_loopback(address: str) -> bool:
    """Whether a ``host:port`` names this host only (127.0.0.0/8, ::1, localhost)."""
    host = address.rpartition(":")[0].strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _database_url(value: object) -> str:
    """``site.database_url`` checked: a URL of a database the store runs on."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"site.database_url: expected a database URL ({SUPPORTED_DATABASES})")
    try:
        scheme = make_url(value).drivername
    except ArgumentError:
        # The value is not echoed: it may hold a password.
        raise ConfigError(
            f"site.database_url: not a database URL; expected {SUPPORTED_DATABASES}"
        ) from None
    if scheme not in DATABASE_SCHEMES:
        raise ConfigError(
            f"site.database_url: unsupported database {scheme!r}; supported: {SUPPORTED_DATABASES}"
        )
    return value


def _array(raw: dict[str, Any], key: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected [[{key}]] tables, got {value!r}")
    return value


def _name(value: object, key: str) -> str:
    try:
        return validate_name(value, key)
    except InvalidNameError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


def _table(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table")
    return value


def _section(cls: type[Any], raw: object, key: str, base: Path | None = None) -> Any:
    """Build a flat dataclass from a TOML table, checking key names and value types."""
    data = _table(raw, key)
    known = {f.name: str(f.type) for f in fields(cls)}
    out: dict[str, Any] = {}
    for k, v in data.items():
        kind = known.get(k)
        if kind is None:
            raise ConfigError(f"{key}.{k}: unknown key (known: {', '.join(sorted(known))})")
        if kind == "Path | None":
            if not isinstance(v, str):
                raise ConfigError(f"{key}.{k}: expected a path string")
            p = Path(v)
            out[k] = p if p.is_absolute() or base is None else base / p
        elif kind == "bool":
            if not isinstance(v, bool):
                raise ConfigError(f"{key}.{k}: expected true or false")
            out[k] = v
        elif kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"{key}.{k}: expected a non-negative number, got {v!r}")
            out[k] = float(v)
        elif kind == "int":
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{key}.{k}: expected a positive integer, got {v!r}")
            out[k] = v
        elif kind == "str":
            if not isinstance(v, str):
                raise ConfigError(f"{key}.{k}: expected a string, got {v!r}")
            out[k] = v
        elif kind == "SnapshotProvider":
            if v not in SNAPSHOT_PROVIDERS:
                raise ConfigError(f"{key}.{k}: expected one of {SNAPSHOT_PROVIDERS}")
            out[k] = SnapshotProvider(v)
        else:
            raise ConfigError(f"{key}.{k}: not settable here")
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING and f.name not in out:
            raise ConfigError(f"{key}.{f.name}: required")
    try:
        return cls(**out)
    except TypeError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


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
    site = _table(raw.get("site"), "site")
    for k in site:
        if k not in SITE_KEYS:
            raise ConfigError(f"site.{k}: unknown key (known: {', '.join(SITE_KEYS)})")
    site_id = _name(site.get("id"), "site.id")
    url = _database_url(site.get("database_url"))
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and base is not None:
        url = f"sqlite:///{(base / url[len('sqlite:///') :]).resolve()}"
    listen = site.get("listen", "")
    if listen:
        listen = _address(listen, "site.listen")
    metrics_port = site.get("metrics_port", 0)
    if (
        isinstance(metrics_port, bool)
        or not isinstance(metrics_port, int)
        or not 0 <= metrics_port < 65536
    ):
        raise ConfigError(f"site.metrics_port: expected a port number, got {metrics_port!r}")

    raw_security = raw.get("security", {})
    security: SecurityConfig = _section(SecurityConfig, raw_security, "security", base)
    if security.transport not in SECURITY_TRANSPORTS:
        raise ConfigError(f"security.transport: expected one of {SECURITY_TRANSPORTS}")
    if security.transport == "plaintext" and "client_auth" not in raw_security:
        security = replace(security, client_auth="none")
    if security.client_auth not in CLIENT_AUTH_MODES:
        raise ConfigError(f"security.client_auth: expected one of {CLIENT_AUTH_MODES}")
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

    clients = []
    for i, c in enumerate(_array(raw, "clients")):
        key = f"clients[{i}]"
        data = dict(_table(c, key))
        _name(data.get("name"), f"{key}.name")
        opts = data.pop("spark_options", {})
        client: ClientConfig = _section(ClientConfig, {k: v for k, v in data.items()}, key)
        if client.snapshot == SnapshotProvider.SPARK and not client.spark_source:
            raise ConfigError(f"{key}.spark_source: required when snapshot = 'spark'")
        clients.append(
            replace(
                client,
                spark_options={
                    str(k): str(v) for k, v in _table(opts, key + ".spark_options").items()
                },
            )
        )
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ConfigError("clients: duplicate client names")

    destinations = []
    for i, d in enumerate(_array(raw, "destinations")):
        key = f"destinations[{i}]"
        data = dict(_table(d, key))
        dest_clients = data.pop("clients", [])
        more = data.pop("addresses", [])
        if not isinstance(more, list):
            raise ConfigError(f"{key}.addresses: expected a list of host:port")
        more = [_address(a, f"{key}.addresses[{j}]") for j, a in enumerate(more)]
        if not isinstance(dest_clients, list):
            raise ConfigError(f"{key}.clients: expected a list of client names")
        for j, cn in enumerate(dest_clients):
            _name(cn, f"{key}.clients[{j}]")
            if cn not in names:
                raise ConfigError(f"{key}.clients[{j}]: {cn!r} is not in [[clients]]")
        dest: DestinationConfig = _section(DestinationConfig, data, key)
        _name(dest.id, f"{key}.id")
        if dest.id == site_id:
            raise ConfigError(f"{key}.id: a site cannot replicate to itself")
        _address(dest.address, f"{key}.address")
        if security.client_auth == "token" and not (dest.token or security.token):
            raise ConfigError(
                f"{key}.token: token auth needs security.token or a per-destination token"
            )
        destinations.append(replace(dest, clients=tuple(dest_clients), addresses=tuple(more)))
    if len({d.id for d in destinations}) != len(destinations):
        raise ConfigError("destinations: duplicate ids")

    sources = []
    for i, s in enumerate(_array(raw, "sources")):
        key = f"sources[{i}]"
        src: SourceConfig = _section(SourceConfig, s, key)
        _name(src.id, f"{key}.id")
        if security.client_auth == "token" and not src.token:
            raise ConfigError(f"{key}.token: required when security.client_auth = 'token'")
        if src.address:
            _address(src.address, f"{key}.address")
        sources.append(src)
    if len({s.id for s in sources}) != len(sources):
        raise ConfigError("sources: duplicate ids")
    if sources and not listen:
        raise ConfigError("site.listen: required when [[sources]] are configured")

    replication: ReplicationConfig = _section(
        ReplicationConfig, raw.get("replication", {}), "replication"
    )
    if not 1 <= replication.streams_per_destination <= MAX_LANES:
        raise ConfigError(
            f"replication.streams_per_destination: expected 1 to {MAX_LANES}, "
            f"got {replication.streams_per_destination}"
        )
    if replication.snapshot_stall_timeout <= 0:
        raise ConfigError("replication.snapshot_stall_timeout: expected a positive number")
    if replication.cascade_report_interval <= 0:
        raise ConfigError("replication.cascade_report_interval: expected a positive number")
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
    retry: RetryConfig = _section(RetryConfig, raw.get("retry", {}), "retry")
    retention: RetentionConfig = _section(RetentionConfig, raw.get("retention", {}), "retention")
    if not 0 < retention.soft_fraction <= 1:
        raise ConfigError("retention.soft_fraction: expected a number in (0, 1]")
    if retention.rotation_period < 0:
        raise ConfigError("retention.rotation_period: expected a number of seconds >= 0")
    if not 2 <= retention.max_slots <= 1000:
        raise ConfigError("retention.max_slots: expected an integer from 2 to 1000")
    receiver: ReceiverConfig = _section(ReceiverConfig, raw.get("receiver", {}), "receiver")
    if receiver.idle_call_timeout <= 0:
        raise ConfigError("receiver.idle_call_timeout: expected a positive number")
    members: MembersConfig = _section(MembersConfig, raw.get("members", {}), "members")
    if (
        members.lease_timeout <= 0
        or not 0 < members.heartbeat_interval <= members.lease_timeout / 2
    ):
        raise ConfigError(
            "members.heartbeat_interval: expected a positive number of seconds, at most half"
            f" of members.lease_timeout ({members.lease_timeout:g})"
        )
    if members.id and (len(members.id) > 128 or not members.id.isprintable()):
        raise ConfigError("members.id: expected 1 to 128 printable characters")
    dest_ids, source_ids = {d.id for d in destinations}, {s.id for s in sources}
    cascades = _cascades(raw.get("cascade", {}), site_id, names, dest_ids, source_ids)
    return SiteConfig(
        id=site_id,
        database_url=url,
        listen=listen,
        metrics_port=metrics_port,
        security=security,
        destinations=tuple(destinations),
        sources=tuple(sources),
        clients=tuple(clients),
        replication=replication,
        retry=retry,
        retention=retention,
        receiver=receiver,
        members=members,
        cascades=cascades,
        path=path,
    )


def _cascades(
    raw: object,
    site_id: str,
    clients: list[str],
    destinations: set[str],
    sources: set[str],
) -> tuple[CascadeConfig, ...]:
    """The ``[cascade.<client>]`` tables, checked (see docs/configuration.md)."""
    out = []
    for client, table in _table(raw, "cascade").items():
        key = f"cascade.{client}"
        _name(client, key)
        if client not in clients:
            raise ConfigError(f"{key}: {client!r} is not in [[clients]]")
        data = _table(table, key)
        for k in data:
            if k not in CASCADE_KEYS:
                raise ConfigError(f"{key}.{k}: unknown key (known: {', '.join(CASCADE_KEYS)})")
        root = _name(data.get("root"), f"{key}.root")
        raw_nodes = _table(data.get("nodes", {}), f"{key}.nodes")
        nodes = {
            _name(n, f"{key}.nodes"): _name(p, f"{key}.nodes.{n}") for n, p in raw_nodes.items()
        }
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
        branches = _branches(data.get("branches", []), f"{key}.branches", root, nodes)
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


def _branches(value: object, key: str, root: str, nodes: dict[str, str]) -> frozenset[str]:
    """``[cascade.<client>] branches``: nodes of the set (not the root), each once."""
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of node names")
    names = [_name(v, key) for v in value]
    for name in names:
        if name == root:
            raise ConfigError(f"{key}: {name!r} is the root, not a branch")
        if name not in nodes:
            raise ConfigError(f"{key}: {name!r} is not a node of the set (in nodes)")
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}: a node is named twice")
    return frozenset(names)


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
    for i, d in enumerate(_array(raw, "destinations")):
        address = d.get("address") if isinstance(d, dict) else None
        if isinstance(address, str) and ":" in address and not is_loopback(address):
            raise ConfigError(f"destinations[{i}].address: {address!r} is not loopback; {why}")
    tokens = [("security.token", raw.get("security", {}).get("token"))]
    for section in ("destinations", "sources"):
        for i, x in enumerate(_array(raw, section)):
            tokens.append(
                (f"{section}[{i}].token", x.get("token") if isinstance(x, dict) else None)
            )
    for key, token in tokens:
        if token:
            raise ConfigError(
                f"{key}: a token is only used with security.client_auth = 'token' (set it, "
                "or remove the token)"
            )


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
