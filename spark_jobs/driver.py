"""The snapshot job on the driver: any DataFrame becomes one snapshot's entries.

Every partition writes its rows, encoded, as entries of ``LRQ_Send_SnapSync``
from the executors, in parallel and idempotently (see :mod:`spark_jobs.writer`);
once every partition has committed, the driver writes the end marker with the
entry count and the snapshot becomes READY for the sender session. While it
runs, the driver records progress (rows written) in the request, where
``lr status`` shows it, and stops the job if the request is cancelled or
superseded. Its command line is :mod:`spark_jobs.snapshot_job`.

The executors import ``lr_client`` and ``spark_jobs``: on a cluster, install
the package (``pip install 'lr-routing-queue[spark,postgres]'``) on every node
or ship it with ``--py-files``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from lr_client import errors as lr_errors
from lr_client.errors import ConfigError, LRError, SnapshotError
from lr_client.records import SnapshotStatus
from lr_client.snapshot import wait_for_base
from lr_client.store import create_engine, open_store
from spark_jobs.encoders import Encoder, arrow_compatible, json_encoder, load_encoder
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

#: The job's logger (its command line's too).
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


def resolve_encoder(encoder: Encoder | str | None) -> Encoder | None:
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


def error_summary(exc: BaseException) -> str:
    """A failure in one line: the last error Spark's message names, else its first line."""
    text = str(exc)
    found = re.findall(r"^\s*(\w+(?:\.\w+)*(?:Error|Exception)): ([^\n]+)$", text, re.M)
    if found:
        return f"{found[-1][0]}: {found[-1][1]}"[:300]
    return (text.strip().splitlines() or [type(exc).__name__])[0][:300]


def after_failure(
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
        reason = f"snapshot job failed: {mapped or error_summary(exc)}"[:500]
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
    return SnapshotError(f"snapshot {snapshot_id}: job failed: {error_summary(exc)}")


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
    enc = resolve_encoder(encoder)
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
            err = after_failure(store, snapshot_id, exc, mark_failed)
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


__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "PATHS",
    "after_failure",
    "error_summary",
    "resolve_encoder",
    "run_snapshot_job",
]
