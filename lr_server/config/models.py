"""The site configuration's classes: one frozen dataclass per TOML table.

Each field's type says what the file may hold there (:mod:`lr_server.config.values`:
pydantic's strict types, with the sentence a bad value gets); every key is
documented in docs/configuration.md. The classes stay plain dataclasses: one
built in code is not checked (:func:`lr_server.config.parse_config` checks a
dict of the same tables).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict

from lr_client.cascade_roles import CascadeRole as CascadeRole  # re-exported: defined once there
from lr_client.lanes import MAX_LANES
from lr_client.records import Backlog
from lr_server.config.values import (
    Address,
    Count,
    FilePath,
    Flag,
    HostPorts,
    Name,
    Names,
    Number,
    OptionalAddress,
    PositiveInt,
    PositiveNumber,
    SparkOptions,
    Text,
    TextName,
    expect,
    one_of,
    rule,
)

SECURITY_TRANSPORTS = ("tls", "plaintext")
CLIENT_AUTH_MODES = ("mtls", "token", "none")
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
    "tracing",
)
SITE_KEYS = (
    "id",
    "database_url",
    "listen",
    "metrics_port",
    "metrics_listen",
    "metrics_username",
    "metrics_password",
    "metrics_tls",
)


class SnapshotProvider(enum.StrEnum):
    """Who makes a client's full syncs."""

    NONE = "none"  # nobody: a stream that needs one stops until an operator acts
    APP = "app"  # the application's in-process provider
    SPARK = "spark"  # the PySpark job, launched by the server


SNAPSHOT_PROVIDERS = tuple(p.value for p in SnapshotProvider)
#: A destination's ``compression``.
Compression = Literal["none", "zlib", "zstd"]
#: What a table may not hold: a key its class does not have.
FORBID_EXTRA = ConfigDict(extra="forbid")
#: Bytes of a gRPC message left for what a batch holds besides its payloads.
#: Wire bytes a batch adds on top of its payloads: per entry (its fields: type,
#: position, snapshot id, client name, counts, length prefixes) and per batch.
WIRE_BYTES_PER_ENTRY = 256
WIRE_BYTES_PER_BATCH = 4096


@dataclass(frozen=True)
class SecurityConfig:
    """How sites authenticate each other."""

    __pydantic_config__ = FORBID_EXTRA

    # "tls" or, only when written explicitly, "plaintext"
    transport: Annotated[Text, one_of(SECURITY_TRANSPORTS)] = "tls"
    # "mtls": the peer certificate names the source; "token"; "none": the caller's
    # claimed source id, on loopback only (the default with plaintext)
    client_auth: Annotated[Text, one_of(CLIENT_AUTH_MODES)] = "mtls"
    ca_file: FilePath = None
    cert_file: FilePath = None
    key_file: FilePath = None
    token: Text = ""  # the token this site presents to its destinations (token mode)


@dataclass(frozen=True)
class DestinationConfig:
    """A site this one ships to (``[[destinations]]``); ``clients`` empty: every client."""

    __pydantic_config__ = FORBID_EXTRA

    id: TextName
    address: Address
    clients: Names = ()  # empty: every client in [clients]
    token: Text = ""  # overrides security.token for this destination
    server_name: Text = ""  # TLS name to expect (default: the address host)
    addresses: HostPorts = ()  # more members of the destination, tried in turn
    #: Batches on the wire: none, zlib or zstd (the ``zstd`` extra); sent uncompressed to
    #: a sink that does not accept the codec (older than protocol 6, or without zstd).
    compression: Annotated[Compression, expect("expected one of none, zlib, zstd")] = "none"

    def all_addresses(self) -> list[str]:
        """``address``, then ``addresses``: where the session connects, in turn."""
        return [self.address, *(a for a in self.addresses if a != self.address)]


@dataclass(frozen=True)
class SourceConfig:
    """A site this one accepts batches from (``[[sources]]``); ``token`` in token mode."""

    __pydantic_config__ = FORBID_EXTRA

    id: TextName
    token: Text = ""  # expected token in token mode
    #: Where the source listens (host:port): a cascaded node sends its ``Cascade``
    #: reports to its provider there (docs/cascading.md). Empty: no reports to it.
    address: OptionalAddress = ""
    server_name: Text = ""  # TLS name to expect at ``address`` (default: its host)


@dataclass(frozen=True)
class ClientConfig:
    """One application stream and how its full syncs are produced."""

    __pydantic_config__ = FORBID_EXTRA

    name: Name
    snapshot: Annotated[SnapshotProvider, expect(f"expected one of {SNAPSHOT_PROVIDERS}")] = (
        SnapshotProvider.NONE
    )
    spark_source: Text = ""  # jdbc:/parquet:/csv:/module:function (spark_jobs.snapshot_job)
    spark_encoder: Text = ""  # module:function row -> bytes
    spark_key_column: Text = ""  # the column whose value is each row's partition key
    spark_master: Text = "local[*]"
    spark_options: SparkOptions = field(default_factory=dict)
    #: At a sink: the client's receive queue (per source) holds at most about this many
    #: undelivered entries / payload bytes; past it, log batches are refused (retryable,
    #: RESOURCE_EXHAUSTED) until the subscriber drains it. 0: no limit.
    receive_queue_max_entries: Count = 0
    receive_queue_max_bytes: Count = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "snapshot", SnapshotProvider(self.snapshot))


@dataclass(frozen=True)
class ReplicationConfig:
    """Batching, in-flight window and polling of the sender sessions (``[replication]``)."""

    __pydantic_config__ = FORBID_EXTRA

    batch_max_entries: PositiveInt = 500
    batch_max_bytes: PositiveInt = 4 * 1024 * 1024
    #: Entries per batch of a READY snapshot at most: log batches stay small for
    #: latency, a snapshot goes in as few sink transactions as its bytes allow.
    snapshot_batch_max_entries: PositiveInt = 4000
    window_batches: PositiveInt = 8
    window_bytes: PositiveInt = 32 * 1024 * 1024
    poll_interval: Number = 0.02
    max_message_bytes: PositiveInt = 64 * 1024 * 1024 + 1024 * 1024
    stream_idle_timeout: Number = 30.0
    snapshot_stall_timeout: PositiveNumber = 60.0
    shared_reader: Flag = True
    shared_reader_entries: PositiveInt = 20_000
    shared_reader_bytes: PositiveInt = 64 * 1024 * 1024
    # lanes per destination (1: one gRPC stream, as ever)
    streams_per_destination: Annotated[
        PositiveInt, rule(lambda n: n <= MAX_LANES, f"expected 1 to {MAX_LANES}, got {{got}}")
    ] = 1
    #: Seconds between a cascaded node's reports to its provider (docs/cascading.md).
    cascade_report_interval: PositiveNumber = 1.0
    #: Seconds a dropped child whose last report is newer still counts in the watermarks
    #: (a node that just switched providers: see lr_server.cascade.watermarks).
    cascade_grace: Number = 30.0

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

    __pydantic_config__ = FORBID_EXTRA

    initial_backoff: Number = 0.1
    max_backoff: Number = 5.0
    jitter: Number = 0.5


@dataclass(frozen=True)
class RetentionConfig:
    """Limits per destination; past a hard limit it is dropped to a full sync."""

    __pydantic_config__ = FORBID_EXTRA

    max_entries: PositiveInt = 1_000_000
    max_bytes: PositiveInt = 1024 * 1024 * 1024
    max_age_seconds: Number = 24 * 3600.0
    # a destination past this fraction of a limit is "slow"
    soft_fraction: Annotated[Number, rule(lambda f: 0 < f <= 1, "expected a number in (0, 1]")] = (
        0.5
    )
    trim_interval: Number = 1.0
    trim_batch: PositiveInt = 5000
    rotation_period: Number = 30.0  # PostgreSQL: seconds a send queue slot stays current
    # PostgreSQL: send queue slots at most
    max_slots: Annotated[
        PositiveInt, rule(lambda n: 2 <= n <= 1000, "expected an integer from 2 to 1000")
    ] = 32

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
    """Limits of the receiver's gRPC server (``listen``); its queues' retirement period."""

    __pydantic_config__ = FORBID_EXTRA

    max_concurrent_calls: PositiveInt = 256
    max_calls_per_source: PositiveInt = 4
    idle_call_timeout: PositiveNumber = 10.0
    rotation_period: Number = 30.0  # seconds; 0: whenever a slot can be retired
    #: Wake subscribers of other processes when a batch is stored (PostgreSQL NOTIFY;
    #: see lr_client.store.recv.arrival_watch): they deliver at once instead of at their poll.
    notify_subscribers: Flag = True


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry spans (``[tracing]``; the ``otel`` extra; docs/operations.md)."""

    __pydantic_config__ = FORBID_EXTRA

    enabled: Flag = False


@dataclass(frozen=True)
class MembersConfig:
    """This ``lr server`` as one member of the site (``[members]``): every key optional.

    Several servers of a site share its database (PostgreSQL); each unit of
    work (a sender stream, the trim job) is owned by one live member.
    """

    __pydantic_config__ = FORBID_EXTRA

    # the member id; default: the host name, plus ":<port>" of site.listen
    id: Annotated[
        Text,
        rule(
            lambda s: not s or (len(s) <= 128 and s.isprintable()),
            "expected 1 to 128 printable characters",
        ),
    ] = ""
    address: Text = ""  # what `lr members` shows; default: site.listen
    weight: PositiveInt = 1  # share of the units (relative); `lr members weight` changes it
    lease_timeout: Number = 5.0  # seconds without a heartbeat after which a member is gone
    heartbeat_interval: Number = 1.0  # seconds between heartbeats (and placement rounds)


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
    metrics_port: int = 0  # 0: no metrics endpoint (unless metrics_listen); on 127.0.0.1
    metrics_listen: str = ""  # host:port of the metrics endpoint (overrides metrics_port)
    metrics_username: str = ""  # with metrics_password: basic auth on /metrics
    metrics_password: str = ""
    metrics_tls: bool = False  # HTTPS with security.cert_file and key_file
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
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) of the metrics endpoint: ``metrics_listen``, else 127.0.0.1 at
        ``metrics_port``; None without either."""
        if self.metrics_listen:
            host, _, port = self.metrics_listen.rpartition(":")
            return host, int(port)
        return ("127.0.0.1", self.metrics_port) if self.metrics_port else None

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
