"""Snapshot job throughput: the PySpark job into the send queue against plain Spark writes.

    python bench/snapshot.py [--rows 1000000] [--backend sqlite|postgresql|both]
                             [--partitions 2] [--master local[2]] [--repeat 1]
                             [--deliver-rows N] [--deliver-row-bytes 1024] [--profile]
                             [--out bench/results/snapshot.json]
    python bench/snapshot.py --shared-rows 200000 [--backend ...] [--repeat 3]
                             [--shared-out bench/results/snapshot-shared.json]
    python bench/snapshot.py --sink-rows 100000 [--deliver-row-bytes 1024] [--backend ...]
                             [--repeat 3] [--cprofile] [--sink-batch N]
                             [--sink-out bench/results/snapshot-sink.json]

One DataFrame, ``spark.range(rows)`` plus a string column, so that each row
encodes (default JSON encoder) to about 200 bytes: ``{"body":"xxx...","id":123}``.
Every case writes all of it and is timed from the Spark action to the last
commit (for the job: to the end marker, READY). Cases:

* ``job``: :func:`spark_jobs.run_snapshot_job`, Arrow batches into the Python
  workers, PostgreSQL through binary ``COPY`` (SQLite through the store);
* ``job-rdd``: the same job forced onto Spark's Row path (as ``foreachPartition``);
* ``job-store``: PostgreSQL through the store's INSERTs instead of ``COPY``;
* ``plain-insert``: ``df.foreachPartition`` encoding each Row with the same encoder
  and inserting ``(payload)`` into a bare table with the same driver (psycopg
  ``executemany`` / sqlite3 ``executemany``), 20,000 rows per transaction:
  no queue logic, no idempotence;
* ``plain-copy``: the same with psycopg binary ``COPY`` (PostgreSQL);
* ``copy-no-spark``: no Spark at all: two processes write pre-encoded payloads of
  the same shape into the send queue through the job's COPY writer (PostgreSQL):
  the database's own rate for this table, the ceiling for the job;
* ``spark-jdbc``: Spark's own JDBC writer appending the DataFrame's columns
  (no Python, no encoding) to a bare table, when Debian's PostgreSQL JDBC
  driver is at ``/usr/share/java/postgresql.jar`` (``reWriteBatchedInserts``,
  ``batchsize=10000``).

Then, per backend, the delivery run (``--deliver-rows``, default ``--rows``, of
``--deliver-row-bytes``, default 1 KiB): the source and the sink run as ``lr server``
processes (gRPC on loopback, default settings) and a subscriber in this process waits
with a no-op listener while the job writes a snapshot for the sink; rows/s from the
snapshot READY (the job's return) to the listener's ``on_full_sync_end``, and between
the listener's first and last call; CPU per row of each stage (ship: the source server,
receive: the sink server, deliver: the subscriber's thread, database: PostgreSQL's
backends) and, with ``--profile`` and py-spy installed, each stage's top functions.

``--sink-rows N`` runs only the delivery stage (no Spark, no servers): a whole
snapshot of ``N`` rows of ``--deliver-row-bytes`` is written into the sink's receive
queue as the receiver writes it (its end marker last, so it is READY there), then a
subscriber with a no-op listener delivers it, polled in the benchmark's thread; rows/s
from its first poll to the listener's ``on_full_sync_end``, its CPU per row (and on
PostgreSQL its database backend's), and with ``--cprofile`` the functions with the most
time of their own. Target: 100,000 rows/s of 1 KiB on both backends. ``--sink-batch N``
delivers in batches of ``N`` entries (``snapshot_batch_size``, with ``batch_max_bytes``
raised to hold them) instead of the subscriber's defaults.

``--shared-rows N`` runs only the shared-snapshot measurement (no Spark): one
destination, then five, ask for a full sync of one client before it starts;
an in-process provider writes ``N`` rows of the same ~200 bytes once
(``SnapshotProviderRunner.poll_once``, timed from the call to READY), and
the rows and bytes of ``lrq_send_snapsync`` (PostgreSQL: its partitions,
``pg_total_relation_size``; SQLite: its pages and its index's, ``dbstat``)
are read; target: five destinations at most 1.2x one, for both.

PostgreSQL: a throwaway schema per case on ``LR_BENCH_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); SQLite: a file per case in a
temporary directory. A small warm-up job runs first (untimed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    PgSchema,
    fmt_rate,
    fmt_ratio,
    machine_facts,
    pg_facts,
    print_table,
    process_rss,
    sqlite_table_bytes,
    write_json,
)
from bench.cpu_profile import PgBackendsCpu, PySpy, process_cpu, pyspy_binary, top_functions  # noqa: E402
from bench.replicate import CLIENT, stop_process, write_site_config  # noqa: E402
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage  # noqa: E402
from lr_client.store import create_engine, open_store  # noqa: E402
from tests.kit.procs import LrServer  # noqa: E402
from tests.kit.sites import free_port  # noqa: E402

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
PLAIN_BATCH = 20_000
DELIVERY_APP = "lr-snapbench-delivery"  # application_name of the delivery run's connections
BODY_CHARS = 175  # {"body":"<175 chars>","id":123456} is about 200 bytes


def make_dataframe(spark: Any, rows: int, partitions: int, body_chars: int = BODY_CHARS) -> Any:
    from pyspark.sql import functions as F

    padded_id = F.lpad(F.col("id").cast("string"), 7, "0")
    body = F.concat(F.repeat(F.lit("x"), body_chars - 7), padded_id)
    return spark.range(0, rows, numPartitions=partitions).select("id", body.alias("body"))


# -- the baselines: Spark writes with no queue logic ------------------------------------


def _pg_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PlainWriter:
    """``foreachPartition`` function: encode each Row, insert ``(payload)`` into ``table``."""

    def __init__(self, url: str, table: str, copy: bool) -> None:
        self.url = url
        self.table = table
        self.copy = copy

    def __call__(self, rows: Iterable[Any]) -> None:
        import itertools

        from spark_jobs.encoders import json_encoder

        payloads = (json_encoder(r) for r in rows)
        if self.url.startswith("sqlite"):
            import sqlite3

            conn = sqlite3.connect(make_url(self.url).database or "", timeout=60)
            try:
                sql = f"INSERT INTO {self.table} (payload) VALUES (?)"
                while batch := list(itertools.islice(payloads, PLAIN_BATCH)):
                    with conn:
                        conn.executemany(sql, ((p,) for p in batch))
            finally:
                conn.close()
            return
        import psycopg

        with psycopg.connect(_pg_conninfo(self.url)) as pg:
            while batch := list(itertools.islice(payloads, PLAIN_BATCH)):
                with pg.transaction(), pg.cursor() as cur:
                    if self.copy:
                        stmt = f"COPY {self.table} (payload) FROM STDIN (FORMAT BINARY)"
                        with cur.copy(stmt) as cp:
                            cp.set_types(["bytea"])
                            for p in batch:
                                cp.write_row((p,))
                    else:
                        sql = f"INSERT INTO {self.table} (payload) VALUES (%s)"
                        cur.executemany(sql, [(p,) for p in batch])


def _create_bare_table(url: str, name: str, columns: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {name} ({columns})")
    finally:
        engine.dispose()


def _count(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
    finally:
        engine.dispose()


# -- delivery: the snapshot from the send queue to the sink's listener ------------------


class _CountingListener(RoutingQueueListener):
    """A no-op sink application: counts the snapshot rows and stamps the first and last."""

    def __init__(self) -> None:
        self.rows = 0
        self.first = 0.0
        self.ended = 0.0

    def process_full_sync(
        self, session: Any, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        if not self.first:
            self.first = time.perf_counter()
        self.rows += len(messages)
        return True

    def on_full_sync_end(self, session: Any, source_id: str, snapshot_id: str) -> None:
        self.ended = time.perf_counter()

    def process_log_entries(
        self, session: Any, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def _pid(server: LrServer) -> int:
    assert server.proc is not None
    return server.proc.pid


def run_delivery(
    spark: Any,
    src_url: str,
    sink_url: str,
    df: Any,
    rows: int,
    workdir: Path,
    profile: bool = False,
) -> dict[str, Any]:
    """Write the snapshot with the job, then ship it to a sink and deliver it to a listener.

    Both sites are ``lr server`` processes (gRPC on loopback, the product's defaults);
    the subscriber runs here, in a thread, with a no-op listener. The servers and the
    subscriber are running (and waiting) while the job writes; the time runs from the
    job's return (the snapshot READY, its end marker committed) to the listener's
    ``on_full_sync_end``: the source notices READY, reads and ships, the sink receives
    and writes its receive queue, the subscriber reads it and calls the listener, each
    committing as it goes, all inside the time. Resident sizes of the three processes
    are sampled meanwhile (the subscriber's is this process's, Spark's driver included).

    Also the CPU seconds of each stage over that time: ``ship`` (the source
    server), ``receive`` (the sink server), ``deliver`` (the subscriber's thread),
    and on PostgreSQL ``database`` (the backends of the bench's database, both
    sites'); with ``profile`` and py-spy installed, the top functions of each stage.
    """
    from lr_client.subscriber import RoutingQueueSubscriber
    from spark_jobs.snapshot_job import run_snapshot_job

    pg = src_url.startswith("postgresql")
    if pg:  # the run's own backends, told apart from others in the same database
        src_url, sink_url = (f"{u}&application_name={DELIVERY_APP}" for u in (src_url, sink_url))
    store = open_store(create_engine(src_url))
    sink = open_store(create_engine(sink_url))
    servers: list[LrServer] = []
    spies: dict[str, PySpy] = {}
    stop = threading.Event()
    try:
        store.create_schema()
        sink.create_schema()
        store.sites.register_sites(["sink"])
        sid = store.snapshots.request_snapshot(None, "sink", CLIENT, "bench")
        store.snapshots.start_snapshot(sid)
        port = free_port()
        sink_cfg = write_site_config(
            workdir / "sink.toml", "sink", sink_url, listen_port=port, sources=["src"]
        )
        src_cfg = write_site_config(
            workdir / "src.toml", "src", src_url, destinations=[("sink", port)], snapshot="app"
        )
        listener = _CountingListener()
        subscriber = RoutingQueueSubscriber(sink, CLIENT, listener, poll_interval=0.01)

        thread = threading.Thread(
            target=subscriber.run, args=(stop,), name="lr-bench-subscriber", daemon=True
        )
        servers.append(LrServer(sink_cfg, workdir).start())
        servers[0].wait_listening(port)
        servers.append(LrServer(src_cfg, workdir).start())
        thread.start()  # all three wait for the snapshot, which the job now writes
        assert run_snapshot_job(spark, src_url, sid, df, progress_interval=5.0) == rows
        start = time.perf_counter()  # READY: the job's end marker is committed
        db_cpu = PgBackendsCpu(src_url, DELIVERY_APP) if pg else None
        db_before = db_cpu.sample() if db_cpu is not None else {}
        pids = {"ship": _pid(servers[1]), "receive": _pid(servers[0])}
        cpu_before = {k: process_cpu(pid) or 0.0 for k, pid in pids.items()}
        assert thread.ident is not None
        thread_clock = time.pthread_getcpuclockid(thread.ident)
        thread_before = time.clock_gettime(thread_clock)
        spy = pyspy_binary() if profile else None
        if spy is not None:
            for stage, pid in [*pids.items(), ("deliver", os.getpid())]:
                spies[stage] = PySpy(spy, pid, workdir / f"{stage}.pyspy")
        procs = {"source": pids["ship"], "sink": pids["receive"], "subscriber": os.getpid()}
        rss: dict[str, list[int]] = {k: [] for k in procs}
        deadline = start + max(120.0, rows / 1000.0)
        ticks = 0
        while not listener.ended and time.perf_counter() < deadline:
            for k, pid in procs.items():
                rss[k].append(process_rss(pid) or 0)
            ticks += 1
            if db_cpu is not None and ticks % 10 == 0:
                db_cpu.sample()  # a backend that ends keeps its last sample
            time.sleep(0.05)
        if not listener.ended:
            raise RuntimeError(f"snapshot not delivered: {listener.rows:,} of {rows:,} rows")
        assert listener.rows == rows, (listener.rows, rows)
        seconds = listener.ended - start
        cpu = {k: round((process_cpu(pid) or 0.0) - cpu_before[k], 2) for k, pid in pids.items()}
        cpu["deliver"] = round(time.clock_gettime(thread_clock) - thread_before, 2)
        if db_cpu is not None:
            cpu["database"] = round(PgBackendsCpu.used(db_before, db_cpu.sample()), 2)
            db_cpu.close()
        out: dict[str, Any] = {
            "seconds": round(seconds, 3),
            "rows_per_second": round(rows / seconds),
            "listener_rows_per_second": round(rows / (listener.ended - listener.first)),
            "cpu_seconds": cpu,
            "cpu_us_per_row": {k: round(v * 1e6 / rows, 1) for k, v in cpu.items()},
            "rss_mib": {  # resident size at READY, highest while delivering, at the end
                k: [round(v[0] / 2**20), round(max(v) / 2**20), round(v[-1] / 2**20)]
                for k, v in rss.items()
                if v
            },
        }
        if spies:
            within = {"deliver": "lr_client/subscriber.py"}
            out["profile"] = {
                stage: top_functions(s.stop(), within=within.get(stage))
                for stage, s in spies.items()
            }
        return out
    finally:
        stop.set()
        for s in spies.values():
            s.stop()
        for server in reversed(servers):
            stop_process(server, timeout=10)
        store.engine.dispose()
        sink.engine.dispose()


# -- the delivery stage alone: the sink's receive queue to the listener -------------------

SINK_SOURCE = "src"
SINK_FILL_BATCH = 4000


def fill_sink(store: Any, rows: int, row_bytes: int, snapshot_id: str = "bench-sink") -> None:
    """Write a whole snapshot of ``rows`` rows into the sink's receive queue, as the
    receiver does (its batches through ``apply_snapshot_batch``, the end marker last)."""
    from lr_client.records import ReplicationType, WireEntry

    snap = ReplicationType.SNAPSHOT_SYNC
    body = "x" * _body_chars(row_bytes)
    for first in range(1, rows + 1, SINK_FILL_BATCH):
        batch = [
            WireEntry(pos, snap, f'{{"body":"{body}","id":{pos:07d}}}'.encode(), snapshot_id)
            for pos in range(first, min(rows, first + SINK_FILL_BATCH - 1) + 1)
        ]
        store.recv.apply_snapshot_batch(SINK_SOURCE, CLIENT, snapshot_id, batch)
    end = WireEntry(
        rows + 1, ReplicationType.LAST_FULL_SYNC_ENTRY, b"", snapshot_id, rows, base_position=7
    )
    store.recv.apply_snapshot_batch(SINK_SOURCE, CLIENT, snapshot_id, [end])


def run_sink_delivery(
    url: str, rows: int, row_bytes: int, cprofile: Path | None = None, batch: int | None = None
) -> dict[str, Any]:
    """The delivery stage alone: a whole snapshot READY in the sink's receive queue
    (its end marker received), delivered by a subscriber to a no-op listener.

    Timed from the subscriber's first poll to the listener's ``on_full_sync_end``;
    the subscriber polls in this thread (its CPU is this thread's), with
    ``cprofile`` a :mod:`cProfile` of it is written there.
    """
    import cProfile
    import pstats
    import resource

    from lr_client.subscriber import RoutingQueueSubscriber

    pg = url.startswith("postgresql")
    if pg:
        url = f"{url}&application_name={DELIVERY_APP}"
    sink = open_store(create_engine(url))
    try:
        sink.create_schema()
        fill_sink(sink, rows, row_bytes)
        listener = _CountingListener()
        sizes: dict[str, int] = {}
        if batch is not None:  # bytes: the batch's payloads and their per-entry overhead
            sizes = {"snapshot_batch_size": batch, "batch_max_bytes": batch * (row_bytes + 64)}
        subscriber = RoutingQueueSubscriber(sink, CLIENT, listener, poll_interval=0.0, **sizes)
        db_cpu = PgBackendsCpu(url, DELIVERY_APP) if pg else None
        db_before = db_cpu.sample() if db_cpu is not None else {}
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        prof = cProfile.Profile() if cprofile is not None else None
        cpu0, start = time.thread_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        deadline = start + max(120.0, rows / 1000.0)
        while not listener.ended and time.perf_counter() < deadline:
            subscriber.poll_once()
        if prof is not None:
            prof.disable()
        seconds = time.perf_counter() - start
        cpu = {"deliver": round(time.thread_time() - cpu0, 2)}
        if db_cpu is not None:
            cpu["database"] = round(PgBackendsCpu.used(db_before, db_cpu.sample()), 2)
            db_cpu.close()
        subscriber.close()
        if listener.rows != rows:
            raise RuntimeError(f"snapshot not delivered: {listener.rows:,} of {rows:,} rows")
        out: dict[str, Any] = {
            "rows": rows,
            "row_bytes": row_bytes,
            "snapshot_batch_size": subscriber.snapshot_batch_size,
            "batch_max_bytes": subscriber.batch_max_bytes,
            "seconds": round(seconds, 3),
            "rows_per_second": round(rows / seconds),
            "cpu_seconds": cpu,
            "cpu_us_per_row": {k: round(v * 1e6 / rows, 1) for k, v in cpu.items()},
            "maxrss_growth_mib": round(
                (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024, 1
            ),
        }
        if prof is not None and cprofile is not None:
            prof.dump_stats(str(cprofile))
            stats = pstats.Stats(prof)
            top = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]  # type: ignore[attr-defined]
            out["cprofile_self_seconds"] = {
                f"{Path(k[0]).name}:{k[1]}({k[2]})": round(v[2], 3) for k, v in top
            }
        return out
    finally:
        sink.engine.dispose()


def sink_main(args: argparse.Namespace, backends: Sequence[str], pg_url: str) -> int:
    """The delivery stage alone, per backend: rows/s from READY at the sink to the end."""
    console = Console(width=160)
    results: dict[str, list[dict[str, Any]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="lr-sinkbench-"))
    try:
        for backend in backends:
            results[backend] = []
            for _ in range(max(1, args.repeat)):
                db = pg_db(pg_url) if backend == "postgresql" else sqlite_db(tmp, "sink")
                with db as url:
                    prof = tmp / f"{backend}.prof" if args.cprofile else None
                    run = run_sink_delivery(
                        url, args.sink_rows, args.deliver_row_bytes, prof, args.sink_batch
                    )
                run["loadavg_after"] = round(os.getloadavg()[0], 1)
                results[backend].append(run)
                console.print(
                    f"{backend:10} {run['rows_per_second']:>10,} rows/s  ({run['seconds']:.2f}s,"
                    f" deliver CPU {run['cpu_us_per_row']} µs/row,"
                    f" RSS +{run['maxrss_growth_mib']} MiB, load {run['loadavg_after']})"
                )
                for name, secs in run.get("cprofile_self_seconds", {}).items():
                    console.print(f"    {secs:8.3f}s self  {name}")
    finally:
        for leftover in tmp.glob("*"):
            leftover.unlink()
        tmp.rmdir()
    write_json(
        args.sink_out,
        {
            "benchmark": "snapshot-sink-delivery",
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "facts": machine_facts(),
            "results": results,
        },
    )
    console.print(f"wrote {args.sink_out}")
    return 0


def _body_chars(row_bytes: int) -> int:
    """The body length that makes a row encode to ``row_bytes``: ``{"body":"…","id":N}``."""
    return max(8, row_bytes - len('{"body":"","id":1234567}'))


def print_deliveries(console: Console, deliveries: dict[str, dict[str, Any]]) -> None:
    stages = ["ship", "receive", "deliver", "database"]
    print_table(
        console,
        "Snapshot delivery: the job's READY snapshot, source lr server -> sink lr server"
        " -> subscriber (no-op listener)",
        [
            "backend",
            "rows",
            "bytes/row",
            "seconds",
            "rows/s (READY to end)",
            "rows/s at the listener",
            *(f"CPU µs/row {s}" for s in stages),
            "RSS MiB subscriber (READY/max/end)",
        ],
        [
            [
                backend,
                f"{d['rows']:,}",
                str(d.get("row_bytes", "")),
                f"{d['seconds']:.1f}",
                fmt_rate(d["rows_per_second"]),
                fmt_rate(d["listener_rows_per_second"]),
                *(str(d["cpu_us_per_row"].get(s, "-")) for s in stages),
                "/".join(str(x) for x in d.get("rss_mib", {}).get("subscriber", [])),
            ]
            for backend, d in deliveries.items()
        ],
        caption="target: >= 100,000 rows/s of 1 KiB, READY to the listener's end",
    )


def print_delivery_profile(console: Console, backend: str, delivery: dict[str, Any]) -> None:
    """The top functions by cumulative samples of each stage (when py-spy ran)."""
    for stage, prof in delivery.get("profile", {}).items():
        if not prof["samples"]:
            continue
        print_table(
            console,
            f"{backend} {stage}: top functions, {prof['samples']:,} py-spy samples",
            ["cumulative", "function", "self", "function "],
            [
                [f"{c[1]:.0%}", c[0], f"{x[1]:.0%}", x[0]]
                for c, x in zip(prof["cumulative"], prof["self"], strict=False)
            ],
        )


# -- cases --------------------------------------------------------------------------------


def run_job(spark: Any, url: str, df: Any, rows: int, **kwargs: Any) -> float:
    from spark_jobs.snapshot_job import run_snapshot_job

    store = open_store(create_engine(url))
    try:
        store.create_schema()
        sid = store.snapshots.request_snapshot(None, "bench", "bench")
        store.snapshots.start_snapshot(sid)
        start = time.perf_counter()
        count = run_snapshot_job(spark, url, sid, df, progress_interval=5.0, **kwargs)
        seconds = time.perf_counter() - start
        req = store.snapshots.get_snapshot(sid)
        assert count == rows and req is not None and req.entry_count == rows, (count, req)
        return seconds
    finally:
        store.engine.dispose()


def run_plain(spark: Any, url: str, df: Any, rows: int, copy: bool) -> float:
    pk = "id INTEGER PRIMARY KEY" if url.startswith("sqlite") else "id bigserial PRIMARY KEY"
    blob = "BLOB" if url.startswith("sqlite") else "bytea"
    _create_bare_table(url, "plain_rows", f"{pk}, payload {blob} NOT NULL")
    start = time.perf_counter()
    df.foreachPartition(PlainWriter(url, "plain_rows", copy))
    seconds = time.perf_counter() - start
    assert _count(url, "plain_rows") == rows
    return seconds


def run_jdbc(spark: Any, url: str, df: Any, rows: int) -> float:
    u = make_url(url)
    schema = (u.query.get("options") or "").removeprefix("-csearch_path=")
    if isinstance(schema, tuple):
        schema = schema[0]
    _create_bare_table(url, "jdbc_rows", "id bigint NOT NULL, body text NOT NULL")
    jdbc = f"jdbc:postgresql://{u.host or '127.0.0.1'}:{u.port or 5432}/{u.database}"
    props = {
        "user": u.username or "postgres",
        "driver": "org.postgresql.Driver",
        "batchsize": "10000",
        "reWriteBatchedInserts": "true",
    }
    if u.password:
        props["password"] = u.password
    if schema:
        props["currentSchema"] = str(schema)
    start = time.perf_counter()
    df.write.mode("append").jdbc(jdbc, "jdbc_rows", properties=props)
    seconds = time.perf_counter() - start
    assert _count(url, "jdbc_rows") == rows
    return seconds


def _copy_worker(url: str, snapshot_id: str, part: int, lo: int, hi: int) -> float:
    """Write rows ``lo..hi`` as part ``part`` with the job's COPY writer; return seconds."""
    from spark_jobs.writer import DEFAULT_CHUNK_ROWS, open_sink

    body = "x" * (BODY_CHARS - 7)
    payloads = [b'{"body":"%s%07d","id":%d}' % (body.encode(), i, i) for i in range(lo, hi)]
    sink = open_sink(url, snapshot_id)
    try:
        start = time.perf_counter()
        sink.write_part(part, iter(payloads), DEFAULT_CHUNK_ROWS["postgresql"])
        return time.perf_counter() - start
    finally:
        sink.close()


def run_copy_no_spark(spark: Any, url: str, df: Any, rows: int, workers: int = 2) -> float:
    import multiprocessing

    store = open_store(create_engine(url))
    try:
        store.create_schema()
        sid = store.snapshots.request_snapshot(None, "bench", "bench")
        store.snapshots.start_snapshot(sid)
        step = -(-rows // workers)
        jobs = [(url, sid, i, i * step, min(rows, (i + 1) * step)) for i in range(workers)]
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            seconds = max(pool.starmap(_copy_worker, jobs))
        assert store.snapshot_entries.count_snapshot_entries(sid) == rows
        return seconds
    finally:
        store.engine.dispose()


@contextmanager
def sqlite_db(tmp: Path, name: str) -> Iterator[str]:
    path = tmp / f"{name}-{time.monotonic_ns()}.db"
    yield f"sqlite:///{path}"
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


@contextmanager
def pg_db(admin_url: str) -> Iterator[str]:
    with PgSchema(admin_url, "lrsnapbench") as schema:
        yield schema.url


# -- shared snapshots: five destinations against one -------------------------------------

SHARED_DESTINATIONS = (1, 5)
_PG_SNAPSYNC_BYTES = text(
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
    " WHERE c.relnamespace = CAST(current_schema() AS regnamespace)"
    " AND c.relkind = 'r' AND c.relname LIKE 'lrq\\_send\\_snapsync\\_p%'"
)


def _snapsync_storage(store: Any) -> tuple[int, int]:
    """(rows, bytes) of ``lrq_send_snapsync`` (PostgreSQL: every partition)."""
    from sqlalchemy import func, select

    from lr_client.store.schema import tables as s

    with store.read() as conn:
        rows = int(conn.execute(select(func.count()).select_from(s.send_snapsync)).scalar_one())
        if store.dialect == "postgresql":
            size = int(conn.execute(_PG_SNAPSYNC_BYTES).scalar_one())
        else:
            size = sqlite_table_bytes(conn, ["lrq_send_snapsync"])
    return rows, size


def run_shared(url: str, destinations: int, rows: int) -> dict[str, Any]:
    """``destinations`` ask for a full sync of one client; the provider runs once; measures."""
    from lr_client.snapshot import SnapshotContext, SnapshotProviderRunner

    body = "x" * BODY_CHARS

    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit(f'{{"body":"{body}","id":{i}}}'.encode() for i in range(rows))

    store = open_store(create_engine(url))
    try:
        store.create_schema()
        names = [f"dest{i}" for i in range(destinations)]
        store.sites.register_sites(names)
        ids = {store.snapshots.request_snapshot(None, d, "bench", "bench") for d in names}
        runner = SnapshotProviderRunner(store, "bench", provide, chunk_size=5000)
        start = time.perf_counter()
        jobs = runner.poll_once()
        seconds = time.perf_counter() - start
        stored_rows, stored_bytes = _snapsync_storage(store)
        views = store.snapshots.list_snapshots(client_name="bench")
        assert all(v.status.value == "ready" for v in views) and len(views) == destinations
        return {
            "destinations": destinations,
            "snapshots": len(ids),
            "jobs": jobs,
            "seconds": round(seconds, 3),
            "rows": stored_rows,
            "bytes": stored_bytes,
        }
    finally:
        store.engine.dispose()


def shared_main(args: argparse.Namespace, backends: Sequence[str], pg_url: str) -> int:
    """The shared-snapshot section: storage and job time, five destinations against one."""
    console = Console(width=160)
    facts: dict[str, Any] = machine_facts()
    results: dict[str, dict[str, Any]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="lr-sharedbench-"))
    try:
        for backend in backends:
            runs: dict[int, list[dict[str, Any]]] = {n: [] for n in SHARED_DESTINATIONS}
            for rnd in range(max(1, args.repeat)):  # alternating order: drift hits both alike
                for n in SHARED_DESTINATIONS[:: 1 if rnd % 2 == 0 else -1]:
                    db = pg_db(pg_url) if backend == "postgresql" else sqlite_db(tmp, "shared")
                    with db as url:
                        runs[n].append(run_shared(url, n, args.shared_rows))
            results[backend] = {}
            for n, got in runs.items():
                results[backend][str(n)] = {
                    **got[0],
                    "seconds": statistics.median(g["seconds"] for g in got),
                    "runs": [g["seconds"] for g in got],
                }
    finally:
        for leftover in tmp.glob("*"):
            leftover.unlink()
        tmp.rmdir()
    table_rows = []
    for backend, res in results.items():
        one, five = res["1"], res["5"]
        table_rows.append(
            [
                backend,
                f"{one['snapshots']} / {five['snapshots']}",
                f"{one['rows']:,} / {five['rows']:,}",
                f"{one['bytes'] / 1e6:,.1f} / {five['bytes'] / 1e6:,.1f}",
                fmt_ratio(five["bytes"] / one["bytes"], 1.2, at_most=True),
                f"{one['seconds']:.2f} / {five['seconds']:.2f}",
                fmt_ratio(five["seconds"] / one["seconds"], 1.2, at_most=True),
            ]
        )
        res["storage_ratio"] = round(five["bytes"] / one["bytes"], 3)
        res["time_ratio"] = round(five["seconds"] / one["seconds"], 3)
    print_table(
        console,
        f"Shared snapshots: 1 vs 5 destinations, {args.shared_rows:,} rows of ~200 bytes,"
        " in-process provider",
        [
            "backend",
            "snapshots",
            "rows stored",
            "MB of lrq_send_snapsync",
            "storage 5/1",
            "job seconds",
            "time 5/1",
        ],
        table_rows,
        caption="target: 5 destinations <= 1.2x one destination, storage and job time",
    )
    write_json(
        args.shared_out,
        {
            "benchmark": "snapshot-shared",
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "rows": args.shared_rows,
            "repeat": max(1, args.repeat),
            "facts": facts,
            "results": results,
        },
    )
    console.print(f"wrote {args.shared_out}")
    return 0


def cases(backend: str) -> dict[str, Callable[[Any, str, Any, int], float]]:
    out: dict[str, Callable[[Any, str, Any, int], float]] = {
        "job": lambda spark, url, df, rows: run_job(spark, url, df, rows),
        "job-rdd": lambda spark, url, df, rows: run_job(spark, url, df, rows, path="rdd"),
    }
    if backend == "postgresql":
        out["job-store"] = lambda spark, url, df, rows: run_job(
            spark, url, df, rows, method="store"
        )
    out["plain-insert"] = lambda spark, url, df, rows: run_plain(spark, url, df, rows, False)
    if backend == "postgresql":
        out["plain-copy"] = lambda spark, url, df, rows: run_plain(spark, url, df, rows, True)
        out["copy-no-spark"] = run_copy_no_spark
        if JDBC_JAR.exists():
            out["spark-jdbc"] = run_jdbc
    return out


def build_spark(master: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import warnings

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("lr-bench-snapshot")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if JDBC_JAR.exists():
        builder = builder.config("spark.jars", str(JDBC_JAR))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def case_summary(rows: int, times: Sequence[float], loads: list[float]) -> dict[str, Any]:
    """One case's figures over its rounds: the median, the best, each run's seconds."""
    seconds = statistics.median(times)
    return {
        "seconds": round(seconds, 3),
        "rows_per_second": round(rows / seconds),
        "best_rows_per_second": round(rows / min(times)),
        "runs": [round(t, 3) for t in times],
        "loadavg_after_runs": loads,
    }


def snapshot_report(
    console: Console,
    args: argparse.Namespace,
    payload_bytes: int,
    results: dict[str, dict[str, Any]],
    deliveries: dict[str, dict[str, Any]],
) -> None:
    """The cases' table (and the job against its references), then the deliveries."""
    names = list(dict.fromkeys(n for r in results.values() for n in r))
    rows_out = []
    for backend, r in results.items():
        job = r.get("job", {}).get("rows_per_second")
        ratios = []
        for ref in ("plain-insert", "copy-no-spark"):
            base = r.get(ref, {}).get("rows_per_second")
            ratios.append(f"{job / base:.2f}x" if job and base else "-")
        rows_out.append(
            [backend]
            + [fmt_rate(r[n]["rows_per_second"]) if n in r else "-" for n in names]
            + ratios
        )
    print_table(
        console,
        f"Snapshot job, {args.rows:,} rows of ~{payload_bytes} bytes, {args.master}, rows/s",
        ["backend", *names, "job / plain-insert", "job / copy-no-spark"],
        rows_out,
        caption="target: job >= 100,000 rows/s into PostgreSQL",
    )
    if deliveries:
        print_deliveries(console, deliveries)


def snapshot_data(
    args: argparse.Namespace,
    facts: dict[str, Any],
    payload_bytes: int,
    results: dict[str, dict[str, Any]],
    deliveries: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The JSON the benchmark writes."""
    return {
        "benchmark": "snapshot",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": args.rows,
        "payload_bytes": payload_bytes,
        "partitions": args.partitions,
        "facts": facts,
        "results": results,
        "delivery": deliveries,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--repeat", type=int, default=1, help="rounds over the cases (median reported)")
    p.add_argument("--cases", help="comma-separated subset of cases")
    p.add_argument(
        "--deliver-rows",
        type=int,
        default=None,
        help="rows of the delivery run, source to listener (default: --rows; 0 skips it)",
    )
    p.add_argument(
        "--deliver-row-bytes",
        type=int,
        default=1024,
        help="encoded size of each row of the delivery run (default 1 KiB)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="sample each delivery stage with py-spy (LR_BENCH_PYSPY or py-spy on PATH)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "snapshot.json")
    p.add_argument(
        "--shared-rows",
        type=int,
        default=None,
        help="run only the shared-snapshot measurement (1 vs 5 destinations) with N rows",
    )
    p.add_argument(
        "--shared-out", type=Path, default=ROOT / "bench" / "results" / "snapshot-shared.json"
    )
    p.add_argument(
        "--sink-rows",
        type=int,
        default=None,
        help="run only the delivery stage: N rows READY in the sink's receive queue to the end",
    )
    p.add_argument("--cprofile", action="store_true", help="with --sink-rows: cProfile it")
    p.add_argument(
        "--sink-batch",
        type=int,
        default=None,
        help="with --sink-rows: entries per snapshot delivery (default: the subscriber's)",
    )
    p.add_argument(
        "--sink-out", type=Path, default=ROOT / "bench" / "results" / "snapshot-sink.json"
    )
    args = p.parse_args(argv)
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if args.sink_rows is not None:
        return sink_main(args, backends, pg_url)
    if args.shared_rows is not None:
        return shared_main(args, backends, pg_url)
    wanted = set(args.cases.split(",")) if args.cases else None

    console = Console(width=160)
    facts: dict[str, Any] = machine_facts()
    spark = build_spark(args.master)
    facts["spark"] = spark.version
    facts["master"] = args.master
    df = make_dataframe(spark, args.rows, args.partitions)
    sample = df.limit(1).collect()[0]
    from spark_jobs.encoders import json_encoder

    payload_bytes = len(json_encoder(sample))
    results: dict[str, dict[str, Any]] = {}
    deliveries: dict[str, dict[str, Any]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="lr-snapbench-"))
    try:
        for backend in backends:
            if backend == "postgresql":
                engine = create_engine(pg_url)
                with engine.connect() as conn:
                    facts["postgresql"] = pg_facts(conn)
                engine.dispose()

            def database(backend: str = backend) -> AbstractContextManager[str]:
                return pg_db(pg_url) if backend == "postgresql" else sqlite_db(tmp, "bench")

            with database() as url:  # warm-up: JVM, Python workers, imports
                run_job(spark, url, make_dataframe(spark, 20_000, args.partitions), 20_000)
            chosen = {n: c for n, c in cases(backend).items() if wanted is None or n in wanted}
            names = list(chosen)
            times: dict[str, list[float]] = {n: [] for n in names}
            loads: dict[str, list[float]] = {n: [] for n in names}
            rounds = max(1, args.repeat) if names else 0
            for r in range(rounds):  # rotating order: load drift hits every case alike
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    with database() as url:
                        seconds = chosen[name](spark, url, df, args.rows)
                    times[name].append(seconds)
                    loads[name].append(round(os.getloadavg()[0], 1))
                    console.print(
                        f"{backend:10} {name:13} {args.rows / seconds:>10,.0f} rows/s"
                        f"  ({seconds:.1f}s, load {loads[name][-1]})"
                    )
            deliver_rows = args.rows if args.deliver_rows is None else args.deliver_rows
            delivery: dict[str, Any] | None = None
            if deliver_rows > 0:
                with database() as src_url, database() as sink_url:
                    delivery = run_delivery(
                        spark,
                        src_url,
                        sink_url,
                        make_dataframe(
                            spark,
                            deliver_rows,
                            args.partitions,
                            _body_chars(args.deliver_row_bytes),
                        ),
                        deliver_rows,
                        tmp,
                        profile=args.profile,
                    )
                delivery["rows"] = deliver_rows
                delivery["row_bytes"] = args.deliver_row_bytes
                delivery["loadavg_after"] = round(os.getloadavg()[0], 1)
                console.print(
                    f"{backend:10} {'delivered':13} {delivery['rows_per_second']:>10,} rows/s"
                    f"  ({delivery['seconds']:.1f}s from READY to the listener's end,"
                    f" load {delivery['loadavg_after']})"
                )
                print_delivery_profile(console, backend, delivery)
            results[backend] = {}
            if delivery is not None:
                deliveries[backend] = delivery
            for name in names:
                results[backend][name] = case_summary(args.rows, times[name], loads[name])
    finally:
        spark.stop()
        for leftover in tmp.glob("*"):
            leftover.unlink()
        tmp.rmdir()

    snapshot_report(console, args, payload_bytes, results, deliveries)
    write_json(args.out, snapshot_data(args, facts, payload_bytes, results, deliveries))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
