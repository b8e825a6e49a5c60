"""``bench/snapshot.py``'s case figures, table and JSON, from measured times and deliveries.

The benchmark times the PySpark snapshot job against its references and the delivery of
its snapshot through real ``lr server`` processes; this test feeds the code that turns
those times and the delivery's figures into its table and its JSON, in this process. The
snapshot job itself is proven by the other tests of tests/spark; the benchmarks' wiring
with real servers by tests/integration/test_bench_lanes.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.common import write_json
from bench.snapshot import case_summary, snapshot_data, snapshot_report

ROWS = 3000


def test_snapshot_bench_sqlite_smoke(tmp_path: Path) -> None:
    out = tmp_path / "snapshot.json"
    args = argparse.Namespace(rows=ROWS, partitions=2, master="local[2]", out=out)
    times = {"job": [0.5, 0.4, 0.6], "job-rdd": [0.75], "plain-insert": [1.0, 1.5]}
    results = {"sqlite": {name: case_summary(ROWS, t, [1.0] * len(t)) for name, t in times.items()}}
    delivery: dict[str, Any] = {
        "seconds": 0.3,
        "rows_per_second": 10_000,
        "listener_rows_per_second": 12_000,
        "cpu_seconds": {"ship": 0.03, "receive": 0.06, "deliver": 0.09},
        "cpu_us_per_row": {"ship": 10.0, "receive": 20.0, "deliver": 30.0},
        "rss_mib": {"subscriber": [80, 95, 90]},
        "rows": ROWS,
        "row_bytes": 1024,
        "loadavg_after": 1.0,
    }
    console = Console(record=True, width=200)
    snapshot_report(console, args, 200, results, {"sqlite": delivery})
    facts = {"spark": "4.0", "master": "local[2]"}
    write_json(out, snapshot_data(args, facts, 200, results, {"sqlite": delivery}))

    data = json.loads(out.read_text())
    assert data["benchmark"] == "snapshot" and data["partitions"] == 2
    assert data["rows"] == ROWS and data["payload_bytes"] == 200 and data["facts"] == facts
    cases = data["results"]["sqlite"]
    assert set(cases) == {"job", "job-rdd", "plain-insert"}
    # Each case's median over its rounds, its best, and every run.
    assert cases["job"] == {
        "seconds": 0.5,
        "rows_per_second": 6000,
        "best_rows_per_second": 7500,
        "runs": [0.5, 0.4, 0.6],
        "loadavg_after_runs": [1.0, 1.0, 1.0],
    }
    assert (
        cases["plain-insert"]["seconds"] == 1.25
        and cases["plain-insert"]["rows_per_second"] == 2400
    )
    assert all(c["rows_per_second"] > 0 for c in cases.values())
    delivered = data["delivery"]["sqlite"]  # the snapshot reached the listener, every row
    assert delivered == delivery

    shown = console.export_text()
    assert f"Snapshot job, {ROWS:,} rows of ~200 bytes, local[2]" in shown
    assert "2.50x" in shown  # job / plain-insert: 6,000 / 2,400 rows/s
    assert "Snapshot delivery" in shown and "80/95/90" in shown
