"""``lr server`` launches the PySpark job itself when a client's full sync is requested.

On SQLite only: the launch does not depend on the backend, and a job process
writing to PostgreSQL is ``test_cluster.py``'s ``spark-submit`` test (each run
here costs a Spark application of its own).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest

from lr_client.records import SnapshotStatus
from tests.kit.sites import Sites, wait_for
from tests.spark.conftest import ROOT, require_spark

# How a stopped site's calls end is not what is tested here.
pytestmark = [
    pytest.mark.stop_calls_at_once,
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
]


def test_first_contact_runs_the_spark_job(
    sites: Sites, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_spark()
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    data = tmp_path / "policies.csv"
    with data.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "value"])
        w.writerows([[f"k{i}", str(i)] for i in range(250)])
    options = f'spark_source = "csv:{data}"\nspark_master = "local[2]"\n' + (
        'spark_options = { "spark.ui.enabled" = "false", "spark.ui.showConsoleProgress" = "false" }'
    )
    sites.start("b", sources=["a"])
    src = sites.store("a")
    sites.start("a", dests=["b"], snapshot="spark", client_options=options)
    sink = sites.store("b")

    def snapshot_done() -> bool:
        snaps = src.snapshots.list_snapshots("b", "policy")
        return bool(snaps) and snaps[0].status is SnapshotStatus.COMPLETED

    wait_for(snapshot_done, timeout=240)
    (queue,) = sink.queues.list_queues("policy")
    with sink.read() as conn:
        entries = sink.queues.read_queue(conn, queue.queue_id, 1000)
    rows = sorted(json.loads(e.payload)["key"] for e in entries[:-1])
    assert rows == sorted(f"k{i}" for i in range(250))
    assert int(entries[-1].snapshot_count) == 250
