"""bench/snapshot.py --shared-rows runs end to end on SQLite and writes the JSON it documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.kit.wait import scaled

ROOT = Path(__file__).resolve().parents[2]


def test_shared_snapshot_bench_sqlite_smoke(tmp_path: Path) -> None:
    out = tmp_path / "shared.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "snapshot.py"),
            "--shared-rows",
            "300",
            "--backend",
            "sqlite",
            "--shared-out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Shared snapshots: 1 vs 5 destinations" in proc.stdout
    data = json.loads(out.read_text())
    got = data["results"]["sqlite"]
    # One snapshot, one job and one copy of the rows (and its end marker), whatever
    # the number of destinations.
    for n in ("1", "5"):
        assert (got[n]["snapshots"], got[n]["jobs"], got[n]["rows"]) == (1, 1, 301)
        assert got[n]["bytes"] > 0
    assert got["storage_ratio"] == round(got["5"]["bytes"] / got["1"]["bytes"], 3)
