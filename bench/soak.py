"""Soak: throughput, latency, queue tables and memory over a long run.

    python -m bench.soak --minutes N [--backend postgresql|sqlite|both]
                         [--long-transaction [on|both]] [--rate R | --rate-fraction 0.7]
                         [--sample-seconds 60] [--probe-seconds 10] [--writers 1]
                         [--vacuum-seconds S] [--out bench/results/soak.json]
                         [--svg docs/soak.svg]

Per backend (and per long-transaction variant), one source site and two sink sites run as
real ``lr server`` processes (set up as in ``bench/replicate.py``: plaintext gRPC on
loopback, token auth, the product's replication defaults, no retention limit). Each site
has its own database: a SQLite file, or a throwaway PostgreSQL database on the server of
``LR_BENCH_PG_URL`` (its own database, so that a transaction held on the source pins no
sink's vacuum horizon). Each sink has a subscriber in a process of its own
(``RoutingQueueSubscriber``) whose listener inserts every entry (position and time
stamp) into an application table ``soak_applied`` of the sink's database, in the delivery
transaction. This process is the application at the source: a paced transmitter (1 KiB
payloads to both sinks, ``--entries-per-txn`` entries per transaction, ``--writers``
threads) and the observer.

Rate: ``--rate`` entries/s, or ``--rate-fraction`` (0.7) of the measured maximum: a
flat-out burst of ``--probe-seconds`` before the soak (the same transmitter, no pacing),
its entries divided by the time until both sinks' listeners applied the last of them.

Every ``--sample-seconds`` (60) the run records:

* entries/s transmitted (by the time their COMMIT returned) and applied per destination
  (by the listener's time stamp);
* delivery latency p50/p99/max of the entries committed in the period: the listener's time
  stamp (taken in the delivery transaction, just before it commits) minus the time the
  source's COMMIT returned (both clocks are this machine's); percentiles from log buckets
  1 % wide, so memory stays flat however long the run;
* every product table's size (``lrq_*``; PostgreSQL: ``pg_total_relation_size``,
  ``n_live_tup``, ``n_dead_tup`` from ``pg_stat_user_tables``; SQLite: pages per table and
  its indexes from ``dbstat``, plus each file's size, its WAL's size and ``freelist_count``).
  The send queue is ``lrq_send_entries``, ``lrq_send_commits``, ``lrq_send_positions``,
  ``lrq_send_blocks``, ``lrq_send_ticks`` (SQLite: ``lrq_send_log_entries``) and the
  snapshot entries ``lrq_send_snapsync``; the receive queue is ``lrq_recv_entries`` of both
  sinks;
* the resident size (``VmRSS`` of ``/proc/<pid>/status``) of each ``lr server``, of this
  process (transmitter and observer) and of each subscriber process.

``--long-transaction``: a session on the source database stays idle in transaction for
the whole soak. PostgreSQL: it takes a transaction id (``pg_current_xact_id()``), which
holds the source database's xmin horizon: VACUUM removes no row version of the send queue
deleted after it. Every snapshot taken while it runs, in any database of the server, also
has its xmin at or below that xid, so the sinks' receive queues (their own databases on
the same server) are held back too whenever one of their sessions holds a snapshot while
VACUUM runs. The product sets no ``idle_in_transaction_session_timeout``;
the session's own value and whether it was still idle in transaction at the end are
recorded. SQLite: a read transaction (a WAL snapshot) on the source file, which stops
checkpoints at that snapshot: the source's WAL file grows (the sinks' files are not
affected). ``--long-transaction both`` runs each backend without and with it.

Vacuum: the run needs the server's autovacuum. Where it is off (``autovacuum = off``),
``--vacuum-seconds`` (by default then 60, autovacuum's default naptime) runs a plain
``VACUUM`` of every site database that often, standing in for it, the first after half
that time (so that samples do not all fall right after a VACUUM); 0 leaves it out.

Targets (reported, never asserted), for runs of 10 minutes or more:

* throughput: the entries applied per second per destination in the last 5 minutes
  >= 0.95x those of minutes 2 to 6;
* latency: p99 of the last 5 minutes <= 1.2x the p99 of minutes 2 to 6;
* flat: over the second half of the run, the least-squares line through the samples of a
  series (send queue bytes, receive queue bytes, dead tuples of each, the source's WAL on
  SQLite, each process's RSS) rises over that half by at most 10 % of the half's mean plus
  a floor for near-empty series (1 MiB of bytes, 1,000 tuples, 4 MiB of RSS). The slope is
  reported per minute, absolute and relative to the mean; a falling series is flat. At
  least three samples in the half are needed.

Shorter runs compare halves instead: the first half without its first sample (warm-up)
against the second half; the output says so.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import multiprocessing
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Integer,
    MetaData,
    Table,
    insert,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from bench.common import (
    DEFAULT_PG_URL,
    Panel,
    Series,
    ServerCpu,
    least_squares_slope,
    loadavg,
    machine_facts,
    panels_svg,
    pg_facts,
    print_table,
    process_rss,
    write_json,
)
from bench.cpu_profile import process_cpu
from bench.replicate import (
    CLIENT,
    PAYLOAD_BYTES,
    Cluster,
    Databases,
    Source,
    code_state,
    idle_transaction,
    paced_load,
    source_site,
    start_source,
)
from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client import create_engine as lr_create_engine
from lr_client.store import SQLAlchemyQueueStore, create_app_tables, open_store
from lr_client.store.recv.rotation import MAX_SLOTS
from lr_client.store.schema.tables import (
    RECV_PARTITION_PREFIX,
    SEQUENCER_TABLES,
    SNAPSYNC_PARTITION_PREFIX,
    slot_parent,
)

ROOT = Path(__file__).resolve().parent.parent
SINKS = 2
SOURCE_ID = "src-soak"
CHUNK_SECONDS = 5.0  # the transmitter's span per paced_load call (one schedule throughout)
COLLECT_SECONDS = 1.0  # how often the observer matches applied entries with commits
SUBSCRIBER_POLL = 0.05
PROBE_RATE = 20000.0  # "flat out": far above what one transmitter reaches here
READ_BATCH = 20000

TARGET_THROUGHPUT = 0.95
TARGET_P99 = 1.2
FLAT_FRACTION = 0.10
FLOORS = {"bytes": 1 << 20, "tuples": 1000, "rss": 4 << 20}
FULL_WINDOWS_SECONDS = 600.0  # shorter runs compare halves
EARLY_WINDOW = (60.0, 360.0)  # minutes 2 to 6
LATE_SECONDS = 300.0

SEND_TABLES = {
    "postgresql": (*SEQUENCER_TABLES, "lrq_send_snapsync"),
    "sqlite": ("lrq_send_log_entries", "lrq_send_snapsync"),
}
#: The receive queues: SQLite's table, PostgreSQL's partitions (its parent holds no rows).
RECV_TABLES = ("lrq_recv_entries", *(f"{RECV_PARTITION_PREFIX}{n}" for n in range(MAX_SLOTS)))

# -- the sink application ---------------------------------------------------------------

applied_meta = MetaData()
APPLIED = Table(
    "soak_applied",
    applied_meta,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("applied_at", Double, nullable=False),
)


class ApplyListener(RoutingQueueListener):
    """Writes every log entry's position and the time into ``soak_applied``."""

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        now = time.time()
        session.execute(
            insert(APPLIED), [{"position": m.source_position, "applied_at": now} for m in messages]
        )
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def create_applied_table(store: SQLAlchemyQueueStore) -> None:
    """Create ``soak_applied`` at a sink (whose server may be writing)."""
    create_app_tables(store.engine, applied_meta)


def run_subscriber(url: str, stop: MpEvent, poll_interval: float = SUBSCRIBER_POLL) -> None:
    """A sink application's process: deliver until ``stop`` is set."""
    store = open_store(url)
    subscriber = RoutingQueueSubscriber(store, CLIENT, ApplyListener(), poll_interval=poll_interval)
    thread_stop = threading.Event()

    def relay() -> None:  # the subscriber waits on a threading.Event
        stop.wait()
        thread_stop.set()

    threading.Thread(target=relay, daemon=True).start()
    try:
        subscriber.run(thread_stop)
    finally:
        store.close()


def last_applied(store: SQLAlchemyQueueStore) -> tuple[int, float]:
    """(position, time stamp) of the newest row of a sink's ``soak_applied``; (0, 0) if none."""
    with store.read() as conn:
        row = conn.execute(
            select(APPLIED.c.position, APPLIED.c.applied_at).order_by(APPLIED.c.id.desc()).limit(1)
        ).first()
    return (int(row[0]), float(row[1])) if row else (0, 0.0)


def wait_applied(stores: Sequence[SQLAlchemyQueueStore], position: int, timeout: float) -> float:
    """Poll until every sink's listener applied ``position``; the latest of their time stamps."""
    deadline = time.monotonic() + timeout
    while True:
        last = [last_applied(s) for s in stores]
        if all(p >= position for p, _ in last):
            return max(t for _, t in last)
        if time.monotonic() > deadline:
            raise RuntimeError(f"position {position} not applied within {timeout:g} s: {last}")
        time.sleep(0.1)


# -- latency histogram ------------------------------------------------------------------


class Histogram:
    """Latencies (ms) in log-spaced buckets 1 % wide: quantiles within 1 %, bounded memory."""

    RATIO = 1.01
    FLOOR_MS = 0.01

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.max = 0.0

    def add(self, ms: float) -> None:
        b = int(math.log(max(ms, self.FLOOR_MS) / self.FLOOR_MS, self.RATIO))
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1
        self.max = max(self.max, ms)

    def merge(self, other: Histogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.n += other.n
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return min(self.max, self.FLOOR_MS * self.RATIO ** (b + 1))
        return self.max


# -- measuring a site --------------------------------------------------------------------


def table_stats(store: SQLAlchemyQueueStore) -> dict[str, dict[str, int | None]]:
    """Bytes (with indexes), live and dead tuples of every ``lrq_*`` and the app's table."""
    out: dict[str, dict[str, int | None]] = {}
    with store.read() as conn:
        if store.dialect == "postgresql":
            rows = conn.execute(
                text(
                    "SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup "
                    "FROM pg_stat_user_tables WHERE schemaname = current_schema() "
                    "AND (relname LIKE 'lrq\\_%' OR relname = 'soak_applied')"
                )
            ).all()
            for name, size, live, dead in rows:
                # The snapshot queue's partitions count as the queue (revision 0007).
                # So do the send queue's slots (revision 0006).
                key = "lrq_send_snapsync" if name.startswith(SNAPSYNC_PARTITION_PREFIX) else name
                key = slot_parent(key) or key
                got = out.setdefault(str(key), {"bytes": 0, "live": 0, "dead": 0})
                for k, v in (("bytes", size), ("live", live), ("dead", dead)):
                    got[k] = int(got[k] or 0) + int(v)
        else:
            rows = conn.execute(
                text(
                    "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d "
                    "JOIN sqlite_master m ON m.name = d.name "
                    "WHERE m.tbl_name LIKE 'lrq\\_%' ESCAPE '\\' OR m.tbl_name = 'soak_applied' "
                    "GROUP BY m.tbl_name"
                )
            ).all()
            for name, size in rows:
                out[str(name)] = {"bytes": int(size or 0), "live": None, "dead": None}
    return out


def sqlite_files(store: SQLAlchemyQueueStore) -> dict[str, int]:
    path = Path(str(store.engine.url.database))
    wal = path.with_name(path.name + "-wal")
    with store.read() as conn:
        freelist = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
        page = int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
    return {
        "db_bytes": path.stat().st_size if path.exists() else 0,
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        "freelist_pages": freelist,
        "page_size": page,
    }


def _sum(tables: dict[str, dict[str, int | None]], names: Sequence[str], key: str) -> int | None:
    values = [tables[n][key] for n in names if n in tables]
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


# -- one soak run ------------------------------------------------------------------------


@dataclass
class Period:
    transmitted: int = 0
    applied: dict[str, int] = field(default_factory=dict)
    latency: Histogram = field(default_factory=Histogram)
    snapshot: dict[str, Any] = field(default_factory=dict)


class Soak:
    """The transmitter and the observer of one run (one backend, one variant)."""

    def __init__(
        self,
        src: Source,
        cluster: Cluster,
        pids: dict[str, int],
        args: argparse.Namespace,
        rate: float,
        site_urls: dict[str, str],
        console: Console,
        long_transaction: bool,
    ) -> None:
        self.src, self.cluster, self.pids, self.args = src, cluster, pids, args
        self.long_transaction = long_transaction
        self.rate = rate
        self.site_urls = site_urls
        self.console = console
        self.backend = cluster.dbs.backend
        self.duration = args.minutes * 60.0
        self.period = args.sample_seconds
        self.n_periods = max(1, math.ceil(self.duration / self.period - 1e-9))
        self.periods = [Period() for _ in range(self.n_periods)]
        self.commits: queue.Queue[list[tuple[int, float]]] = queue.Queue()
        self.pending: dict[int, list[float]] = {}  # position -> [commit time, sinks to go]
        self.max_position = 0
        self.watermarks = {s: 0 for s in cluster.sink_ids}
        self.transmit_errors = 0
        self.cut_short = False
        self.failure: BaseException | None = None
        self.held: dict[str, Any] = {}
        self.vacuums: list[float] = []
        self.t0 = 0.0
        # PostgreSQL: the backends of each site's database (a backend that ended keeps
        # the CPU last seen for it, so the total never goes back).
        self.backend_cpu = (
            [ServerCpu(url) for url in site_urls.values()] if self.backend == "postgresql" else []
        )
        self.backend_seen: dict[int, float] = {}
        self.cpu_at_start: float | None = None

    # -- time ----------------------------------------------------------------------------
    def index(self, wall: float) -> int:
        return min(self.n_periods - 1, max(0, int((wall - self.t0) / self.period)))

    def bounds(self, i: int) -> tuple[float, float]:
        return i * self.period, min((i + 1) * self.period, self.duration)

    # -- the transmitter -----------------------------------------------------------------
    def transmit(self, payloads: Sequence[bytes]) -> None:
        start = time.perf_counter()
        end = start + self.duration
        try:
            for k in itertools.count():
                span = start + k * CHUNK_SECONDS
                if span >= end:
                    return
                load = paced_load(
                    self.src.store,
                    self.src.client,
                    self.src.destinations,
                    self.rate,
                    min(CHUNK_SECONDS, end - span),
                    payloads,
                    self.args.entries_per_txn,
                    self.args.writers,
                    start=span,
                )
                self.commits.put(load.commits)
                self.transmit_errors += load.errors
                self.cut_short |= load.cut_short
        except BaseException as exc:  # reported by the run
            self.failure = exc

    # -- the observer --------------------------------------------------------------------
    def collect(self) -> None:
        """Match applied entries (both sinks) with the commits published so far."""
        while True:
            try:
                batch = self.commits.get_nowait()
            except queue.Empty:
                break
            for pos, at in batch:
                self.periods[self.index(at)].transmitted += 1
                self.pending[pos] = [at, float(SINKS)]
                self.max_position = max(self.max_position, pos)
        for sink in self.cluster.sink_ids:
            store = self.cluster.stores[sink]
            while True:
                with store.read() as conn:
                    rows = conn.execute(
                        select(APPLIED.c.id, APPLIED.c.position, APPLIED.c.applied_at)
                        .where(
                            APPLIED.c.id > self.watermarks[sink],
                            APPLIED.c.position <= self.max_position,
                        )
                        .order_by(APPLIED.c.id)
                        .limit(READ_BATCH)
                    ).all()
                for row_id, pos, applied_at in rows:
                    self.watermarks[sink] = int(row_id)
                    entry = self.pending.get(int(pos))
                    if entry is None:  # the probe's and the readiness entries
                        continue
                    committed = entry[0]
                    self.periods[self.index(committed)].latency.add(
                        (float(applied_at) - committed) * 1000.0
                    )
                    applied = self.periods[self.index(float(applied_at))].applied
                    applied[sink] = applied.get(sink, 0) + 1
                    entry[1] -= 1
                    if entry[1] <= 0:
                        del self.pending[int(pos)]
                if len(rows) < READ_BATCH:
                    break

    def snapshot(self) -> dict[str, Any]:
        """Sizes, dead tuples, RSS and the held session, now."""
        sites = {SOURCE_ID: self.src.store, **self.cluster.stores}
        tables = {site: table_stats(store) for site, store in sites.items()}
        snap: dict[str, Any] = {
            "at_s": round(time.time() - self.t0, 1),
            "tables": tables,
            "rss_bytes": {name: process_rss(pid) for name, pid in self.pids.items()},
            "cpu_seconds": self.cpu_seconds(),
            "loadavg": loadavg(),
        }
        if self.backend == "sqlite":
            snap["files"] = {site: sqlite_files(store) for site, store in sites.items()}
        elif "pid" in self.held:
            with self.src.store.read() as conn:
                row = conn.execute(
                    text("SELECT state, age(backend_xid) FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": self.held["pid"]},
                ).first()
            snap["long_transaction"] = {
                "state": str(row[0]) if row else None,
                "xid_age": int(row[1]) if row and row[1] is not None else None,
            }
        return snap

    def close(self) -> None:
        for cpu in self.backend_cpu:
            cpu.close()

    def cpu_seconds(self) -> float | None:
        """CPU the replication has used so far: its processes (servers, subscribers, this
        transmitter) and, on PostgreSQL, the backends of the sites' databases."""
        used = [process_cpu(pid) for pid in self.pids.values()]
        if any(v is None for v in used):
            return None
        total = sum(v or 0.0 for v in used)
        for cpu in self.backend_cpu:
            for pid, seconds in cpu.sample().items():
                self.backend_seen[pid] = max(seconds, self.backend_seen.get(pid, 0.0))
        return total + sum(self.backend_seen.values())

    def vacuum(self) -> None:
        started = time.perf_counter()
        for url in self.site_urls.values():
            engine = lr_create_engine(url, isolation_level="AUTOCOMMIT")
            try:
                with engine.connect() as conn:
                    conn.exec_driver_sql("VACUUM")
            finally:
                engine.dispose()
        self.vacuums.append(round(time.perf_counter() - started, 2))

    def run(self, payloads: Sequence[bytes]) -> None:
        self.cpu_at_start = self.cpu_seconds()
        self.t0 = time.time()
        started = time.monotonic()
        sender = threading.Thread(target=self.transmit, args=(payloads,), name="transmitter")
        sender.start()
        vacuum_every = self.args.vacuum_seconds
        # Half an interval out of step: samples then see dead tuples mid-cycle, not
        # right after a VACUUM (both run every 60 s by default).
        next_vacuum = started + vacuum_every / 2 if vacuum_every else math.inf
        for i in range(self.n_periods):
            boundary = started + self.bounds(i)[1]
            while (now := time.monotonic()) < boundary and self.failure is None:
                time.sleep(min(COLLECT_SECONDS, boundary - now))
                self.collect()
                if time.monotonic() >= next_vacuum and self.backend == "postgresql":
                    self.vacuum()
                    next_vacuum += vacuum_every
            if self.failure is not None:
                break
            self.periods[i].snapshot = self.snapshot()
            self.console.log(f"{self.label}: {self.describe(i)}")
        sender.join()
        if self.failure is not None:
            raise RuntimeError(f"the transmitter failed: {self.failure!r}") from self.failure
        self.collect()
        if self.max_position:
            wait_applied(
                list(self.cluster.stores.values()), self.max_position, max(60.0, 3 * self.period)
            )
        self.collect()

    @property
    def label(self) -> str:
        return f"{self.backend}{' + long transaction' if self.long_transaction else ''}"

    def describe(self, i: int) -> str:
        s = self.sample(i)
        sent = sum(p.transmitted for p in self.periods)  # as far as published (5 s spans)
        rss = max((v for v in s["rss_bytes"].values() if v), default=None)
        return (
            f"minute {s['minute']:.2f}: {sent:,} sent, send queue "
            f"{_mb(s['send_queue_bytes'])} MB, receive queues {_mb(s['recv_queue_bytes'])} MB, "
            f"largest RSS {_mb(rss)} MB"
        )

    # -- results -------------------------------------------------------------------------
    def sample(self, i: int) -> dict[str, Any]:
        p = self.periods[i]
        lo, hi = self.bounds(i)
        length = max(hi - lo, 1e-9)
        snap = p.snapshot
        tables = snap.get("tables", {})
        source = tables.get(SOURCE_ID, {})
        send = SEND_TABLES[self.backend]
        sinks = [tables.get(s, {}) for s in self.cluster.sink_ids]

        def over_sinks(key: str) -> int | None:
            values = [_sum(t, RECV_TABLES, key) for t in sinks]
            return None if any(v is None for v in values) else sum(v or 0 for v in values)

        applied = {s: p.applied.get(s, 0) for s in self.cluster.sink_ids}
        cpu_now = snap.get("cpu_seconds")
        cpu_before = self.periods[i - 1].snapshot.get("cpu_seconds") if i else self.cpu_at_start
        cpu_used = cpu_now - cpu_before if cpu_now is not None and cpu_before is not None else None
        out = {
            "index": i,
            "start_s": lo,
            "end_s": hi,
            "minute": hi / 60.0,
            "transmitted": p.transmitted,
            "transmitted_per_s": p.transmitted / length,
            "cpu_used_s": cpu_used,
            "cpu_ms_per_entry": (
                1000.0 * cpu_used / p.transmitted
                if cpu_used is not None and p.transmitted
                else None
            ),
            "applied": applied,
            "applied_per_s": {s: n / length for s, n in applied.items()},
            "latency_ms": {
                "entries": p.latency.n,
                "p50": p.latency.quantile(0.50),
                "p99": p.latency.quantile(0.99),
                "max": p.latency.max if p.latency.n else None,
            },
            "send_queue_bytes": _sum(source, send, "bytes"),
            "send_live_tuples": _sum(source, send, "live"),
            "send_dead_tuples": _sum(source, send, "dead"),
            "recv_queue_bytes": over_sinks("bytes"),
            "recv_live_tuples": over_sinks("live"),
            "recv_dead_tuples": over_sinks("dead"),
            **snap,
        }
        if self.backend == "sqlite" and "files" in snap:
            f = snap["files"][SOURCE_ID]
            out["source_file_bytes"] = f["db_bytes"] + f["wal_bytes"]
            out["source_wal_bytes"] = f["wal_bytes"]
        return out

    def window_histogram(self, indexes: Sequence[int]) -> Histogram:
        h = Histogram()
        for i in indexes:
            h.merge(self.periods[i].latency)
        return h


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):,.2f}"


# -- targets ---------------------------------------------------------------------------


def windows(duration: float, samples: Sequence[dict[str, Any]]) -> tuple[list[int], list[int], str]:
    """The sample indexes of the early and the late window, and how they were chosen."""
    if duration >= FULL_WINDOWS_SECONDS:
        early = [
            s["index"]
            for s in samples
            if s["start_s"] >= EARLY_WINDOW[0] - 1e-9 and s["end_s"] <= EARLY_WINDOW[1] + 1e-9
        ]
        late = [s["index"] for s in samples if s["start_s"] >= duration - LATE_SECONDS - 1e-9]
        if early and late:
            return early, late, "minutes 2-6 against the last 5 minutes"
    half = duration / 2
    early = [s["index"] for s in samples if s["end_s"] <= half + 1e-9]
    if len(early) > 1:
        early = early[1:]
    late = [s["index"] for s in samples if s["start_s"] >= half - 1e-9]
    return (
        early,
        late,
        f"run shorter than {FULL_WINDOWS_SECONDS / 60:g} minutes: the first half (without "
        "its first sample) against the second half",
    )


def flatness(
    samples: Sequence[dict[str, Any]], duration: float, key: str, floor: float
) -> dict[str, Any]:
    """Least-squares slope of a series over the second half of the run, and the verdict."""
    half = [s for s in samples if s["start_s"] >= duration / 2 - 1e-9]
    points = [(s["minute"], float(v)) for s in half if (v := _get(s, key)) is not None]
    result: dict[str, Any] = {"samples": len(points), "slope_per_min": None, "flat": None}
    if len(points) < 3:
        return result
    slope = least_squares_slope(points)
    if slope is None:
        return result
    mean = sum(v for _, v in points) / len(points)
    span = points[-1][0] - points[0][0]
    rise = slope * span
    result.update(
        slope_per_min=slope,
        mean=mean,
        relative_slope_per_min=slope / mean if mean else None,
        rise_over_half=rise,
        allowed_rise=FLAT_FRACTION * abs(mean) + floor,
        flat=rise <= FLAT_FRACTION * abs(mean) + floor,
    )
    return result


def _get(sample: dict[str, Any], key: str) -> Any:
    value: Any = sample
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def targets(soak: Soak, samples: list[dict[str, Any]]) -> dict[str, Any]:
    early, late, how = windows(soak.duration, samples)

    def applied_rate(indexes: Sequence[int]) -> float | None:
        seconds = sum(samples[i]["end_s"] - samples[i]["start_s"] for i in indexes)
        per_sink = [sum(samples[i]["applied"][s] for i in indexes) for s in soak.cluster.sink_ids]
        return sum(per_sink) / len(per_sink) / seconds if seconds > 0 else None

    def cpu_per_entry(indexes: Sequence[int]) -> float | None:
        used = [samples[i]["cpu_used_s"] for i in indexes]
        sent = sum(samples[i]["transmitted"] for i in indexes)
        if not sent or any(u is None for u in used):
            return None
        return 1000.0 * sum(u or 0.0 for u in used) / sent

    t_early, t_late = applied_rate(early), applied_rate(late)
    c_early, c_late = cpu_per_entry(early), cpu_per_entry(late)
    cost = c_early / c_late if c_early and c_late else None
    p_early = soak.window_histogram(early).quantile(0.99)
    p_late = soak.window_histogram(late).quantile(0.99)
    thr = t_late / t_early if t_early and t_late is not None else None
    p99 = p_late / p_early if p_early and p_late is not None else None
    series = {
        "send_queue_bytes": FLOORS["bytes"],
        "recv_queue_bytes": FLOORS["bytes"],
    }
    if soak.backend == "postgresql":
        series |= {"send_dead_tuples": FLOORS["tuples"], "recv_dead_tuples": FLOORS["tuples"]}
    else:
        series |= {"source_file_bytes": FLOORS["bytes"]}
    for name in soak.pids:
        series[f"rss_bytes.{name}"] = FLOORS["rss"]
    flat = {key: flatness(samples, soak.duration, key, floor) for key, floor in series.items()}
    return {
        "windows": how,
        "early_samples": early,
        "late_samples": late,
        "throughput": {
            "early": t_early,
            "late": t_late,
            "ratio": thr,
            "met": None if thr is None else thr >= TARGET_THROUGHPUT,
        },
        # The same throughput per CPU second: what the replication costs per entry does
        # not depend on what else runs on the machine, so a decay shows here even when
        # the machine's load moves entries/s up and down.
        "cpu_efficiency": {
            "early_ms_per_entry": c_early,
            "late_ms_per_entry": c_late,
            "ratio": cost,
            "met": None if cost is None else cost >= TARGET_THROUGHPUT,
        },
        "p99": {
            "early_ms": p_early,
            "late_ms": p_late,
            "ratio": p99,
            "met": None if p99 is None else p99 <= TARGET_P99,
        },
        "flat": flat,
    }


# -- a run -------------------------------------------------------------------------------


def server_settings(store: SQLAlchemyQueueStore) -> dict[str, str]:
    names = ["autovacuum", "autovacuum_naptime", "idle_in_transaction_session_timeout"]
    with store.read() as conn:
        return pg_facts(conn, names)


def hold_facts(conn: Connection | None, dialect: str) -> dict[str, Any]:
    if conn is None:
        return {}
    if dialect == "sqlite":
        return {"kind": "read transaction (WAL snapshot) on the source file"}
    return {
        "kind": "idle in transaction holding an xid (pg_current_xact_id())",
        "pid": int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()),
        "idle_in_transaction_session_timeout": str(
            conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one()
        ),
    }


def run_one(
    backend: str, long_tx: bool, args: argparse.Namespace, pg_url: str, console: Console
) -> dict[str, Any]:
    payloads = [os.urandom(PAYLOAD_BYTES) for _ in range(256)]
    label = f"{backend}{' + long transaction' if long_tx else ''}"
    ctx = multiprocessing.get_context("spawn")
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lrbench-soak-")))
        dbs = Databases(backend, stack, workdir, pg_url, own_databases=True)
        facts = dbs.facts()
        console.log(f"{label}: starting {SINKS} sinks")
        cluster = Cluster(dbs, workdir, [SOURCE_ID], SINKS)
        stack.callback(cluster.close)
        cluster.start()
        for sink in cluster.sink_ids:
            create_applied_table(cluster.stores[sink])
        stop = ctx.Event()
        subs = {
            s: ctx.Process(target=run_subscriber, args=(cluster.urls[s], stop), daemon=True)
            for s in cluster.sink_ids
        }
        for proc in subs.values():
            proc.start()

        def stop_subscribers() -> None:
            stop.set()
            for proc in subs.values():
                proc.join(timeout=15)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=5)

        stack.callback(stop_subscribers)
        with source_site(cluster, SOURCE_ID, SINKS, stalled=False) as src:
            start_source(cluster, src, paced=False, provider=False)
            if backend == "postgresql":
                facts |= server_settings(src.store)
            stores = list(cluster.stores.values())
            with src.store.engine.begin() as conn:
                ref = src.client.transmit_log_entry_message(conn, payloads[0], src.destinations)
            (first,) = src.client.positions_of([ref], timeout=60)
            assert first is not None, "the first entry got no position"
            wait_applied(stores, first, timeout=120)
            probe: dict[str, Any] = {}
            rate = args.rate
            if rate is None:
                console.log(f"{label}: probing the maximum for {args.probe_seconds:g} s")
                started = time.time()
                load = paced_load(
                    src.store,
                    src.client,
                    src.destinations,
                    PROBE_RATE,
                    args.probe_seconds / 3,  # paced_load stops at 3x: the probe's length
                    payloads,
                    args.entries_per_txn,
                    args.writers,
                )
                last = max(p for p, _ in load.commits)
                done = wait_applied(stores, last, timeout=max(120.0, 10 * args.probe_seconds))
                probe = {
                    "seconds": args.probe_seconds,
                    "entries": len(load.commits),
                    "transmit_rate": load.achieved_rate,
                    "end_to_end_rate": len(load.commits) / (done - started),
                }
                rate = args.rate_fraction * probe["end_to_end_rate"]
                console.log(
                    f"{label}: maximum {probe['end_to_end_rate']:,.0f} entries/s end to end "
                    f"(transmitter {load.achieved_rate:,.0f}/s); soaking at {rate:,.0f}/s"
                )
            pids: dict[str, int] = {}
            for name, server in [(SOURCE_ID, src.server), *cluster.servers.items()]:
                if server is not None and server.proc is not None:
                    pids[f"lr server {name}"] = server.proc.pid
            pids["bench (transmitter)"] = os.getpid()
            for sink, sub in subs.items():
                if sub.pid is not None:
                    pids[f"subscriber {sink}"] = sub.pid
            urls = {SOURCE_ID: src.url, **cluster.urls}
            soak = Soak(src, cluster, pids, args, rate, urls, console, long_tx)
            stack.callback(soak.close)
            with idle_transaction(src.store, long_tx) as held:
                soak.held = hold_facts(held, backend)
                console.log(f"{label}: soaking {args.minutes:g} min at {rate:,.0f} entries/s")
                soak.run(payloads)
                if soak.held.get("pid") is not None:
                    last_snap = soak.periods[-1].snapshot.get("long_transaction", {})
                    soak.held["still_idle_in_transaction_at_end"] = (
                        last_snap.get("state") == "idle in transaction"
                    )
    return run_record(soak, facts, probe, rate)


def run_record(
    soak: Soak, facts: dict[str, Any], probe: dict[str, Any], rate: float
) -> dict[str, Any]:
    """One run's JSON, from what its soak observed: its samples, totals and targets."""
    backend, long_tx, args, cluster = soak.backend, soak.long_transaction, soak.args, soak.cluster
    samples = [soak.sample(i) for i in range(soak.n_periods)]
    transmitted = sum(s["transmitted"] for s in samples)
    return {
        "backend": backend,
        "long_transaction": long_tx,
        "label": soak.label,
        "facts": facts,
        "probe": probe,
        "rate": rate,
        "vacuum_seconds": args.vacuum_seconds if backend == "postgresql" else None,
        "vacuum_durations_s": soak.vacuums,
        "held_session": soak.held,
        "totals": {
            "transmitted": transmitted,
            "applied": {s: sum(x["applied"][s] for x in samples) for s in cluster.sink_ids},
            "undelivered": len(soak.pending),
            "transmit_errors": soak.transmit_errors,
            "load_cut_short": soak.cut_short,
        },
        "samples": samples,
        "targets": targets(soak, samples),
    }


# -- report ------------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("[green]met[/]" if value else "[red]missed[/]")


def report(console: Console, run: dict[str, Any]) -> None:
    rows = []
    for s in run["samples"]:
        rss = s.get("rss_bytes", {})
        servers = [v for k, v in rss.items() if k.startswith("lr server") and v]
        subs = [v for k, v in rss.items() if k.startswith("subscriber") and v]
        lt = s.get("long_transaction") or {}
        pin = (
            _mb(s.get("source_wal_bytes"))
            if run["backend"] == "sqlite"
            else _num(lt.get("xid_age"))
        )
        rows.append(
            [
                f"{s['minute']:.2f}",
                _num(s["transmitted_per_s"]),
                _num(s.get("cpu_ms_per_entry"), ".3f"),
                _num((s.get("loadavg") or [None])[0], ".1f"),
                _num(min(s["applied_per_s"].values(), default=None)),
                _num(s["latency_ms"]["p50"], ",.1f"),
                _num(s["latency_ms"]["p99"], ",.1f"),
                _mb(s["send_queue_bytes"]),
                _num(s["send_dead_tuples"]),
                _mb(s["recv_queue_bytes"]),
                _num(s["recv_dead_tuples"]),
                _mb(max(servers, default=None)),
                _mb(rss.get("bench (transmitter)")),
                _mb(max(subs, default=None)),
                pin,
            ]
        )
    print_table(
        console,
        f"Soak, {run['label']}: {run['rate']:,.0f} entries/s offered to {SINKS} destinations",
        [
            "minute",
            "sent/s",
            "CPU ms/entry",
            "load",
            "applied/s",
            "p50 ms",
            "p99 ms",
            "send MB",
            "send dead",
            "recv MB",
            "recv dead",
            "server RSS",
            "bench RSS",
            "sub RSS",
            "WAL MB" if run["backend"] == "sqlite" else "held xid age",
        ],
        rows,
        caption="CPU ms/entry: the replication's processes (and PostgreSQL backends) per entry "
        "sent; load: 1-minute load average; applied/s: the slower destination; "
        "RSS in MB (server, subscriber: the largest); "
        "send/recv: queue tables with indexes; dead: n_dead_tup (PostgreSQL)",
    )
    t = run["targets"]
    rows = [
        [
            f"throughput late >= {TARGET_THROUGHPUT}x early",
            _num(t["throughput"]["early"]),
            _num(t["throughput"]["late"]),
            _num(t["throughput"]["ratio"], ".2f") + "x",
            _met(t["throughput"]["met"]),
        ],
        [
            f"entries per CPU-second late >= {TARGET_THROUGHPUT}x early (CPU ms/entry)",
            _num(t["cpu_efficiency"]["early_ms_per_entry"], ".3f"),
            _num(t["cpu_efficiency"]["late_ms_per_entry"], ".3f"),
            _num(t["cpu_efficiency"]["ratio"], ".2f") + "x",
            _met(t["cpu_efficiency"]["met"]),
        ],
        [
            f"p99 late <= {TARGET_P99}x early",
            _num(t["p99"]["early_ms"], ",.1f"),
            _num(t["p99"]["late_ms"], ",.1f"),
            _num(t["p99"]["ratio"], ".2f") + "x",
            _met(t["p99"]["met"]),
        ],
    ]
    for key, f in t["flat"].items():
        rel = f.get("relative_slope_per_min")
        mean, slope = f.get("mean"), f["slope_per_min"]
        if "bytes" in key:  # shown in MB
            mean = None if mean is None else mean / (1 << 20)
            slope = None if slope is None else slope / (1 << 20)
            key += " (MB)"
        rows.append(
            [
                f"flat: {key}",
                _num(mean, ",.2f"),
                _num(slope, ",.3f") + "/min",
                "-" if rel is None else f"{100 * rel:+.2f} %/min",
                _met(f["flat"]),
            ]
        )
    print_table(
        console,
        f"Targets, {run['label']}",
        ["target", "early / mean", "late / slope", "ratio / relative", "verdict"],
        rows,
        caption=f"windows: {t['windows']}; flat: the fitted rise over the second half <= "
        f"{FLAT_FRACTION:.0%} of its mean + a floor",
    )


_COLOURS = {
    ("sqlite", False): "#1f77b4",
    ("sqlite", True): "#17becf",
    ("postgresql", False): "#d62728",
    ("postgresql", True): "#ff7f0e",
}


def soak_svg(runs: Sequence[dict[str, Any]], title: str) -> str:
    """Curves over time per run: entries/s, p99, queue size, dead tuples, RSS (and the
    source's WAL on SQLite)."""

    def pts(run: dict[str, Any], fn: Any) -> list[tuple[float, float]]:
        out = []
        for s in run["samples"]:
            v = fn(s)
            if v is not None:
                out.append((s["minute"], float(v)))
        return out

    def colour(run: dict[str, Any]) -> str:
        return _COLOURS.get((run["backend"], run["long_transaction"]), "#555")

    def mb(v: int | None) -> float | None:
        return None if v is None else v / (1 << 20)

    def rss(s: dict[str, Any]) -> float | None:
        values = [v for v in s.get("rss_bytes", {}).values() if v]
        return mb(max(values)) if values else None

    panels = [
        Panel(
            "entries/s applied (slower destination)",
            [
                Series(r["label"], colour(r), pts(r, lambda s: min(s["applied_per_s"].values())))
                for r in runs
            ],
        ),
        Panel(
            "p99 delivery latency, ms",
            [Series(r["label"], colour(r), pts(r, lambda s: s["latency_ms"]["p99"])) for r in runs],
        ),
        Panel(
            "queue tables, MB (send solid, receive dashed)",
            [
                Series(r["label"], colour(r), pts(r, lambda s: mb(s["send_queue_bytes"])))
                for r in runs
            ]
            + [
                Series(r["label"], colour(r), pts(r, lambda s: mb(s["recv_queue_bytes"])), True)
                for r in runs
            ],
        ),
        Panel(
            "dead tuples, PostgreSQL (send solid, receive dashed)",
            [
                Series(r["label"], colour(r), pts(r, lambda s: s["send_dead_tuples"]))
                for r in runs
                if r["backend"] == "postgresql"
            ]
            + [
                Series(r["label"], colour(r), pts(r, lambda s: s["recv_dead_tuples"]), True)
                for r in runs
                if r["backend"] == "postgresql"
            ],
        ),
        Panel(
            "largest RSS of the run's processes, MB",
            [Series(r["label"], colour(r), pts(r, rss)) for r in runs],
        ),
    ]
    sqlite = [r for r in runs if r["backend"] == "sqlite"]
    if sqlite:
        panels.append(
            Panel(
                "SQLite: the source's WAL file, MB",
                [
                    Series(r["label"], colour(r), pts(r, lambda s: mb(s.get("source_wal_bytes"))))
                    for r in sqlite
                ],
            )
        )
    return panels_svg(title, "minutes since the soak started", panels)


# -- entry point ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, required=True, help="length of each soak")
    p.add_argument(
        "--backend", choices=["sqlite", "postgresql", "both"], default="both", help="(both)"
    )
    p.add_argument(
        "--long-transaction",
        nargs="?",
        const="on",
        default="off",
        choices=["off", "on", "both"],
        help="hold a transaction open on the source for the whole soak; 'both': run each "
        "backend without and with it",
    )
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=float, default=None, help="offered entries/s (no probe)")
    rate.add_argument(
        "--rate-fraction", type=float, default=0.7, help="of the probed maximum (0.7)"
    )
    p.add_argument("--sample-seconds", type=float, default=60.0, help="sample period (60)")
    p.add_argument("--probe-seconds", type=float, default=10.0, help="maximum probe (10)")
    p.add_argument("--writers", type=int, default=1, help="transmitting threads (1)")
    p.add_argument("--entries-per-txn", type=int, default=1, help="(1)")
    p.add_argument(
        "--vacuum-seconds",
        type=float,
        default=None,
        help="PostgreSQL: VACUUM every site database this often (default: 60 when the "
        "server's autovacuum is off, else 0 = never)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    p.add_argument("--svg", type=Path, default=None, help="draw the curves to this file")
    args = p.parse_args(argv)
    if (
        args.minutes <= 0
        or args.sample_seconds <= 0
        or args.probe_seconds <= 0
        or (args.rate is not None and args.rate <= 0)
        or not 0 < args.rate_fraction <= 1
        or args.writers < 1
        or args.entries_per_txn < 1
        or (args.vacuum_seconds is not None and args.vacuum_seconds < 0)
    ):
        p.error(
            "--minutes, --sample-seconds, --probe-seconds and --rate must be > 0, "
            "--rate-fraction in (0, 1], --writers and --entries-per-txn >= 1, "
            "--vacuum-seconds >= 0"
        )
    return args


def autovacuum_on(pg_url: str) -> bool:
    engine = lr_create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(text("SHOW autovacuum")).scalar_one() == "on")
    finally:
        engine.dispose()


def soak_header(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON's settings, machine and targets, before any run."""
    result: dict[str, Any] = {
        "benchmark": "soak",
        "format": 1,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "minutes": args.minutes,
            "sample_seconds": args.sample_seconds,
            "rate": args.rate,
            "rate_fraction": None if args.rate is not None else args.rate_fraction,
            "probe_seconds": args.probe_seconds,
            "writers": args.writers,
            "entries_per_txn": args.entries_per_txn,
            "vacuum_seconds": args.vacuum_seconds,
            "payload_bytes": PAYLOAD_BYTES,
            "destinations": SINKS,
            "transport": "gRPC plaintext on loopback, token auth; one lr server process per site",
            "subscriber": "one process per sink, listener inserting into soak_applied",
        },
        "machine": machine_facts(),
        "code": code_state(),
        "targets": {
            "throughput_late_vs_early_at_least": TARGET_THROUGHPUT,
            "p99_late_vs_early_at_most": TARGET_P99,
            "flat_rise_fraction_of_mean": FLAT_FRACTION,
            "flat_floors": FLOORS,
        },
        "runs": [],
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    console = Console(width=170)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    variants = {"off": [False], "on": [True], "both": [False, True]}[args.long_transaction]
    if args.vacuum_seconds is None:
        auto = "postgresql" not in backends or autovacuum_on(pg_url)
        args.vacuum_seconds = 0.0 if auto else 60.0
        if not auto:
            console.log("the server's autovacuum is off: VACUUM every 60 s stands in for it")
    result = soak_header(args)
    started = time.perf_counter()
    for backend in backends:
        for long_tx in variants:
            run = run_one(backend, long_tx, args, pg_url, console)
            result["runs"].append(run)
            report(console, run)
            write_json(args.out, result)  # each run kept, should a later one fail
    result["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    write_json(args.out, result)
    if args.svg is not None:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        title = f"Soak: {SINKS} destinations, {args.minutes:g} min per run"
        args.svg.write_text(soak_svg(result["runs"], title))
        console.print(f"wrote {args.svg}")
    console.print(f"wrote {args.out} in {result['elapsed_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
