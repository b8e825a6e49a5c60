"""``bench/replicate.py`` runs end to end at a tiny size and writes sensible JSON.

It starts real ``lr server`` processes (two sinks and a source per cell) on SQLite;
the figures themselves are not checked, only that every cell measured something.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kit.procs import ROOT, lr_env
from tests.kit.wait import scaled

pytestmark = pytest.mark.slow


def test_replicate_benchmark_writes_positive_rates(tmp_path: Path) -> None:
    out, svg = tmp_path / "replicate.json", tmp_path / "queue.svg"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "replicate.py"),
        "--backend",
        "sqlite",
        "--seconds",
        "0.5",
        "--entries",
        "1000",
        "--rate",
        "200",
        "--entries-per-txn",
        "2",
        "--writers",
        "3",
        "--idle-transaction",
        "--destinations",
        "2",
        "--rounds",
        "1",
        "--out",
        str(out),
        "--svg",
        str(svg),
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=lr_env(), capture_output=True, text=True, timeout=scaled(60)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["settings"]["paced_entries_per_txn"] == 2
    assert data["settings"]["paced_writers"] == 3
    sqlite = data["results"]["sqlite"]
    assert sqlite["baseline"]["rate"] > 0
    cells = sqlite["throughput"]
    assert [(c["destinations"], c["stalled"]) for c in cells] == [(1, 0), (2, 0), (2, 1)]
    for cell in cells:
        assert cell["complete"], cell
        assert cell["aggregate_rate"] > 0
        healthy = cell["destinations"] - cell["stalled"]
        assert len(cell["per_destination"]) == healthy
        assert all(d["entries"] == 1000 and d["rate"] > 0 for d in cell["per_destination"])
    stalled = cells[2]
    assert stalled["send_queue_after"] == 1000  # the stalled destination acked nothing
    shapes = [(c["destinations"], c["stalled"], c["idle_transaction"]) for c in sqlite["latency"]]
    assert shapes == [(1, 0, False), (1, 0, True), (2, 0, False), (2, 1, False)]
    for cell in sqlite["latency"]:
        assert cell["complete"], cell
        assert cell["writers"] == 3
        assert cell["achieved_rate"] > 0 and 0 < cell["transmitted"] <= 100  # 200/s, 0.5 s
        assert cell["transmitted"] % 2 == 0  # two entries per transaction
        assert cell["pooled"]["entries"] > 0
        assert 0 < cell["pooled"]["p50_ms"] <= cell["pooled"]["p99_ms"]
        assert cell["send_queue"], "the send queue was sampled"
    assert data["ratios"]["sqlite"]["one_dest_vs_baseline"] > 0
    assert svg.read_text().startswith("<svg") and "<polyline" in svg.read_text()
