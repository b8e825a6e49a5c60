"""bench/snapshot.py --shared-rows runs end to end on SQLite and writes the JSON it documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.snapshot import main as snap_main


def test_shared_snapshot_bench_sqlite_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "shared.json"
    code = snap_main(
        [
            "--shared-rows",
            "300",
            "--backend",
            "sqlite",
            "--shared-out",
            str(out),
        ]
    )
    assert code == 0
    assert "Shared snapshots: 1 vs 5 destinations" in capsys.readouterr().out
    data = json.loads(out.read_text())
    got = data["results"]["sqlite"]
    # One snapshot, one job and one copy of the rows (and its end marker), whatever
    # the number of destinations.
    for n in ("1", "5"):
        assert (got[n]["snapshots"], got[n]["jobs"], got[n]["rows"]) == (1, 1, 301)
        assert got[n]["bytes"] > 0
    assert got["storage_ratio"] == round(got["5"]["bytes"] / got["1"]["bytes"], 3)
