"""The PySpark snapshot job, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lr_client.errors import ConfigError, InvalidPayloadError, SnapshotError
from lr_client.records import ReplicationType, SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.receiving.receiver import Receiver
from spark_jobs.encoders import json_encoder
from spark_jobs.snapshot_job import run_snapshot_job
from spark_jobs.sources import load_dataframe, parse_source
from spark_jobs.writer import open_sink, rows_committed
from tests.kit.guards import need
from tests.kit.relayed import TakesAll, from_root
from tests.kit.wait import join, wait_for
from tests.spark.conftest import require_spark

pytestmark = pytest.mark.spark


@pytest.fixture
def site(db_url: str) -> Iterator[tuple[str, SQLAlchemyQueueStore]]:
    st = open_store(create_engine(db_url))
    st.create_schema()
    yield db_url, st
    st.engine.dispose()


@pytest.fixture
def sqlite_site(sqlite_url: str) -> Iterator[tuple[str, SQLAlchemyQueueStore]]:
    st = open_store(create_engine(sqlite_url))
    st.create_schema()
    yield sqlite_url, st
    st.engine.dispose()


def _running(store: SQLAlchemyQueueStore, destination: str = "b") -> str:
    sid = store.snapshots.request_snapshot(None, destination, "policy", "test")
    assert store.snapshots.start_snapshot(sid) is not None
    return sid


def _payloads(store: SQLAlchemyQueueStore, snapshot_id: str) -> list[bytes]:
    """Entries of a READY snapshot; checks the end marker holds their count."""
    entries = store.snapshot_entries.read_snapshot_entries(snapshot_id, 0, 10_000_000)
    assert entries, "a READY snapshot has at least its end marker"
    *rows, end = entries
    assert end.type == ReplicationType.LAST_FULL_SYNC_ENTRY
    assert all(e.type == ReplicationType.SNAPSHOT_SYNC for e in rows)
    assert end.payload == str(len(rows)).encode()
    return [e.payload for e in rows]


def _status(store: SQLAlchemyQueueStore, snapshot_id: str) -> SnapshotStatus:
    req = store.snapshots.get_snapshot(snapshot_id)
    assert req is not None
    return req.status


def test_rows_land_with_the_count_in_the_end_marker(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore]
) -> None:
    url, store = site
    sid = _running(store)
    df = spark.range(0, 1000, numPartitions=3).selectExpr("id", "concat('row-', id) AS name")
    assert run_snapshot_job(spark, url, sid, df, chunk_rows=64) == 1000
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.READY
    assert req.entry_count == 1000 and req.rows_written == 1000
    got = sorted((json.loads(p) for p in _payloads(store, sid)), key=lambda d: d["id"])
    assert got == [{"id": i, "name": f"row-{i}"} for i in range(1000)]


@pytest.mark.parametrize("path", ["arrow", "rdd"])
def test_a_task_failing_once_is_retried_without_duplicates(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore], tmp_path: Path, path: str
) -> None:
    url, store = site
    sid = _running(store)
    marker = tmp_path / "failed-once"
    # Partition 1 holds ids 200..399; it fails at 350, after three chunks of 50 committed.
    df = spark.range(0, 600, numPartitions=3).selectExpr(
        "id", f"'{marker}' AS marker", "350 AS fail_at"
    )
    count = run_snapshot_job(
        spark, url, sid, df, "tests.spark.helpers:flaky_encoder", chunk_rows=50, path=path
    )
    assert marker.exists(), "the first attempt of partition 1 must have failed"
    assert count == 600
    payloads = _payloads(store, sid)
    assert sorted(int(p) for p in payloads) == list(range(600))  # once each


def test_rerunning_the_job_never_duplicates(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore]
) -> None:
    url, store = site
    sid = _running(store)
    df = spark.range(0, 300, numPartitions=3).selectExpr("id", "150 AS fail_at")
    # A first run dies midway (partition 1 fails every attempt) and is left RUNNING.
    with pytest.raises(SnapshotError, match="partition 1 always fails"):
        run_snapshot_job(
            spark,
            url,
            sid,
            df,
            "tests.spark.helpers:always_failing_encoder",
            chunk_rows=20,
            mark_failed=False,
        )
    assert _status(store, sid) == SnapshotStatus.RUNNING
    partial = store.snapshot_entries.count_snapshot_entries(sid)
    assert 100 + 40 <= partial < 300  # parts 0 (and maybe 2) whole, two chunks of part 1
    assert rows_committed(store, sid, 3) == partial  # what the progress thread reports
    # The re-run uses another partitioning: stale parts of the first run must go.
    again = df.repartition(2, "id")
    assert run_snapshot_job(spark, url, sid, again, "tests.spark.helpers:id_encoder") == 300
    assert sorted(int(p) for p in _payloads(store, sid)) == list(range(300))
    # A READY snapshot is not rewritten.
    with pytest.raises(SnapshotError, match="not running"):
        run_snapshot_job(spark, url, sid, df, "tests.spark.helpers:id_encoder")
    assert store.snapshot_entries.count_snapshot_entries(sid) == 300


def test_zero_rows(spark: Any, site: tuple[str, SQLAlchemyQueueStore]) -> None:
    url, store = site
    sid = _running(store)
    assert run_snapshot_job(spark, url, sid, spark.range(0)) == 0
    assert _payloads(store, sid) == []
    sid = _running(store)
    empty_parts = spark.range(0, 10, numPartitions=2).where("id < 0")
    assert run_snapshot_job(spark, url, sid, empty_parts, path="rdd") == 0
    assert _payloads(store, sid) == []
    assert _status(store, sid) == SnapshotStatus.READY


def test_a_superseded_snapshot_stops_the_job_and_keeps_nothing(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore], tmp_path: Path
) -> None:
    """Through the store's inserts, which encode a chunk before its transaction: the test
    supersedes while the encoders wait. (A COPY chunk encodes inside its transaction, which
    holds the request's row lock, so a supersede waits for the chunk to commit; the COPY
    sink's own check is ``test_a_copy_chunk_after_a_supersede_writes_nothing``.)"""
    url, store = site
    sid = _running(store)
    gate = tmp_path / "gate"
    # Each partition commits 4 chunks of 25 rows, then blocks until the gate opens:
    # the job cannot end before the test has superseded its snapshot.
    df = spark.range(0, 4000, numPartitions=2).selectExpr(
        "id", f"'{gate}' AS gate", "100 AS gate_at"
    )
    newer: list[str] = []
    progress: list[int] = []

    def written() -> int:
        req = store.snapshots.get_snapshot(sid)
        return req.rows_written if req is not None else 0

    def supersede() -> None:
        try:
            progress.append(wait_for(written, 120, what="the job's progress recorded"))
            newer.append(store.snapshots.request_snapshot(None, "b", "policy", "operator"))
        finally:
            gate.touch()

    thread = threading.Thread(target=supersede)
    thread.start()
    try:
        with pytest.raises(SnapshotError, match="cancelled"):
            run_snapshot_job(
                spark,
                url,
                sid,
                df,
                "tests.spark.helpers:gated_encoder",
                chunk_rows=25,
                method="store",
                progress_interval=0.2,
            )
    finally:
        gate.touch()
        join(thread, 120)
    assert progress and 0 < progress[0] <= 200, "progress is recorded while the job runs"
    assert newer, "the snapshot was not superseded"
    assert _status(store, sid) == SnapshotStatus.CANCELLED
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    assert store.snapshot_entries.read_snapshot_entries(sid, 0, 100) == []
    assert _status(store, newer[0]) == SnapshotStatus.REQUESTED


@pytest.mark.postgres
def test_a_copy_chunk_after_a_supersede_writes_nothing(pg_schema: Any) -> None:
    store = open_store(pg_schema.engine())
    store.create_schema()
    sid = _running(store)
    sink = open_sink(pg_schema.url, sid, "copy")
    try:
        assert sink.write_part(0, iter([b"a", b"b", b"c"]), 2) == 3
        assert store.snapshot_entries.count_snapshot_entries(sid) == 3
        newer = store.snapshots.request_snapshot(None, "b", "policy", "operator")
        with pytest.raises(SnapshotError, match="cancelled, not running"):
            sink.write_part(1, iter([b"x", b"y", b"z"]), 2)
    finally:
        sink.close()
    assert store.snapshot_entries.read_snapshot_entries(sid, 0, 100) == []
    assert _status(store, sid) == SnapshotStatus.CANCELLED
    assert _status(store, newer) == SnapshotStatus.REQUESTED


def test_a_cancelled_snapshot_is_refused_up_front(
    spark: Any, sqlite_site: tuple[str, SQLAlchemyQueueStore]
) -> None:
    url, store = sqlite_site
    sid = _running(store)
    store.snapshots.cancel_snapshot(sid)
    with pytest.raises(SnapshotError, match="cancelled"):
        run_snapshot_job(spark, url, sid, spark.range(10))
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    requested = store.snapshots.request_snapshot(None, "c", "policy")
    with pytest.raises(SnapshotError, match="start"):
        run_snapshot_job(spark, url, requested, spark.range(10))
    assert run_snapshot_job(spark, url, requested, spark.range(10), start=True) == 10


def test_an_encoder_returning_str_fails_the_snapshot(
    spark: Any, sqlite_site: tuple[str, SQLAlchemyQueueStore]
) -> None:
    url, store = sqlite_site
    sid = _running(store)
    with pytest.raises(InvalidPayloadError, match="bytes"):
        run_snapshot_job(spark, url, sid, spark.range(10), "tests.spark.helpers:text_encoder")
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.FAILED
    assert "bytes" in req.reason
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0


def test_the_default_encoder() -> None:
    require_spark()
    from pyspark.sql import Row

    row = Row(b=1, a="é", d=datetime.date(2024, 5, 1), m=decimal.Decimal("1.50"), n=None)
    assert json_encoder(row) == '{"a":"é","b":1,"d":"2024-05-01","m":"1.50","n":null}'.encode()
    nested = Row(k=Row(y=2, x=[1, 2]), t=datetime.datetime(2024, 5, 1, 12, 0), raw=bytearray(b"\0"))
    assert json.loads(json_encoder(nested)) == {
        "k": {"x": [1, 2], "y": 2},
        "raw": "AA==",
        "t": "2024-05-01T12:00:00",
    }


def test_arrow_and_rdd_paths_encode_alike(
    spark: Any, sqlite_site: tuple[str, SQLAlchemyQueueStore]
) -> None:
    url, store = sqlite_site
    df = spark.createDataFrame(
        [
            (1, 2, 3.5, 0.25, "x", True, datetime.date(2020, 1, 2), decimal.Decimal("1.20"), [1]),
            (2, None, float("inf"), None, "ü\"'", False, None, None, []),
        ],
        "a long, b int, c double, f float, s string, t boolean, d date, m decimal(5,2),"
        " l array<int>",
    )
    got = {}
    for path in ("arrow", "rdd"):
        sid = _running(store, destination=f"site-{path}")
        run_snapshot_job(spark, url, sid, df.coalesce(1), path=path)
        got[path] = _payloads(store, sid)
    assert got["arrow"] == got["rdd"]
    assert got["rdd"] == [json_encoder(r) for r in df.coalesce(1).collect()]


def test_parquet_csv_and_callable_sources(
    spark: Any, sqlite_site: tuple[str, SQLAlchemyQueueStore], tmp_path: Path
) -> None:
    url, store = sqlite_site
    parquet = tmp_path / "policies.parquet"
    spark.range(0, 50, numPartitions=2).selectExpr("id", "id * 2 AS doubled").write.parquet(
        str(parquet)
    )
    sid = _running(store, "p")
    df = load_dataframe(spark, parse_source(f"parquet:{parquet}"))
    assert run_snapshot_job(spark, url, sid, df) == 50
    got = sorted((json.loads(p) for p in _payloads(store, sid)), key=lambda d: d["id"])
    assert got == [{"id": i, "doubled": 2 * i} for i in range(50)]

    path = tmp_path / "people.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "name"])
        out.writerows([[1, "ann"], [2, "bob, jr"]])
    sid = _running(store, "c")
    df = load_dataframe(spark, parse_source(f"csv:{path}"))
    assert run_snapshot_job(spark, url, sid, df) == 2
    assert sorted(json.loads(p)["name"] for p in _payloads(store, sid)) == ["ann", "bob, jr"]

    sid = _running(store, "f")
    df = load_dataframe(spark, parse_source("tests.spark.helpers:people"))
    assert run_snapshot_job(spark, url, sid, df) == 3


@pytest.mark.postgres
def test_postgresql_copy_and_store_methods_agree(
    spark: Any, pg_schema: Any, tmp_path: Path
) -> None:
    store = open_store(pg_schema.engine())
    store.create_schema()
    df = spark.range(0, 200, numPartitions=2).selectExpr("id", "repeat('x', 300) AS pad")
    got = {}
    for method in ("copy", "store"):
        sid = _running(store, destination=method)
        assert run_snapshot_job(spark, pg_schema.url, sid, df, method=method, chunk_rows=30) == 200
        got[method] = _payloads(store, sid)
    assert got["copy"] == got["store"]


@pytest.mark.postgres
def test_jdbc_source(spark: Any, pg_schema: Any) -> None:
    from tests.spark.conftest import POSTGRESQL_JAR

    need(POSTGRESQL_JAR.exists(), f"no PostgreSQL JDBC driver at {POSTGRESQL_JAR}")
    from sqlalchemy.engine import make_url

    engine = pg_schema.engine()
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE items (id bigint PRIMARY KEY, label text)")
        conn.exec_driver_sql(
            "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 40) g"
        )
    store = open_store(engine)
    store.create_schema()
    u = make_url(pg_schema.url)
    jdbc = (
        f"jdbc:postgresql://{u.host}:{u.port or 5432}/{u.database}"
        f"?user={u.username}&currentSchema={pg_schema.name}&table=items"
    )
    if u.password:
        jdbc += f"&password={u.password}"
    sid = _running(store)
    df = load_dataframe(spark, parse_source(jdbc))
    assert run_snapshot_job(spark, pg_schema.url, sid, df) == 40
    labels = sorted(json.loads(p)["label"] for p in _payloads(store, sid))
    assert labels == sorted(f"item {i}" for i in range(1, 41))


@pytest.mark.parametrize("path", ["arrow", "rdd"])
def test_a_key_column_gives_each_row_its_partition_key(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore], path: str
) -> None:
    url, store = site
    sid = _running(store)
    df = spark.range(0, 50, numPartitions=2).selectExpr(
        "id", "IF(id % 10 = 0, NULL, concat('k', id % 7)) AS region"
    )
    assert run_snapshot_job(spark, url, sid, df, key_column="region", path=path) == 50
    entries = store.snapshot_entries.read_snapshot_entries(sid, 0, 1000)[:-1]
    got = {json.loads(e.payload)["id"]: e.key for e in entries}
    assert got == {i: None if i % 10 == 0 else b"k%d" % (i % 7) for i in range(50)}
    other = _running(store, "c")
    with pytest.raises(ConfigError, match="not a column"):
        run_snapshot_job(spark, url, other, df, key_column="nope")


def test_at_a_branch_the_job_reads_only_once_the_branchs_application_has_the_base(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore]
) -> None:
    """The branch stored entries 1..3 its application has not applied: the job waits,
    keeping the snapshot alive and writing nothing, until the application has them."""
    url, store = site
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["b"])
    receiver = Receiver(store, "s3", ["s1"])
    for position in (1, 2, 3):
        receiver.apply("s1", from_root(position))
    sid = _running(store)
    started = store.snapshots.get_snapshot(sid)
    assert started is not None and started.base_position == 3
    df = spark.range(0, 10, numPartitions=1).selectExpr("id")
    counts: list[int] = []

    def job() -> None:
        counts.append(run_snapshot_job(spark, url, sid, df))

    beats = {started.updated_at}

    def beaten(times: int) -> bool:
        req = store.snapshots.get_snapshot(sid)
        assert req is not None and req.status is SnapshotStatus.RUNNING
        assert store.snapshot_entries.count_snapshot_entries(sid) == 0  # not read yet
        beats.add(req.updated_at)
        return len(beats) > times

    thread = threading.Thread(target=job)
    thread.start()
    try:
        wait_for(lambda: beaten(10), 120, what="the waiting job's heartbeats")
        assert thread.is_alive() and counts == []  # it cannot end before the application
        app = RoutingQueueSubscriber(store, "policy", TakesAll())
        assert app.poll_once() == 3
    finally:
        join(thread, 120)
    assert counts == [10]
    assert _status(store, sid) == SnapshotStatus.READY
