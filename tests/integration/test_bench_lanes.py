"""bench/lanes.py runs end to end on SQLite (its `lr server` processes real) and writes
the JSON it documents; in the test's process, one run per stream count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import lanes


def test_lanes_bench_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "lanes.json"
    monkeypatch.chdir(tmp_path)
    args = ["--entries=300", "--streams=1,2", "--rtt-ms=10", "--repeat=1", f"--out={out}"]
    assert lanes.main(args) == 0
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"1", "2"}
    assert data["results"]["1"]["speedup"] == 1.0
    for result in data["results"].values():
        assert result["rate"] > 0 and result["runs"] == [result["rate"]]
    two = data["results"]["2"]
    assert two["speedup"] == pytest.approx(two["rate"] / data["results"]["1"]["rate"])
    assert data["args"]["rtt_ms"] == 10.0
