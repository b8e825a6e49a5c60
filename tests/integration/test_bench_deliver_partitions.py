"""bench/deliver_partitions.py runs end to end on SQLite and writes the JSON it documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.kit.wait import scaled

ROOT = Path(__file__).resolve().parents[2]


def test_deliver_partitions_bench_sqlite_smoke(tmp_path: Path) -> None:
    out = tmp_path / "deliver_partitions.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "deliver_partitions.py"),
            "--backend=sqlite",
            "--entries=200",
            "--partitions=1,4",
            "--sleep-ms=1",
            f"--out={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert set(data["results"]) == {
        "sqlite/io/1",
        "sqlite/io/4",
        "sqlite/insert/1",
        "sqlite/insert/4",
    }
    for result in data["results"].values():
        assert result["entries"] == 200 and result["rate"] > 0
    assert data["results"]["sqlite/io/1"]["speedup"] == 1.0
