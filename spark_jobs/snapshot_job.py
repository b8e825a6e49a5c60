"""The PySpark snapshot job's command line: a source loaded as a DataFrame, then
written as one snapshot's entries (:func:`spark_jobs.driver.run_snapshot_job`).

Command line (``spark-submit spark_jobs/snapshot_job.py ...`` takes the same
arguments; then ``--master`` defaults to spark-submit's)::

    python -m spark_jobs.snapshot_job --database-url URL --snapshot-id ID \\
        --source SPEC [--encoder mod:fn] [--master M] [--start] \\
        [--conf key=value ...] [--source-option key=value ...] [--chunk-rows N]
    python -m spark_jobs.snapshot_job --database-url URL --destination B --client policy \\
        --source SPEC ...          # records a new request first (lr snapshot run)

``--database-url`` defaults to ``$LR_DATABASE_URL``. Sources are described in
:mod:`spark_jobs.sources`, encoders in :mod:`spark_jobs.encoders`. Prints one
JSON line (``snapshot_id``, ``status``, ``entry_count``, ``seconds``) and
exits 0; 2 for bad arguments, 3 if the snapshot was cancelled, superseded or
not startable, 1 on any other failure (the request is then marked FAILED).
On a cluster, the executors need the package too (see :mod:`spark_jobs.driver`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file: spark-submit spark_jobs/snapshot_job.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lr_client.errors import ConfigError, InvalidInputError, LRError, SnapshotError
from lr_client.records import SnapshotRequest, SnapshotStatus
from lr_client.snapshot import HEARTBEAT_INTERVAL_S, SnapshotHeartbeat, wait_for_base
from lr_client.store import create_engine, open_store
from spark_jobs.driver import after_failure, error_summary, resolve_encoder, run_snapshot_job
from spark_jobs.encoders import Encoder
from spark_jobs.launch import DATABASE_URL_ENV, launch_snapshot_job
from spark_jobs.sources import DEBIAN_POSTGRESQL_JAR, SourceSpec, load_dataframe, parse_source
from spark_jobs.writer import METHODS, JobStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_jobs.snapshot_job")


def _key_values(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected key=value")
        out[key.strip()] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    """The job's argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs.snapshot_job",
        description="Write a DataFrame as the entries of one snapshot (full sync).",
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get(DATABASE_URL_ENV),
        help=f"the site database (default: ${DATABASE_URL_ENV})",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--snapshot-id", help="fill this existing request")
    which.add_argument("--destination", help="record a new request for this site (with --client)")
    p.add_argument("--client", help="client name of the new request (with --destination)")
    p.add_argument("--reason", default="lr snapshot run", help="reason of the new request")
    p.add_argument("--source", help="jdbc:URL?table=T, parquet:PATH, csv:PATH, ..., or mod:fn")
    p.add_argument("--jdbc-url", help="JDBC URL (instead of --source jdbc:...)")
    p.add_argument("--jdbc-table", help="table to read through --jdbc-url")
    p.add_argument(
        "--source-option", action="append", metavar="KEY=VALUE", help="reader option (repeat)"
    )
    p.add_argument("--encoder", default="", help="module:function row -> bytes (default: JSON)")
    p.add_argument(
        "--key-column", default="", help="the column holding each row's partition key (none)"
    )
    p.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    p.add_argument(
        "--conf", action="append", metavar="KEY=VALUE", help="Spark configuration (repeat)"
    )
    p.add_argument("--start", action="store_true", help="start the request if still REQUESTED")
    p.add_argument("--chunk-rows", type=int, help="rows per transaction")
    p.add_argument("--method", choices=METHODS, default="copy", help="PostgreSQL write method")
    p.add_argument("--progress-interval", type=float, default=2.0, help="seconds")
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=HEARTBEAT_INTERVAL_S,
        help="seconds between heartbeats to the sender session",
    )
    p.add_argument("--app-name", default="lr-snapshot", help="Spark application name")
    p.add_argument("--log-level", default="WARN", help="Spark log level")
    return p


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    master: str | None, conf: dict[str, str], app_name: str, source: SourceSpec | None = None
) -> SparkSession:
    """A SparkSession for the job (``local[*]`` unless told or run by spark-submit)."""
    from pyspark.sql import SparkSession

    if master is None and not _under_spark_submit():
        master = "local[*]"
    conf = dict(conf)
    if (
        (master or "").startswith("local")
        and "spark.pyspark.python" not in conf
        and "PYSPARK_PYTHON" not in os.environ
    ):
        conf["spark.pyspark.python"] = sys.executable  # workers run this interpreter
    if (
        source is not None
        and source.jdbc_subprotocol == "postgresql"
        and "spark.jars" not in conf
        and "spark.jars.packages" not in conf
        and Path(DEBIAN_POSTGRESQL_JAR).exists()
    ):
        conf["spark.jars"] = DEBIAN_POSTGRESQL_JAR
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _nothing_to_do(snapshot_id: str, req: SnapshotRequest | None) -> int:
    """Print the result line of a request the job cannot run; exit code 3."""
    state = req.status.value if req else "unknown"
    error = f"snapshot {snapshot_id} is {state}: nothing to do"
    out = {"snapshot_id": snapshot_id, "status": "stopped", "error": error}
    print(json.dumps({**out, "seconds": 0}, sort_keys=True))
    return 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m spark_jobs.snapshot_job`` and ``spark-submit``."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if not args.database_url:
            raise ConfigError(f"--database-url (or ${DATABASE_URL_ENV}) is required")
        if args.destination and not args.client:
            raise ConfigError("--destination needs --client")
        if args.heartbeat_interval <= 0:
            raise ConfigError("--heartbeat-interval must be positive")
        if args.jdbc_url:
            if args.source:
                raise ConfigError("give --source or --jdbc-url, not both")
            spec = args.jdbc_url if args.jdbc_url.startswith("jdbc:") else "jdbc:" + args.jdbc_url
            source = parse_source(
                spec, _key_values(args.source_option, "--source-option"), jdbc_table=args.jdbc_table
            )
        elif args.source:
            source = parse_source(args.source, _key_values(args.source_option, "--source-option"))
        else:
            raise ConfigError("--source (or --jdbc-url and --jdbc-table) is required")
        conf = _key_values(args.conf, "--conf")
        encoder = resolve_encoder(args.encoder)  # fail on a bad name before starting Spark
    except (ConfigError, InvalidInputError) as exc:
        parser.print_usage(sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 2

    snapshot_id: str = args.snapshot_id or ""
    start = bool(args.start)
    store = open_store(create_engine(args.database_url))
    requests = store.snapshots
    try:
        if not snapshot_id:
            snapshot_id = requests.request_snapshot(
                None, args.destination, args.client, args.reason
            )
            start = True
            log.info("recorded snapshot request %s", snapshot_id)
        else:  # refuse early, before Spark starts, a request there is nothing to do for
            req = requests.get_snapshot(snapshot_id)
            usable = [SnapshotStatus.RUNNING] + ([SnapshotStatus.REQUESTED] if start else [])
            if req is None or req.status not in usable:
                return _nothing_to_do(snapshot_id, req)
        if start and requests.start_snapshot(snapshot_id) is None:
            # Started here, before the source is read: a source that reads eagerly
            # (a ``module:function`` that collects rows) must not read before the
            # base position is fixed, or changes committed in between would be in
            # neither the snapshot nor the log entries that follow it. A request
            # another job started (a shared snapshot launched by two servers of a
            # site) is that job's to write: two writers of one part would race.
            return _nothing_to_do(snapshot_id, requests.get_snapshot(snapshot_id))
    except LRError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()

    started = time.monotonic()
    store = open_store(create_engine(args.database_url))
    try:
        # From the start of the request to the job's end, so a job that dies (or a
        # driver killed) stops the beats and the sender session replaces it.
        with SnapshotHeartbeat(store, snapshot_id, args.heartbeat_interval):
            code, result = _execute(store, args, source, conf, encoder, snapshot_id)
    finally:
        store.close()
    result["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(result, sort_keys=True), flush=True)
    return code


def _execute(
    store: JobStore,
    args: argparse.Namespace,
    source: SourceSpec,
    conf: dict[str, str],
    encoder: Encoder | None,
    snapshot_id: str,
) -> tuple[int, dict[str, Any]]:
    """Start Spark, load the source and run the job; the exit code and the result line."""
    code = 1
    result: dict[str, Any] = {"snapshot_id": snapshot_id}
    spark: SparkSession | None = None
    try:  # a source read eagerly (a ``module:function``) reads a branch's tables after it
        wait_for_base(store, snapshot_id)
    except SnapshotError as exc:
        result.update(status="stopped", error=str(exc))
        return 3, result
    try:
        spark = build_session(args.master, conf, args.app_name, source)
        spark.sparkContext.setLogLevel(args.log_level)
        df = load_dataframe(spark, source)
    except Exception as exc:
        log.exception("snapshot job could not start")
        if spark is not None:
            spark.stop()
        after_failure(store, snapshot_id, exc, mark_failed=True)  # not left RUNNING
        result.update(status="failed", error=error_summary(exc))
        return 1, result
    try:
        count = run_snapshot_job(
            spark,
            args.database_url,
            snapshot_id,
            df,
            encoder,
            chunk_rows=args.chunk_rows,
            method=args.method,
            progress_interval=args.progress_interval,
            key_column=args.key_column,
        )
        result.update(status=SnapshotStatus.READY.value, entry_count=count)
        code = 0
    except SnapshotError as exc:
        result.update(status="stopped", error=str(exc))
        code = 3
    except (ConfigError, InvalidInputError) as exc:
        result.update(status="failed", error=str(exc))
        code = 2
    except Exception as exc:
        log.exception("snapshot job failed")
        result.update(status="failed", error=error_summary(exc))
        code = 1
    finally:
        spark.stop()
    return code, result


__all__ = [
    "build_parser",
    "build_session",
    "launch_snapshot_job",
    "main",
    "run_snapshot_job",
]

if __name__ == "__main__":
    sys.exit(main())
