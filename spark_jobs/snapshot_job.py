"""The PySpark snapshot job: any DataFrame becomes one snapshot's entries.

Every partition writes its rows, encoded, as entries of ``LRQ_Send_SnapSync``
from the executors, in parallel and idempotently (see :mod:`spark_jobs.writer`);
once every partition has committed, the driver writes the end marker with the
entry count and the snapshot becomes READY for the sender session. While it
runs, the driver records progress (rows written) in the request, where
``lr status`` shows it, and stops the job if the request is cancelled or
superseded.

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

The executors import ``lr_client`` and ``spark_jobs``: on a cluster, install
the package (``pip install 'lr-routing-queue[spark,postgres]'``) on every node
or ship it with ``--py-files``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file: spark-submit spark_jobs/snapshot_job.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lr_client import errors as lr_errors
from lr_client.errors import ConfigError, InvalidInputError, LRError, SnapshotError
from lr_client.records import SnapshotRequest, SnapshotStatus
from lr_client.snapshot import HEARTBEAT_INTERVAL_S, SnapshotHeartbeat, wait_for_base
from lr_client.store import create_engine, open_store
from spark_jobs.encoders import Encoder, arrow_compatible, json_encoder, load_encoder
from spark_jobs.launch import DATABASE_URL_ENV, launch_snapshot_job
from spark_jobs.sources import DEBIAN_POSTGRESQL_JAR, SourceSpec, load_dataframe, parse_source
from spark_jobs.writer import (
    DEFAULT_CHUNK_ROWS,
    METHODS,
    RESULT_SCHEMA,
    JobStore,
    PartitionWriter,
    drop_other_parts,
    rows_committed,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("spark_jobs.snapshot_job")

#: Largest encoded row accepted (as for log entries).
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
PATHS = ("auto", "arrow", "rdd")

_PANDAS_WARNING = "PySpark does not yet fully support pandas"
_LR_ERROR_RE = re.compile(r"lr_client\.errors\.(\w+): ([^\n]*)")


class _Monitor(threading.Thread):
    """Driver thread: records progress, and stops the job if the request is cancelled."""

    def __init__(
        self,
        store: JobStore,
        snapshot_id: str,
        parts: int,
        interval: float,
        on_cancel: Callable[[], None],
    ) -> None:
        super().__init__(name=f"lr-snapshot-progress-{snapshot_id[:8]}", daemon=True)
        self.store = store
        self.snapshot_id = snapshot_id
        self.parts = parts
        self.interval = interval
        self.on_cancel = on_cancel
        self.done = threading.Event()
        self.cancelled_status: SnapshotStatus | None = None

    def run(self) -> None:
        while not self.done.wait(self.interval):
            try:
                req = self.store.snapshots.get_snapshot(self.snapshot_id)
                if req is None or req.status != SnapshotStatus.RUNNING:
                    self.cancelled_status = req.status if req else SnapshotStatus.CANCELLED
                    log.warning("snapshot %s is %s: stopping", self.snapshot_id, req and req.status)
                    self.on_cancel()
                    return
                rows = rows_committed(self.store, self.snapshot_id, self.parts)
                self.store.snapshot_entries.set_snapshot_progress(self.snapshot_id, rows)
            except Exception:  # progress is best effort; the job's own writes decide
                log.warning("snapshot %s: progress update failed", self.snapshot_id, exc_info=True)


def _resolve_encoder(encoder: Encoder | str | None) -> Encoder | None:
    """None stands for the default JSON encoder (the Arrow path encodes dicts)."""
    if encoder is None or encoder == "":
        return None
    fn = load_encoder(encoder) if isinstance(encoder, str) else encoder
    if fn is json_encoder:
        return None
    if not callable(fn):
        raise ConfigError(f"encoder {encoder!r} is not callable")
    return fn


def _require_running(store: JobStore, snapshot_id: str, start: bool) -> None:
    req = store.snapshots.get_snapshot(snapshot_id)
    if req is None:
        raise SnapshotError(f"no snapshot request {snapshot_id}")
    if req.status == SnapshotStatus.REQUESTED and start:
        if store.snapshots.start_snapshot(snapshot_id) is None:
            raise SnapshotError(f"snapshot {snapshot_id} could not be started (taken or cancelled)")
        return
    if req.status != SnapshotStatus.RUNNING:
        hint = " (pass start=True / --start)" if req.status == SnapshotStatus.REQUESTED else ""
        raise SnapshotError(f"snapshot {snapshot_id} is {req.status.value}, not running{hint}")


def _mapped_error(exc: BaseException) -> LRError | None:
    """The SDK error an executor raised, as the driver sees it in Spark's message."""
    found = _LR_ERROR_RE.findall(str(exc))
    if not found:
        return None
    name, message = found[-1]
    cls = getattr(lr_errors, name, None)
    if isinstance(cls, type) and issubclass(cls, LRError):
        return cls(message.strip())
    return None


def _summary(exc: BaseException) -> str:
    text = str(exc)
    found = re.findall(r"^\s*(\w+(?:\.\w+)*(?:Error|Exception)): ([^\n]+)$", text, re.M)
    if found:
        return f"{found[-1][0]}: {found[-1][1]}"[:300]
    return (text.strip().splitlines() or [type(exc).__name__])[0][:300]


def _after_failure(
    store: JobStore, snapshot_id: str, exc: BaseException, mark_failed: bool
) -> BaseException:
    """Release what the job wrote and say why it stopped; return the error to raise."""
    req = store.snapshots.get_snapshot(snapshot_id)
    status = req.status if req else None
    if status in (SnapshotStatus.CANCELLED, SnapshotStatus.FAILED, None):
        # Superseded or cancelled meanwhile: purge anything a task committed late.
        store.snapshots.cancel_snapshot(snapshot_id, "released by the snapshot job")
        return SnapshotError(f"snapshot {snapshot_id} was {status or 'deleted'}: job stopped")
    mapped = _mapped_error(exc)
    if status == SnapshotStatus.RUNNING and mark_failed and isinstance(exc, Exception):
        reason = f"snapshot job failed: {mapped or _summary(exc)}"[:500]
        store.snapshots.update_snapshot(
            snapshot_id,
            expect=[SnapshotStatus.RUNNING],
            status=SnapshotStatus.FAILED,
            reason=reason,
        )
        store.snapshots.cancel_snapshot(snapshot_id, "released by the snapshot job")  # entries only
    if not isinstance(exc, Exception):
        return exc
    if mapped is not None:
        return mapped
    if isinstance(exc, LRError):
        return exc
    return SnapshotError(f"snapshot {snapshot_id}: job failed: {_summary(exc)}")


def run_snapshot_job(
    spark: SparkSession,
    database_url: str,
    snapshot_id: str,
    df: DataFrame,
    encoder: Encoder | str | None = None,
    *,
    start: bool = False,
    chunk_rows: int | None = None,
    method: str = "copy",
    path: str = "auto",
    progress_interval: float = 2.0,
    mark_failed: bool = True,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    key_column: str = "",
) -> int:
    """Write ``df`` as the entries of snapshot ``snapshot_id``; return the entry count.

    ``key_column``: the column whose value (str or bytes; another type as its
    ``str``; null: none) is each entry's partition key.

    The request must be RUNNING (or REQUESTED with ``start=True``, which
    starts it and fixes its base position). The rows must be read after the
    base position is fixed: a lazy DataFrame (a JDBC or file source) is read
    by this job, but one built from rows collected beforehand must be built
    after the request is started (``store.start_snapshot``), as the command
    line does. ``encoder`` is a
    ``Callable[[Row], bytes]`` or ``"module:function"``; the default is
    :func:`spark_jobs.encoders.json_encoder`. Each partition writes its rows
    in transactions of ``chunk_rows``; on PostgreSQL through binary ``COPY``
    (``method="store"`` uses the store's inserts instead). Rows reach the
    Python workers as Arrow batches when the schema allows it
    (``path="auto"``), else as Rows (``path="rdd"``).

    Running it again for the same snapshot, or Spark retrying a task, never
    duplicates entries. When every partition has committed, the end marker is
    written and the snapshot is READY. If the request is cancelled or
    superseded meanwhile the job is stopped, its entries are deleted and
    :class:`~lr_client.errors.SnapshotError` is raised; on any other failure
    the request is marked FAILED (unless ``mark_failed`` is false, which
    leaves it RUNNING for another run) and the error is raised: the SDK error
    an executor raised (e.g. :class:`~lr_client.errors.InvalidPayloadError`),
    or :class:`~lr_client.errors.SnapshotError`.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    enc = _resolve_encoder(encoder)
    store = open_store(create_engine(database_url))
    try:
        rows = chunk_rows or DEFAULT_CHUNK_ROWS.get(store.dialect, 10_000)
        if rows <= 0:
            raise ValueError("chunk_rows must be positive")
        if key_column and key_column not in df.columns:
            raise ConfigError(f"key column {key_column!r} is not a column of the source")
        use_arrow = path == "arrow" or (path == "auto" and arrow_compatible(df.schema))
        writer = PartitionWriter(
            database_url=database_url,
            snapshot_id=snapshot_id,
            columns=tuple(df.columns),
            encoder=enc,
            chunk_rows=rows,
            max_payload_bytes=max_payload_bytes,
            method=method,
            key_column=key_column,
        )
        _require_running(store, snapshot_id, start)  # nothing written before this
        try:
            wait_for_base(store, snapshot_id)  # a branch's tables cover the base first
            return _run(spark, store, snapshot_id, df, writer, use_arrow, progress_interval)
        except BaseException as exc:
            err = _after_failure(store, snapshot_id, exc, mark_failed)
            if err is exc:
                raise
            raise err from exc
    finally:
        store.close()


def _wait_for_tasks(spark: SparkSession, group: str, timeout: float = 120.0) -> None:
    """After a failed job, wait until its killed tasks are gone (they may still be writing)."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                active += stage.numActiveTasks if stage else 0
        if not active:
            return
        time.sleep(0.1)
    log.warning("tasks of %s still running after %.0fs", group, timeout)


def _run(
    spark: SparkSession,
    store: JobStore,
    snapshot_id: str,
    df: DataFrame,
    writer: PartitionWriter,
    use_arrow: bool,
    progress_interval: float,
) -> int:
    sc = spark.sparkContext
    group = f"lr-snapshot-{snapshot_id}-{uuid.uuid4().hex[:8]}"
    parts = df.rdd.getNumPartitions()
    monitor = _Monitor(
        store, snapshot_id, parts, progress_interval, lambda: sc.cancelJobGroup(group)
    )
    started = time.monotonic()
    sc.setJobGroup(group, f"lr snapshot {snapshot_id}", interruptOnCancel=True)
    monitor.start()
    try:
        if use_arrow:
            with warnings.catch_warnings():
                # pandas_udf's version check; mapInArrow itself does not use pandas.
                warnings.filterwarnings("ignore", _PANDAS_WARNING, FutureWarning)
                result = df.mapInArrow(writer.arrow, RESULT_SCHEMA)
            written = {int(r.part): int(r.entries) for r in result.collect()}
        else:
            written = dict(df.rdd.mapPartitionsWithIndex(writer.rows).collect())
    except BaseException:
        # A task of a failed job may still be writing: let it end before deciding.
        _wait_for_tasks(spark, group)
        raise
    finally:
        monitor.done.set()
        monitor.join()
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
    wrote = time.monotonic()
    total = sum(written.values())
    drop_other_parts(store, snapshot_id, written)
    # Each part holds seqs 0..n-1 exactly (written, then its tail deleted), so one index
    # probe per part finds any entry left over, without counting a million rows twice.
    found = rows_committed(store, snapshot_id, max(written, default=-1) + 1)
    if found != total:
        raise SnapshotError(
            f"snapshot {snapshot_id}: {found} entries in the queue, the partitions wrote {total}"
        )
    count = store.snapshot_entries.finish_snapshot(snapshot_id)  # counts, writes the end marker
    if count != total:  # cannot happen unless something else writes this snapshot
        why = f"end marker counted {count}, job wrote {total}"
        store.snapshots.cancel_snapshot(snapshot_id, why)
        raise SnapshotError(f"snapshot {snapshot_id}: counted {count}, the job wrote {total}")
    done = time.monotonic()
    log.info(
        "snapshot %s: %d entries from %d partitions in %.1fs (%.0f rows/s; end marker %.2fs)",
        snapshot_id,
        count,
        len(written),
        done - started,
        count / (done - started) if done > started else 0.0,
        done - wrote,
    )
    return count


# -- command line ------------------------------------------------------------------------------


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
        encoder = _resolve_encoder(args.encoder)  # fail on a bad name before starting Spark
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
        _after_failure(store, snapshot_id, exc, mark_failed=True)  # not left RUNNING
        result.update(status="failed", error=_summary(exc))
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
        result.update(status="failed", error=_summary(exc))
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
