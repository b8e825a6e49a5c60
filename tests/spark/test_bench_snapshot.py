"""bench/snapshot.py runs end to end (small) and writes the JSON it documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.wait import scaled
from tests.spark.conftest import require_spark

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_snapshot_bench_sqlite_smoke(tmp_path: Path) -> None:
    require_spark()
    out = tmp_path / "snapshot.json"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "snapshot.py"),
            "--rows",
            "3000",
            "--backend",
            "sqlite",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout
    data = json.loads(out.read_text())
    assert data["rows"] == 3000 and 150 <= data["payload_bytes"] <= 250
    cases = data["results"]["sqlite"]
    assert set(cases) == {"job", "job-rdd", "plain-insert"}
    assert all(c["rows_per_second"] > 0 for c in cases.values())
    delivered = data["delivery"]["sqlite"]  # the snapshot reached the listener, every row
    assert delivered["rows"] == 3000 and delivered["rows_per_second"] > 0
    assert delivered["listener_rows_per_second"] >= delivered["rows_per_second"]
    assert delivered["row_bytes"] == 1024
    assert set(delivered["cpu_us_per_row"]) == {"ship", "receive", "deliver"}
    assert all(v > 0 for v in delivered["cpu_us_per_row"].values())
    ready, peak, end = delivered["rss_mib"]["subscriber"]
    assert 0 < ready <= peak and end <= peak
