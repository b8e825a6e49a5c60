"""bench/lanes.py runs end to end on SQLite and writes the JSON it documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.kit.wait import scaled

ROOT = Path(__file__).resolve().parents[2]


def test_lanes_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "lanes.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "lanes.py"),
            "--entries=300",
            "--streams=1,2",
            "--rtt-ms=10",
            "--repeat=2",
            f"--out={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"1", "2"}
    assert data["results"]["1"]["speedup"] == 1.0
    for result in data["results"].values():
        assert result["rate"] > 0
        assert len(result["runs"]) == 2 and min(result["runs"]) <= result["rate"]
    assert data["args"]["rtt_ms"] == 10.0
