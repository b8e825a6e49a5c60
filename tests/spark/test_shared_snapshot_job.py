"""One PySpark job run serves a shared snapshot: every destination that joined it
gets every row exactly once (real gRPC between in-process sites, both backends)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from lr_client.records import OPEN_SNAPSHOT_STATUSES, SnapshotStatus
from lr_client.snapshot import SnapshotHeartbeat
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from spark_jobs.snapshot_job import run_snapshot_job
from tests.integration.test_full_sync import running, sink_app, source_app
from tests.kit import kvapp
from tests.kit.sites import Sites
from tests.kit.wait import wait_for

pytestmark = pytest.mark.spark

DESTS = ["b", "c", "d"]
ROWS = 300


def _joined(src: SQLAlchemyQueueStore) -> str | None:
    """The one open snapshot every destination joined, once they all have."""
    views = src.snapshots.list_snapshots(client_name="policy", statuses=OPEN_SNAPSHOT_STATUSES)
    ids = {v.snapshot_id for v in views}
    if len(ids) != 1 or sorted(v.destination for v in views) != DESTS:
        return None
    return ids.pop()


def _applied(sink: SQLAlchemyQueueStore) -> list[tuple[str, int]]:
    """(source, position) of every snapshot row the sink's listener committed."""
    a = kvapp.applied.c
    with sink.read() as conn:
        return [
            (r.source, r.position)
            for r in conn.execute(select(a.source, a.position).where(a.kind == "snapshot"))
        ]


def _stored(src: SQLAlchemyQueueStore) -> int:
    with src.read() as conn:
        return int(conn.execute(select(func.count()).select_from(s.send_snapsync)).scalar_one())


def test_one_job_run_serves_three_destinations_each_row_once(spark: Any, sites: Sites) -> None:
    src, client = source_app(sites, "a", DESTS)
    for i in range(0, ROWS, 50):  # the source's table, as its application wrote it
        kvapp.write(src.engine, client, {f"k{j}": j for j in range(i, i + 50)}, DESTS)
    sinks = {d: sink_app(sites, d) for d in DESTS}
    for d in DESTS:
        sites.start(d, sources=["a"])
    sites.start("a", dests=DESTS, snapshot="app")
    # Every destination asks on first contact and joins the same snapshot.
    sid = wait_for(lambda: _joined(src), timeout=60, what="one snapshot joined by b, c and d")
    assert src.snapshots.start_snapshot(sid) is not None  # the base is fixed: now read the rows
    table = kvapp.table(src.engine)
    with running(*(sinks[d][1] for d in DESTS)):
        # Heartbeats while the job runs, as `lr snapshot-job` sends them: a slow
        # JVM start is no stalled worker.
        with SnapshotHeartbeat(src, sid, interval=1.0):
            df = spark.createDataFrame(sorted(table.items()), "k string, v bigint")
            assert run_snapshot_job(spark, sites.url("a"), sid, df.repartition(2)) == ROWS
        for d in DESTS:
            wait_for(
                lambda d=d: (
                    len(_applied(sinks[d][0])) >= ROWS
                    and sid in sinks[d][2].full_syncs
                    and kvapp.table(sinks[d][0].engine) == table
                ),
                timeout=120,
                what=f"{d} applied the snapshot",
            )
    for d in DESTS:
        applied = _applied(sinks[d][0])
        assert len(applied) == ROWS and len(set(applied)) == ROWS  # every row, once
        assert set(sinks[d][2].full_syncs) == {sid} and sinks[d][2].errors == []
        wait_for(
            lambda d=d: src.snapshots.get_snapshot(sid, d).status is SnapshotStatus.COMPLETED,  # type: ignore[union-attr]
            timeout=60,
            what=f"{d}'s view completed",
        )
    snap = src.snapshots.get_snapshot(sid)
    assert snap is not None and snap.entry_count == ROWS  # written once for the three
    wait_for(lambda: _stored(src) == 0, timeout=60, what="the shared rows released")
