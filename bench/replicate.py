"""Replication throughput and delivery latency: source send queue -> sink receive queues.

    python bench/replicate.py [--backend sqlite|postgresql|both] [--seconds N] [--entries N]
                              [--rate N] [--entries-per-txn N] [--writers N]
                              [--idle-transaction] [--destinations N]
                              [--rounds N] [--workarounds] [--no-shared-reader]
                              [--members 1,2,3]
                              [--out bench/results/replicate.json] [--svg docs/send-queue-size.svg]

Every site is a real ``lr server`` process started from a config file (plaintext gRPC on
loopback with token auth, replication and retry settings at their defaults); this
process plays the application (it transmits) and the observer (it reads the databases).
Each site has its own database: a SQLite file in a temporary directory, or a schema of
the PostgreSQL server at ``LR_BENCH_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Per backend, ``--destinations`` (8) sink
sites are started once; every cell below gets a fresh source site (own database and id).

* ``baseline``: the sink's raw rate: batches of ``batch_max_entries`` (500) rows shaped
  like ``lrq_recv_entries`` (same columns and index) inserted into a bare table by the
  driver's own ``executemany`` (sqlite3, psycopg), one transaction per batch, from one
  thread, for ``--seconds``. On
  PostgreSQL also the same rows by binary ``COPY`` (the receiver's own method), reported
  as a second reference.
* ``throughput``: N entries of 1 KiB are pre-filled at the source (500 per transaction),
  then the source server starts and drains them to 1 or 8 sinks. A sink's sustained rate
  comes from its own ``received_at`` stamps: entries applied between its first and its last
  batch, over that span (start-up excluded; a drain that does not finish within the time
  limit is counted up to the limit). The aggregate divides every entry delivered by the
  span from the first batch anywhere to the last batch anywhere. The 8-destination drains
  run healthy, stalled, stalled, healthy (``--rounds 2``) so drift hits both kinds alike.
* ``latency``: a paced transmitter (``--entries-per-txn``, 1 by default, entries per
  transaction; ``--writers`` threads, 1 by default, share its schedule, each on a connection
  of its own) offers ``--rate`` entries/s for ``--seconds`` to 1 or 8 sinks (it catches up
  when late, and gives up at 3x the planned time: the cell is then marked "cut"). Latency of
  an entry at a sink is its ``received_at`` there minus the time its source transaction's
  COMMIT returned (both clocks are this machine's). The first second is warm-up and
  excluded. While the load runs, the source's send-queue size (``count(*)`` of
  ``lrq_send_log_entries``) is sampled every 0.5 s. A control cell runs the same transmitter
  with no site running. ``--idle-transaction`` adds a 1-destination cell with a session left
  idle in transaction on the source database for the whole cell (PostgreSQL: it holds a
  transaction id; SQLite: a read transaction).
* ``stalled``: the 8-destination cells again, with the eighth destination behind
  a ``FaultProxy`` in ``stall()`` mode (connections accepted, nothing forwarded): the
  seven healthy destinations' throughput and p99 against the all-healthy run. Paced cells
  run with ``[retention] max_entries = 5000`` and, when :mod:`lr_client.snapshot` exists, a
  client with an in-process snapshot provider (an empty full sync: the benchmark has no
  state besides its log), because retention drops only streams that can be fully resynced.

CPU: user + system time of the ``lr server`` processes over each cell's measured window,
per 1,000 entry deliveries (less sensitive to a busy machine than wall-clock rates).
``--workarounds`` emulates two proposed store fixes from outside (see
:func:`apply_workarounds`); without it the product is measured as it is.

Targets (reported, never asserted): 1 destination >= 0.5x the baseline;
p99 <= 100 ms at 1,000 entries/s; healthy destinations with one stalled >= 0.9x the
all-healthy run (throughput: stalled/healthy; latency: p99 healthy-run / p99 stalled-run).
``--svg`` draws the send-queue samples of the 8-destination paced cells.

``--members 1,2,3`` measures instead a source site run by N ``lr server`` members per count
(throughput, p99, and the failover after a kill -9): see :mod:`bench.replicate_members`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from sqlalchemy import (  # noqa: E402
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    text,
)
from sqlalchemy.engine import Connection, Engine  # noqa: E402

from bench import cpu_profile  # noqa: E402
from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    Panel,
    PgDatabase,
    PgSchema,
    Series,
    fmt_rate,
    fmt_ratio,
    machine_facts,
    panels_svg,
    pg_facts,
    print_table,
    run_for,
    write_json,
)
from lr_client import (  # noqa: E402
    EntryRef,
    LRMessageWithDestinations,
    RoutingQueueClient,
    create_engine,
)
from lr_client.store import SQLAlchemyQueueStore, open_store  # noqa: E402
from lr_server.config import ReplicationConfig, RetryConfig  # noqa: E402
from tests.kit.procs import LrServer  # noqa: E402
from tests.kit.sites import free_port  # noqa: E402
from tests.kit.tcp_proxy import FaultProxy  # noqa: E402

PAYLOAD_BYTES = 1024
DEFAULT_SINKS = 8
CLIENT = "bench"
PREFILL_PER_TXN = 500
BATCH_ENTRIES = ReplicationConfig().batch_max_entries  # the session's default batch size
SAMPLE_INTERVAL = 0.5
WARMUP_SECONDS = 1.0
RETENTION_MAX_ENTRIES = 5000  # paced cells only: a stalled destination crosses it
DEFAULT_OUT = ROOT / "bench" / "results" / "replicate.json"

#: Targets: measured and reported, never asserted.
TARGET_VS_BASELINE = 0.5
TARGET_P99_MS = 100.0
TARGET_STALLED = 0.9

# -- the baseline's table ----------------------------------------------------------------

_Id = BigInteger().with_variant(Integer(), "sqlite")
baseline_meta = MetaData()
baseline_table = Table(
    "bench_recv_baseline",
    baseline_meta,
    Column("seq", _Id, primary_key=True, autoincrement=True),
    Column("queue_id", Integer, nullable=False),
    Column("type", SmallInteger, nullable=False),
    Column("source_position", BigInteger, nullable=False),
    Column("snapshot_id", String(64), nullable=False),
    Column("snapshot_count", BigInteger, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("received_at", Double, nullable=False),
    sqlite_autoincrement=True,
)
Index("bench_recv_baseline_queue", baseline_table.c.queue_id, baseline_table.c.seq)


@dataclass
class Baseline:
    backend: str
    batch_entries: int
    entries: int
    seconds: float
    rate: float
    #: PostgreSQL: the same rows by binary COPY (what the receiver uses), for reference.
    copy_rate: float | None = None


def measure_baseline(url: str, backend: str, seconds: float, payloads: Sequence[bytes]) -> Baseline:
    """Raw batched INSERTs of receive-queue rows, one transaction per batch."""
    engine = create_engine(url)
    try:
        baseline_meta.create_all(engine)
        pool = itertools.cycle(payloads)
        position = itertools.count(1)

        mark = "?" if backend == "sqlite" else "%s"
        insert_sql = (
            "INSERT INTO bench_recv_baseline (queue_id, type, source_position, snapshot_id,"
            f" snapshot_count, payload, received_at) VALUES ({', '.join([mark] * 7)})"
        )

        def step() -> int:
            now = time.time()
            rows = [(1, 1, next(position), "", 0, next(pool), now) for _ in range(BATCH_ENTRIES)]
            with engine.connect() as conn:
                conn = conn.execution_options(lr_immediate=True)  # as the store's writes
                with conn.begin():
                    # The driver's own executemany with tuples: the rawest batched insert.
                    raw = conn.connection.driver_connection
                    cur = raw.cursor()
                    try:
                        cur.executemany(insert_sql, rows)
                    finally:
                        cur.close()
            return BATCH_ENTRIES

        run_for(min(0.5, seconds / 5), step)  # warm-up
        m = run_for(seconds, step)
        copy_rate = None
        if backend == "postgresql":

            def copy_step() -> int:
                now = time.time()
                with engine.connect() as conn, conn.begin():
                    raw = conn.connection.driver_connection
                    with raw.cursor() as cur, cur.copy(_COPY_BASELINE) as copy:
                        copy.set_types(
                            ["int4", "int2", "int8", "varchar", "int8", "bytea", "float8"]
                        )
                        for _ in range(BATCH_ENTRIES):
                            copy.write_row((1, 1, next(position), "", 0, next(pool), now))
                return BATCH_ENTRIES

            run_for(min(0.5, seconds / 5), copy_step)
            copy_rate = run_for(seconds, copy_step).rate
    finally:
        engine.dispose()
    return Baseline(backend, BATCH_ENTRIES, m.count, m.seconds, m.rate, copy_rate)


_COPY_BASELINE = (
    "COPY bench_recv_baseline (queue_id, type, source_position, snapshot_id, snapshot_count,"
    " payload, received_at) FROM STDIN (FORMAT BINARY)"
)


# -- databases and sites -------------------------------------------------------------------


class Databases:
    """Fresh databases of one backend: SQLite files or PostgreSQL schemas.

    With ``own_databases``, each PostgreSQL site gets a throwaway database instead of a
    schema: a transaction held open in one then pins no other site's vacuum horizon.
    """

    def __init__(
        self,
        backend: str,
        stack: contextlib.ExitStack,
        workdir: Path,
        pg_url: str,
        own_databases: bool = False,
    ):
        self.backend = backend
        self.stack = stack
        self.workdir = workdir
        self.pg_url = pg_url
        self.own_databases = own_databases

    def new(self, name: str) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.workdir / f'{name}.db'}"
        holder = PgDatabase(self.pg_url) if self.own_databases else PgSchema(self.pg_url)
        return self.stack.enter_context(holder).url

    def facts(self) -> dict[str, Any]:
        if self.backend == "sqlite":
            return {"journal_mode": "wal", "synchronous": "NORMAL", "file_in": "a temp directory"}
        engine = create_engine(self.pg_url)
        try:
            with engine.connect() as conn:
                return dict(pg_facts(conn))
        finally:
            engine.dispose()


def _q(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_site_config(
    path: Path,
    site_id: str,
    db_url: str,
    *,
    listen_port: int = 0,
    destinations: Sequence[tuple[str, int]] = (),
    sources: Sequence[str] = (),
    snapshot: str = "none",
    retention_max_entries: int | None = None,
    shared_reader: bool = True,
    clients: Sequence[str] = (CLIENT,),
) -> Path:
    """A site config with the product's replication and retry defaults (plaintext + token);
    each of ``clients`` a ``[[clients]]`` table with ``snapshot``."""
    lines = ["[site]", f"id = {_q(site_id)}", f"database_url = {_q(db_url)}"]
    if listen_port:
        lines.append(f'listen = "127.0.0.1:{listen_port}"')
    lines += [
        "[security]",
        'transport = "plaintext"',
        'client_auth = "token"',
        f"token = {_q('token-' + site_id)}",
    ]
    for client in clients:
        lines += ["[[clients]]", f"name = {_q(client)}", f"snapshot = {_q(snapshot)}"]
    for dest, port in destinations:
        lines += ["[[destinations]]", f"id = {_q(dest)}", f'address = "127.0.0.1:{port}"']
    for src in sources:
        lines += ["[[sources]]", f"id = {_q(src)}", f"token = {_q('token-' + src)}"]
    if not shared_reader:
        lines += ["[replication]", "shared_reader = false"]
    if retention_max_entries is not None:
        lines += ["[retention]", f"max_entries = {retention_max_entries}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def stop_process(server: LrServer, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` (the sites are disposable)."""
    proc = server.proc
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def process_cpu(server: LrServer | None) -> float:
    """User + system CPU seconds a site's process has used so far (Linux ``/proc``)."""
    if server is None or server.proc is None:
        return 0.0
    return cpu_profile.process_cpu(server.proc.pid) or 0.0


@dataclass
class CpuUse:
    """CPU seconds of the ``lr server`` processes over a cell's measured window."""

    source: float = 0.0
    sinks: float = 0.0
    ms_per_1k_deliveries: float = 0.0  # (source + sinks) per 1,000 entry deliveries


class CpuMeter:
    def __init__(self, cluster: Cluster, src: Source) -> None:
        self.cluster, self.src = cluster, src
        self.start = self._now()

    def _now(self) -> tuple[float, float]:
        sinks = sum(process_cpu(self.cluster.servers[s]) for s in self.src.healthy)
        return process_cpu(self.src.server), sinks

    def done(self, deliveries: int) -> CpuUse:
        src, sinks = self._now()
        used_src, used_sinks = src - self.start[0], sinks - self.start[1]
        per = (used_src + used_sinks) * 1e6 / deliveries if deliveries else 0.0
        return CpuUse(round(used_src, 2), round(used_sinks, 2), round(per, 1))


class Cluster:
    """The sink sites of one backend, started once, and what they received."""

    def __init__(
        self, dbs: Databases, workdir: Path, source_ids: Sequence[str], sinks: int
    ) -> None:
        self.sink_ids = [f"sink-{i}" for i in range(1, sinks + 1)]
        self.dbs = dbs
        self.workdir = workdir
        self.source_ids = list(source_ids)
        self.ports = {s: free_port() for s in self.sink_ids}
        self.urls = {s: dbs.new(s.replace("-", "_")) for s in self.sink_ids}
        self.servers: dict[str, LrServer] = {}
        self.stores: dict[str, SQLAlchemyQueueStore] = {}
        self.shared_reader = True  # sources' [replication] shared_reader

    def start(self) -> None:
        for sink in self.sink_ids:
            cfg = write_site_config(
                self.workdir / f"{sink}.toml",
                sink,
                self.urls[sink],
                listen_port=self.ports[sink],
                sources=self.source_ids,
            )
            self.servers[sink] = LrServer(cfg, self.workdir).start()
        for sink in self.sink_ids:
            self.servers[sink].wait_listening(self.ports[sink], timeout=60)
            store = open_store(self.urls[sink])
            store.create_schema()
            self.stores[sink] = store

    def close(self) -> None:
        for server in self.servers.values():
            stop_process(server, timeout=10)
        for store in self.stores.values():
            store.engine.dispose()

    # -- what a sink holds from one source --------------------------------------------------
    def queue_id(self, sink: str, source: str) -> int | None:
        for q in self.stores[sink].queues.list_queues(CLIENT):
            if q.source_id == source:
                return q.queue_id
        return None

    def last_position(self, sink: str, source: str) -> int:
        return self.stores[sink].recv.sink_progress(source, CLIENT).last_position

    def received_groups(self, sink: str, source: str) -> list[tuple[float, int]]:
        """(received_at, entries) per applied batch, oldest first."""
        qid = self.queue_id(sink, source)
        if qid is None:
            return []
        with self.stores[sink].read() as conn:
            rows = conn.execute(
                text(
                    "SELECT received_at, count(*) FROM lrq_recv_entries WHERE queue_id = :q "
                    "GROUP BY received_at ORDER BY received_at"
                ),
                {"q": qid},
            ).all()
        return [(float(r[0]), int(r[1])) for r in rows]

    def received_positions(self, sink: str, source: str) -> list[tuple[int, float]]:
        qid = self.queue_id(sink, source)
        if qid is None:
            return []
        with self.stores[sink].read() as conn:
            rows = conn.execute(
                text(
                    "SELECT source_position, received_at FROM lrq_recv_entries "
                    "WHERE queue_id = :q ORDER BY seq"
                ),
                {"q": qid},
            ).all()
        return [(int(r[0]), float(r[1])) for r in rows]

    def clear(self, source: str) -> None:
        """Drop what ``source`` delivered, so every cell inserts into an empty table."""
        for sink in self.sink_ids:
            qid = self.queue_id(sink, source)
            if qid is None:
                continue
            with self.stores[sink].write() as conn:
                conn.execute(text("DELETE FROM lrq_recv_entries WHERE queue_id = :q"), {"q": qid})


@dataclass
class Source:
    """One cell's source site: its database, client and (once started) its server."""

    site_id: str
    url: str
    store: SQLAlchemyQueueStore
    client: RoutingQueueClient
    destinations: list[str]
    healthy: list[str]
    server: LrServer | None = None
    proxy: FaultProxy | None = None
    started_at: float = 0.0  # when its server process was launched


@contextlib.contextmanager
def source_site(cluster: Cluster, site_id: str, dests: int, stalled: bool) -> Iterator[Source]:
    url = cluster.dbs.new(site_id.replace("-", "_"))
    store = open_store(url)
    store.create_schema()
    names = cluster.sink_ids[:dests]
    client = RoutingQueueClient(store, source_id=site_id, client_name=CLIENT)
    client.register_destinations(names)
    healthy = names[:-1] if stalled else list(names)
    src = Source(site_id, url, store, client, names, healthy)
    try:
        yield src
    finally:
        if src.server is not None:
            stop_process(src.server, timeout=0.5)  # disposable: no need to wait long
        if src.proxy is not None:
            src.proxy.stop()
        cluster.clear(site_id)
        store.engine.dispose()


def start_source(cluster: Cluster, src: Source, *, paced: bool, provider: bool) -> None:
    ports = []
    for name in src.destinations:
        port = cluster.ports[name]
        if name not in src.healthy:
            src.proxy = FaultProxy("127.0.0.1", port).start()
            src.proxy.stall()
            port = src.proxy.port
        ports.append((name, port))
    cfg = write_site_config(
        cluster.workdir / f"{src.site_id}.toml",
        src.site_id,
        src.url,
        destinations=ports,
        snapshot="app" if provider else "none",
        retention_max_entries=RETENTION_MAX_ENTRIES if paced else None,
        shared_reader=cluster.shared_reader,
    )
    src.server = LrServer(cfg, cluster.workdir).start()
    src.started_at = time.time()


def wait_delivered(
    cluster: Cluster, src: Source, position: int, timeout: float
) -> tuple[bool, float]:
    """Poll until every healthy sink holds ``position``; (all delivered, seconds waited)."""
    start = time.monotonic()
    pending = set(src.healthy)
    while pending and time.monotonic() - start < timeout:
        for sink in sorted(pending):
            if cluster.last_position(sink, src.site_id) >= position:
                pending.discard(sink)
        if pending:
            if src.server and src.server.proc and src.server.proc.poll() is not None:
                raise RuntimeError(f"source server exited\n{src.server.log()}")
            time.sleep(0.1)
    return not pending, time.monotonic() - start


def wait_first_batch(cluster: Cluster, src: Source, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(cluster.last_position(s, src.site_id) > 0 for s in src.healthy):
            return
        time.sleep(0.02)


# -- throughput ------------------------------------------------------------------------------


@dataclass
class DestRate:
    destination: str
    entries: int
    batches: int
    span_seconds: float
    rate: float


@dataclass
class ThroughputCell:
    backend: str
    destinations: int
    stalled: int
    entries_per_destination: int
    prefill_rate: float
    complete: bool
    drain_seconds: float
    aggregate_rate: float
    per_destination: list[DestRate]
    send_queue_after: int
    cpu: CpuUse
    order: int = 0  # position among the many-destination drains (ABBA)

    @property
    def mean_rate(self) -> float:
        rates = [d.rate for d in self.per_destination]
        return sum(rates) / len(rates) if rates else 0.0


def prefill(src: Source, n: int, payloads: Sequence[bytes]) -> tuple[int, float]:
    """Transmit ``n`` entries for every destination, 500 per transaction; (last pos, rate)."""
    pool = itertools.cycle(payloads)
    last = 0
    start = time.perf_counter()
    done = 0
    while done < n:
        k = min(PREFILL_PER_TXN, n - done)
        msgs = [LRMessageWithDestinations(next(pool), src.destinations) for _ in range(k)]
        with src.store.engine.begin() as conn:
            ref = src.client.transmit_log_entry_messages(conn, msgs)[-1]
        done += k
    (last,) = src.client.positions_of([ref], timeout=60)
    assert last is not None, "the prefill's last entry got no position"
    return last, n / (time.perf_counter() - start)


def apply_workarounds(src: Source, backend: str, *, prefilled: bool) -> None:
    """``--workarounds``: emulate two proposed fixes from outside the product.

    SQLite: nothing (the tag table it indexed is gone since schema revision 0003).
    PostgreSQL: ``ANALYZE`` the freshly filled send queue (what autovacuum does on a site that
    has run for a while), so the per-destination read uses an ordered index scan instead of a
    bitmap scan over the whole backlog.
    """
    with src.store.engine.connect() as conn:
        if backend == "postgresql" and prefilled:
            conn.exec_driver_sql("ANALYZE lrq_send_positions")
        conn.commit()


def send_queue_size(store: SQLAlchemyQueueStore) -> int:
    return store.inspection.queue_sizes()[0]


def throughput_cell(
    cluster: Cluster,
    site_id: str,
    dests: int,
    stalled: bool,
    n: int,
    timeout: float,
    payloads: Sequence[bytes],
    workarounds: bool,
) -> ThroughputCell:
    with source_site(cluster, site_id, dests, stalled) as src:
        last, prefill_rate = prefill(src, n, payloads)
        if workarounds:
            apply_workarounds(src, cluster.dbs.backend, prefilled=True)
        start_source(cluster, src, paced=False, provider=False)
        wait_first_batch(cluster, src, timeout)  # the source's start-up is not metered
        meter = CpuMeter(cluster, src)
        complete, waited = wait_delivered(cluster, src, last, timeout)
        ended = time.time()
        per_dest = []
        firsts, lasts, total = [], [], 0
        for sink in src.healthy:
            groups = cluster.received_groups(sink, site_id)
            entries = sum(c for _, c in groups)
            total += entries
            if not groups:
                per_dest.append(DestRate(sink, 0, 0, 0.0, 0.0))
                continue
            firsts.append(groups[0][0])
            lasts.append(groups[-1][0])
            if len(groups) < 2:  # a tiny drain: count from the launch of the source server
                span = groups[0][0] - src.started_at
                per_dest.append(DestRate(sink, entries, 1, span, entries / span))
                continue
            span = groups[-1][0] - groups[0][0]
            counted = entries - groups[-1][1]  # the batches applied within the span
            if entries < n:  # not drained in time: stalls count, up to the end of the wait
                span, counted = ended - groups[0][0], entries
            per_dest.append(
                DestRate(sink, entries, len(groups), span, counted / span if span > 0 else 0.0)
            )
        span = (max(lasts) - min(firsts)) if firsts else 0.0
        if not complete and firsts:
            span = ended - min(firsts)
        if span <= 0 and firsts:
            span = max(lasts) - src.started_at
        aggregate = total / span if span > 0 else 0.0
        cpu = meter.done(total)
        queued = send_queue_size(src.store)
    return ThroughputCell(
        cluster.dbs.backend,
        dests,
        int(stalled),
        n,
        prefill_rate,
        complete,
        waited,
        aggregate,
        per_dest,
        queued,
        cpu,
    )


# -- latency ----------------------------------------------------------------------------------


@dataclass
class Latency:
    entries: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class LatencyCell:
    backend: str
    destinations: int
    stalled: int
    offered_rate: float
    achieved_rate: float
    transmitted: int
    transmit_errors: int
    max_behind_ms: float
    transmit_txn: Latency
    load_cut_short: bool
    complete: bool
    pooled: Latency
    per_destination: dict[str, Latency]
    send_queue: list[tuple[float, int]] = field(default_factory=list)  # (seconds, entries)
    drops: list[dict[str, Any]] = field(default_factory=list)
    snapshot_provider: bool = False
    cpu: CpuUse = field(default_factory=CpuUse)
    writers: int = 1  # transmitting threads sharing the offered load
    idle_transaction: bool = False  # a session idle in transaction on the source meanwhile
    entries_per_batch: float = 0.0  # the healthy sinks' entries over the batches they applied

    @property
    def worst_p99_ms(self) -> float:
        return max((x.p99_ms for x in self.per_destination.values()), default=0.0)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def latency_of(values_ms: list[float]) -> Latency:
    values_ms.sort()
    return Latency(
        len(values_ms),
        percentile(values_ms, 0.50),
        percentile(values_ms, 0.99),
        values_ms[-1] if values_ms else 0.0,
    )


class Sampler:
    """Samples the source's send-queue size every ``interval`` seconds, on a thread."""

    def __init__(self, store: SQLAlchemyQueueStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-sampler", daemon=True)

    def start(self) -> Sampler:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                size = send_queue_size(self.store)
                self.samples.append((round(time.monotonic() - self.t0, 3), size))
            except Exception:  # a busy SQLite file: skip one sample
                pass
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


#: Seconds between the paced load's requests for the positions of what it committed.
POSITIONS_EVERY = 2.0


@dataclass
class PacedLoad:
    """What a paced transmitter managed: commits, achieved rate, its own transaction times."""

    commits: list[tuple[int, float]]  # (position, time.time() when COMMIT returned)
    achieved_rate: float
    errors: int
    max_behind_ms: float
    txn: Latency  # BEGIN .. COMMIT of each transmitting transaction
    cut_short: bool  # stopped at the wall-clock cap before offering every entry


def paced_load(
    store: SQLAlchemyQueueStore,
    client: RoutingQueueClient,
    destinations: list[str],
    rate: float,
    seconds: float,
    payloads: Sequence[bytes],
    per_txn: int = 1,
    writers: int = 1,
    start: float | None = None,
) -> PacedLoad:
    """``per_txn`` entries per transaction at ``rate`` entries/s for ``rate * seconds``.

    ``writers`` threads share the schedule, each with its own connection: transaction
    ``k`` is due at its slot and run by writer ``k % writers``. A writer that falls
    behind catches up without pausing, but stops at three times the planned duration:
    the offered load was not reached then, and the cell says so. ``start`` (a
    ``time.perf_counter()`` value, now by default) is when the schedule begins: calls
    for consecutive spans of one long load pass the end of the previous span, so the
    time spent between calls is caught up.
    """
    n = max(1, int(rate * seconds))
    slots = list(range(0, n, per_txn))
    sent: list[tuple[EntryRef, float]] = []
    txn_ms: list[float] = []
    errors = [0]
    behind = [0.0]
    lock = threading.Lock()
    engine: Engine = (
        store.engine
        if writers == 1
        else create_engine(
            store.engine.url.render_as_string(hide_password=False),
            pool_size=writers,
            max_overflow=0,
        )
    )
    start = time.perf_counter() if start is None else start
    cap = start + 3 * seconds

    def writer(w: int) -> None:
        pool = itertools.cycle(payloads[w:] + payloads[:w])
        for i in slots[w::writers]:
            due = start + i / rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            else:
                with lock:
                    behind[0] = max(behind[0], now - due)
                if now > cap:
                    return
            began = time.perf_counter()
            count = min(per_txn, n - i)
            try:
                with engine.begin() as conn:
                    refs = [
                        client.transmit_log_entry_message(conn, next(pool), destinations)
                        for _ in range(count)
                    ]
                committed = time.time()
                with lock:
                    sent.extend((ref, committed) for ref in refs)
                    txn_ms.append((time.perf_counter() - began) * 1000.0)
            except Exception:  # e.g. BackpressureError: counted, the load goes on
                with lock:
                    errors[0] += count

    # PostgreSQL gives positions after commit, and knows them for one rotation period
    # (docs: positions_of): ask for them as the load goes, not only at its end.
    found: list[int | None] = []
    done = threading.Event()

    def resolve(wait: float) -> None:
        with lock:
            found.extend([None] * (len(sent) - len(found)))
            todo = [i for i, p in enumerate(found) if p is None]
            refs = [sent[i][0] for i in todo]
        for i, position in zip(todo, client.positions_of(refs, timeout=wait), strict=True):
            found[i] = position

    def resolver() -> None:
        while not done.wait(POSITIONS_EVERY):
            resolve(0.0)

    try:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for thread in threads:
            thread.start()
        asking = threading.Thread(target=resolver)
        asking.start()
        for thread in threads:
            thread.join()
        done.set()
        asking.join()
    finally:
        done.set()
        if engine is not store.engine:
            engine.dispose()
    elapsed = time.perf_counter() - start
    resolve(60.0)
    commits = [(p, at) for p, (_, at) in zip(found, sent, strict=True) if p is not None]
    if len(commits) < len(sent):
        raise RuntimeError(f"{len(sent) - len(commits)} committed entries got no position")
    return PacedLoad(
        commits,
        len(commits) / elapsed,
        errors[0],
        behind[0] * 1000.0,
        latency_of(txn_ms),
        len(commits) + errors[0] < n,
    )


@contextlib.contextmanager
def idle_transaction(store: SQLAlchemyQueueStore, wanted: bool) -> Iterator[Connection | None]:
    """With ``wanted``, a session on the source database left open for the whole block.

    PostgreSQL: it takes a transaction id (``pg_current_xact_id()``) and then does
    nothing, as an application connection left idle in transaction would. SQLite has
    one writer at a time, so the session holds a read transaction (a WAL snapshot).
    The block gets the session's connection (None without ``wanted``).
    """
    if not wanted:
        yield None
        return
    with store.engine.connect() as conn:
        conn.begin()
        if store.dialect == "postgresql":
            conn.execute(text("SELECT pg_current_xact_id()"))
        else:
            conn.execute(text("SELECT count(*) FROM lrq_send_log_entries"))
        try:
            yield conn
        finally:
            conn.rollback()


def transmit_control(
    dbs: Databases,
    sinks: int,
    rate: float,
    seconds: float,
    payloads: Sequence[bytes],
    per_txn: int = 1,
) -> PacedLoad:
    """The paced transmitter alone (no site running): what this machine allows right now."""
    store = open_store(dbs.new("control"))
    try:
        store.create_schema()
        names = [f"sink-{i}" for i in range(1, sinks + 1)]
        client = RoutingQueueClient(store, source_id="src-control", client_name=CLIENT)
        client.register_destinations(names)
        load = paced_load(store, client, names, rate, seconds, payloads, per_txn)
        load.commits = []
        return load
    finally:
        store.engine.dispose()


def snapshot_runner(src: Source, stop: threading.Event) -> threading.Thread | None:
    """An in-process provider that answers every full-sync request with an empty snapshot."""
    try:
        from lr_client.snapshot import SnapshotProviderRunner
    except ImportError:
        return None
    runner = SnapshotProviderRunner(src.store, CLIENT, lambda ctx: None)
    thread = threading.Thread(
        target=runner.run, args=(stop, 0.2), name="snapshot-runner", daemon=True
    )
    thread.start()
    return thread


def has_snapshot_provider() -> bool:
    try:
        from lr_client.snapshot import SnapshotProviderRunner  # noqa: F401
    except ImportError:
        return False
    return True


def latency_cell(
    cluster: Cluster,
    site_id: str,
    dests: int,
    stalled: bool,
    rate: float,
    seconds: float,
    payloads: Sequence[bytes],
    provider: bool,
    workarounds: bool,
    per_txn: int = 1,
    writers: int = 1,
    idle: bool = False,
) -> LatencyCell:
    stop = threading.Event()
    with source_site(cluster, site_id, dests, stalled) as src:
        if workarounds:
            apply_workarounds(src, cluster.dbs.backend, prefilled=False)
        runner = snapshot_runner(src, stop) if provider else None
        try:
            start_source(cluster, src, paced=True, provider=provider)
            # Ready: one entry has reached every healthy sink (connections, first-contact syncs).
            with src.store.engine.begin() as conn:
                ref = src.client.transmit_log_entry_message(conn, payloads[0], src.destinations)
            (first,) = src.client.positions_of([ref], timeout=60)
            if first is None:
                raise RuntimeError(f"{site_id}: the first entry got no position")
            ready, _ = wait_delivered(cluster, src, first, timeout=60)
            if not ready:
                raise RuntimeError(f"{site_id}: sinks not ready\n{src.server and src.server.log()}")
            sampler = Sampler(src.store, SAMPLE_INTERVAL).start()
            meter = CpuMeter(cluster, src)
            load_started = time.time()
            with idle_transaction(src.store, idle):
                load = paced_load(
                    src.store,
                    src.client,
                    src.destinations,
                    rate,
                    seconds,
                    payloads,
                    per_txn,
                    writers,
                )
                commits = load.commits
                last = max((p for p, _ in commits), default=first)
                complete, _ = wait_delivered(cluster, src, last, timeout=max(30.0, 3 * seconds))
            cpu = meter.done(len(commits) * len(src.healthy))
            time.sleep(min(3.0, seconds))  # the tail: trim and retention once the load stops
            sampler.stop()
            committed = dict(commits)
            warm_until = load_started + min(WARMUP_SECONDS, seconds / 4)
            pooled: list[float] = []
            per_dest: dict[str, Latency] = {}
            applied = batches = 0
            for sink in src.healthy:
                values = [
                    (received - committed[pos]) * 1000.0
                    for pos, received in cluster.received_positions(sink, site_id)
                    if pos in committed and committed[pos] >= warm_until
                ]
                pooled += values
                per_dest[sink] = latency_of(values)
                for _, n in cluster.received_groups(sink, site_id):
                    applied, batches = applied + n, batches + 1
            drops = [
                {
                    "destination": d.destination,
                    "first_dropped_position": d.first_dropped_position,
                    "dropped_after_s": round(d.dropped_at - load_started, 2),
                    "reason": d.reason,
                }
                for d in src.store.retention.list_drops()
            ]
        finally:
            stop.set()
            if runner is not None:
                runner.join(timeout=5)
    return LatencyCell(
        cluster.dbs.backend,
        dests,
        int(stalled),
        rate,
        load.achieved_rate,
        len(commits),
        load.errors,
        load.max_behind_ms,
        load.txn,
        load.cut_short,
        complete,
        latency_of(pooled),
        per_dest,
        sampler.samples,
        drops,
        provider,
        cpu,
        writers,
        idle,
        applied / batches if batches else 0.0,
    )


# -- a backend ------------------------------------------------------------------------------


def cell_sources(rounds: int) -> list[str]:
    """Every cell's source id (each cell has its own source site): sinks must accept them."""
    many = [f"src-tn-{r}{'-stall' if s else ''}" for r in range(rounds) for s in (False, True)]
    return ["src-t1", *many, "src-l1", "src-l1-idle", "src-ln", "src-ln-stall"]


@dataclass
class BackendResult:
    backend: str
    baseline: Baseline
    throughput: list[ThroughputCell]
    latency: list[LatencyCell]
    facts: dict[str, Any]
    control: PacedLoad


def run_backend(
    name: str, args: argparse.Namespace, pg_url: str, console: Console
) -> BackendResult:
    payloads = [os.urandom(PAYLOAD_BYTES) for _ in range(1024)]
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lrbench-rep-")))
        dbs = Databases(name, stack, workdir, pg_url)
        facts = dbs.facts()
        console.log(f"{name}: baseline, {args.seconds:g} s of {BATCH_ENTRIES}-row batches")
        baseline = measure_baseline(dbs.new("baseline"), name, args.seconds, payloads)
        sinks = args.destinations
        console.log(f"{name}: baseline {baseline.rate:,.0f} entries/s; starting {sinks} sinks")
        cluster = Cluster(dbs, workdir, cell_sources(args.rounds), sinks)
        cluster.shared_reader = not args.no_shared_reader
        stack.callback(cluster.close)
        cluster.start()
        timeout = max(15.0, 3 * args.seconds)
        # Size the drains to last about --seconds: the 1-destination cell from the baseline
        # (we expect at most that rate), the 8-destination cells from the 1-destination rate.
        n1 = args.entries or _round(baseline.rate * 0.3 * args.seconds)
        throughput = []
        console.log(f"{name}: throughput, 1 destination, {n1:,} entries")
        t1 = throughput_cell(cluster, "src-t1", 1, False, n1, timeout, payloads, args.workarounds)
        throughput.append(t1)
        expected = max(t1.aggregate_rate, 0.3 * baseline.rate)
        n8 = args.entries or max(4 * BATCH_ENTRIES, _round(expected * args.seconds / sinks))
        # Healthy and stalled alternate (ABBA for two rounds), so drift hits both alike.
        runs: dict[bool, int] = {False: 0, True: 0}
        for i in range(2 * args.rounds):
            stalled = (i % 4) in (1, 2)
            label = f"{sinks - 1} healthy + 1 stalled" if stalled else f"{sinks} destinations"
            console.log(f"{name}: throughput, {label}, {n8:,} entries each")
            site = f"src-tn-{runs[stalled]}{'-stall' if stalled else ''}"
            runs[stalled] += 1
            cell = throughput_cell(
                cluster, site, sinks, stalled, n8, timeout, payloads, args.workarounds
            )
            cell.order = i
            throughput.append(cell)
        control_seconds = min(2.0, args.seconds)
        console.log(f"{name}: control, the paced transmitter alone for {control_seconds:g} s")
        control = transmit_control(
            dbs, sinks, args.rate, control_seconds, payloads, args.entries_per_txn
        )
        latency = []
        provider = has_snapshot_provider()
        cells = [(1, False, False), (sinks, False, False), (sinks, True, False)]
        if args.idle_transaction:
            cells.insert(1, (1, False, True))
        for dests, stalled, idle in cells:
            console.log(
                f"{name}: latency at {args.rate:g}/s for {args.seconds:g} s, "
                f"{dests} destination(s){', 1 stalled' if stalled else ''}, "
                f"{args.writers} writer(s){', a session idle in transaction' if idle else ''}"
            )
            site = "src-l1" if dests == 1 else f"src-ln{'-stall' if stalled else ''}"
            latency.append(
                latency_cell(
                    cluster,
                    site + ("-idle" if idle else ""),
                    dests,
                    stalled,
                    args.rate,
                    args.seconds,
                    payloads,
                    provider and dests > 1,
                    args.workarounds,
                    args.entries_per_txn,
                    args.writers,
                    idle,
                )
            )
    return BackendResult(name, baseline, throughput, latency, facts, control)


def _round(n: float) -> int:
    return max(2 * BATCH_ENTRIES, int(n) // BATCH_ENTRIES * BATCH_ENTRIES)


# -- reporting -------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def ratios_of(result: BackendResult) -> dict[str, Any]:
    """Ratios against the targets; repeated drains of one kind are averaged."""
    lat = {(c.destinations, c.stalled): c for c in result.latency}
    base = result.baseline.rate
    many = max((c.destinations for c in result.throughput), default=0)

    def rates(dests: int, stalled: int, attr: str) -> float | None:
        cells = [c for c in result.throughput if c.destinations == dests and c.stalled == stalled]
        return _mean([float(getattr(c, attr)) for c in cells])

    l_healthy, l_stalled = lat.get((many, 0)), lat.get((many, 1))

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    out: dict[str, Any] = {
        "one_dest_vs_baseline": div(rates(1, 0, "aggregate_rate"), base),
        "one_dest_vs_copy_baseline": div(rates(1, 0, "aggregate_rate"), result.baseline.copy_rate),
        "many_dest_aggregate_vs_baseline": div(rates(many, 0, "aggregate_rate"), base),
        "many_dest_mean_rate_healthy": rates(many, 0, "mean_rate"),
        "many_dest_mean_rate_stalled": rates(many, 1, "mean_rate"),
        "stalled_throughput_vs_healthy": div(
            rates(many, 1, "mean_rate"), rates(many, 0, "mean_rate")
        ),
        "stalled_p99_ratio_healthy_over_stalled": div(
            l_healthy.pooled.p99_ms if l_healthy else None,
            l_stalled.pooled.p99_ms if l_stalled else None,
        ),
    }
    out["targets_met"] = {
        "one_dest_vs_baseline": _met(out["one_dest_vs_baseline"], TARGET_VS_BASELINE),
        "p99_at_offered_load": {
            f"{c.destinations}d{'+stall' if c.stalled else ''}": c.pooled.p99_ms <= TARGET_P99_MS
            for c in result.latency
        },
        "stalled_throughput": _met(out["stalled_throughput_vs_healthy"], TARGET_STALLED),
        "stalled_p99": _met(out["stalled_p99_ratio_healthy_over_stalled"], TARGET_STALLED),
    }
    return out


def _met(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


def report(console: Console, results: list[BackendResult], ratios: dict[str, Any]) -> None:
    rows = []
    for r in results:
        for c in r.throughput:
            rates = [d.rate for d in c.per_destination]
            label = f"{c.destinations}" + (" (1 stalled)" if c.stalled else "")
            rows.append(
                [
                    r.backend,
                    label,
                    f"{c.entries_per_destination:,}",
                    fmt_rate(min(rates) if rates else None),
                    fmt_rate(c.mean_rate),
                    fmt_rate(max(rates) if rates else None),
                    fmt_rate(c.aggregate_rate),
                    fmt_rate(r.baseline.rate),
                    fmt_ratio(c.aggregate_rate / r.baseline.rate, TARGET_VS_BASELINE)
                    if c.destinations == 1
                    else fmt_ratio(c.aggregate_rate / r.baseline.rate),
                    f"{c.cpu.ms_per_1k_deliveries:,.0f}",
                    "yes" if c.complete else "[red]no[/]",
                ]
            )
    print_table(
        console,
        "Replication throughput, entries/s (1 KiB payloads; source send queue -> sink receive"
        " queues)",
        [
            "backend",
            "dests",
            "entries/dest",
            "per dest min",
            "mean",
            "max",
            "aggregate",
            "baseline",
            "agg/baseline",
            "CPU ms/1k",
            "complete",
        ],
        rows,
        caption=f"target: 1 destination >= {TARGET_VS_BASELINE}x the sink's raw batched insert "
        f"(baseline); the stalled destination is not counted; CPU ms/1k: CPU of the lr "
        "server processes per 1,000 entry deliveries",
    )
    rows = []
    for r in results:
        ctl = r.control
        rows.append(
            [r.backend, "none (control)", fmt_rate(ctl.achieved_rate), f"{ctl.txn.p99_ms:.1f}"]
            + ["-"] * 10
        )
        for lc in r.latency:
            label = f"{lc.destinations}" + (" (1 stalled)" if lc.stalled else "")
            label += " + idle txn" if lc.idle_transaction else ""
            rows.append(
                [
                    r.backend,
                    label,
                    fmt_rate(lc.achieved_rate) + (" [red](cut)[/]" if lc.load_cut_short else ""),
                    f"{lc.transmit_txn.p99_ms:.1f}",
                    f"{lc.pooled.p50_ms:.1f}",
                    _p99(lc.pooled.p99_ms),
                    _p99(lc.worst_p99_ms),
                    f"{lc.pooled.max_ms:.0f}",
                    str(lc.transmit_errors),
                    f"{max((s for _, s in lc.send_queue), default=0):,}",
                    ", ".join(f"{d['destination']}@{d['dropped_after_s']}s" for d in lc.drops)
                    or "-",
                    f"{lc.cpu.ms_per_1k_deliveries:,.0f}",
                    f"{lc.entries_per_batch:.1f}",
                    "yes" if lc.complete else "[red]no[/]",
                ]
            )
    print_table(
        console,
        "Delivery latency, ms (commit at source -> in the sink's receive queue), paced load",
        [
            "backend",
            "dests",
            "achieved/s",
            "txn p99",
            "p50",
            "p99",
            "worst dest p99",
            "max",
            "errors",
            "max send queue",
            "dropped",
            "CPU ms/1k",
            "per batch",
            "complete",
        ],
        rows,
        caption=f"target: p99 <= {TARGET_P99_MS:.0f} ms; the first {WARMUP_SECONDS:g} s is "
        "warm-up (excluded); txn p99: the transmitter's own BEGIN..COMMIT; control: the "
        "transmitter with no site running; per batch: entries per batch the sinks applied",
    )
    rows = []
    for r in results:
        x = ratios[r.backend]
        rows.append(
            [
                r.backend,
                fmt_ratio(x["one_dest_vs_baseline"], TARGET_VS_BASELINE),
                fmt_ratio(x["one_dest_vs_copy_baseline"]),
                fmt_ratio(x["stalled_throughput_vs_healthy"], TARGET_STALLED),
                fmt_ratio(x["stalled_p99_ratio_healthy_over_stalled"], TARGET_STALLED),
            ]
        )
    print_table(
        console,
        "Ratios against targets",
        [
            "backend",
            "1 dest / baseline",
            "1 dest / raw COPY",
            "stalled: thr vs healthy",
            "stalled: p99 healthy/stalled",
        ],
        rows,
        caption=f"targets: >= {TARGET_VS_BASELINE}x (of the batched-INSERT baseline), "
        f">= {TARGET_STALLED}x, >= {TARGET_STALLED}x; raw COPY (PostgreSQL): the same rows by "
        "binary COPY, as the receiver writes them",
    )


def _p99(ms: float) -> str:
    shown = f"{ms:.1f}"
    return f"[green]{shown}[/]" if ms <= TARGET_P99_MS else f"[red]{shown}[/]"


# -- the send-queue chart ---------------------------------------------------------------------

_COLOURS = {"sqlite": "#1f77b4", "postgresql": "#d62728"}


def queue_svg(results: list[BackendResult], title: str) -> str:
    """A line chart of the send queue's size over time, one line per 8-destination cell."""
    series, markers = [], []
    for r in results:
        for c in r.latency:
            if c.destinations == 1 or not c.send_queue:
                continue
            n = c.destinations
            label = (
                f"{r.backend}, {f'{n - 1} healthy + 1 stalled' if c.stalled else f'{n} healthy'}"
            )
            colour = _COLOURS.get(r.backend, "#555")
            points = [(float(t), float(v)) for t, v in c.send_queue]
            series.append(Series(label, colour, points, dashed=bool(c.stalled)))
            markers += [
                (max(0.0, float(d["dropped_after_s"])), f"{d['destination']} dropped", colour)
                for d in c.drops
            ]
    panel = Panel("entries in lrq_send_log_entries", series, markers)
    return panels_svg(title, "seconds since the paced load started", [panel])


# -- entry point --------------------------------------------------------------------------------


def code_state() -> dict[str, Any]:
    """Which code the sites ran: HEAD and uncommitted changes under lr_client/ and lr_server/."""

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(
                ["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--", "lr_client", "lr_server").splitlines()
    retention = (ROOT / "lr_server" / "retention.py").exists()
    return {
        "head": git("rev-parse", "--short", "HEAD"),
        "uncommitted": [line[3:] for line in dirty],
        "retention_policy_present": retention,
        "snapshot_provider_present": has_snapshot_provider(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--backend", choices=["sqlite", "postgresql", "both"], default="both", help="(both)"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=8.0,
        help="per cell: baseline time, target drain time, paced load time (8)",
    )
    p.add_argument(
        "--entries", type=int, default=0, help="entries per destination in drains (auto)"
    )
    p.add_argument(
        "--destinations",
        type=int,
        default=DEFAULT_SINKS,
        help="sink sites in the many-destination cells (8)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="many-destination drains per kind: 2 runs healthy/stalled as ABBA (2)",
    )
    p.add_argument("--rate", type=float, default=1000.0, help="offered load, entries/s (1000)")
    p.add_argument(
        "--entries-per-txn",
        type=int,
        default=1,
        help="entries per transaction of the paced transmitter (1)",
    )
    p.add_argument(
        "--writers",
        type=int,
        default=1,
        help="transmitting threads sharing the paced load, a connection each (1)",
    )
    p.add_argument(
        "--idle-transaction",
        action="store_true",
        help="add a 1-destination latency cell with a session idle in transaction on the "
        "source for the whole cell",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--workarounds",
        action="store_true",
        help="emulate the proposed fixes from outside the product (see apply_workarounds)",
    )
    p.add_argument(
        "--svg", type=Path, default=None, help="also draw the send-queue chart to this file"
    )
    p.add_argument(
        "--no-shared-reader",
        action="store_true",
        help="sources run with [replication] shared_reader = false (each session reads alone)",
    )
    p.add_argument(
        "--members",
        default="",
        help="member counts, e.g. 1,2,3: instead of the cells above, a source site run by N "
        "lr server members per count (PostgreSQL; see bench/replicate_members.py)",
    )
    args = p.parse_args(argv)
    if args.members:
        from bench.replicate_members import parse_members

        try:
            args.members = parse_members(args.members)
        except argparse.ArgumentTypeError as exc:
            p.error(f"--members: {exc}")
        if args.backend == "sqlite":
            p.error("--members: several members need PostgreSQL")
    if (
        args.seconds <= 0
        or args.rate <= 0
        or args.entries < 0
        or args.destinations < 2
        or args.rounds < 1
        or args.entries_per_txn < 1
        or args.writers < 1
    ):
        p.error(
            "--seconds and --rate must be > 0, --entries >= 0, --destinations >= 2, --rounds >= 1,"
            " --entries-per-txn and --writers >= 1"
        )
    return args


def replicate_result(
    args: argparse.Namespace,
    results: Sequence[BackendResult],
    elapsed: float,
    machine: dict[str, Any],
    started_at: str,
) -> dict[str, Any]:
    """The JSON the benchmark writes, from its settings, the machine's facts at its start
    and each backend's measured cells."""
    replication, retry = ReplicationConfig(), RetryConfig()
    result: dict[str, Any] = {
        "benchmark": "replicate",
        "format": 1,
        "started_at": started_at,
        "settings": {
            "seconds_per_cell": args.seconds,
            "entries_override": args.entries,
            "offered_rate": args.rate,
            "paced_entries_per_txn": args.entries_per_txn,
            "paced_writers": args.writers,
            "idle_transaction_cell": args.idle_transaction,
            "payload_bytes": PAYLOAD_BYTES,
            "sinks": args.destinations,
            "prefill_per_txn": PREFILL_PER_TXN,
            "baseline_batch_entries": BATCH_ENTRIES,
            "warmup_seconds": WARMUP_SECONDS,
            "sample_interval": SAMPLE_INTERVAL,
            "paced_retention_max_entries": RETENTION_MAX_ENTRIES,
            "replication": asdict(replication),
            "retry": asdict(retry),
            "transport": "gRPC plaintext on loopback, token auth; one lr server process per site",
            "stall": "FaultProxy.stall() in front of sink-8 (accepts, forwards nothing)",
            "backends": [r.backend for r in results],
            "workarounds": args.workarounds,
            "shared_reader": not args.no_shared_reader,
        },
        "machine": machine,
        "code": code_state(),
        "targets": {
            "one_dest_vs_baseline_at_least": TARGET_VS_BASELINE,
            "p99_ms_at_most": TARGET_P99_MS,
            "stalled_vs_healthy_at_least": TARGET_STALLED,
        },
        "backend_facts": {},
        "results": {},
        "ratios": {},
    }
    for r in results:
        name = r.backend
        result["backend_facts"][name] = r.facts
        result["results"][name] = {
            "baseline": asdict(r.baseline),
            "throughput": [{**asdict(c), "mean_rate": c.mean_rate} for c in r.throughput],
            "latency": [{**asdict(c), "worst_p99_ms": c.worst_p99_ms} for c in r.latency],
            "transmit_control": asdict(r.control),
        }
        result["ratios"][name] = ratios_of(r)
    result["elapsed_seconds"] = round(elapsed, 1)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    if args.members:
        from bench.replicate_members import run_members

        return run_members(args, pg_url, DEFAULT_OUT)
    console = Console(width=160)
    names = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    machine = machine_facts()
    results = [run_backend(name, args, pg_url, console) for name in names]
    result = replicate_result(args, results, time.perf_counter() - started, machine, started_at)
    report(console, results, result["ratios"])
    write_json(args.out, result)
    if args.svg is not None:
        title = (
            f"Send queue size, {args.destinations} destinations at {args.rate:g} entries/s "
            f"(retention max_entries={RETENTION_MAX_ENTRIES})"
        )
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(queue_svg(results, title))
        console.print(f"wrote {args.svg}")
    console.print(f"wrote {args.out} in {result['elapsed_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
