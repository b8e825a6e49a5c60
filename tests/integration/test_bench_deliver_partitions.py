"""bench/deliver_partitions.py runs end to end on SQLite and writes the JSON it documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.deliver_partitions import main as dp_main


def test_deliver_partitions_bench_sqlite_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "deliver_partitions.json"
    code = dp_main(
        [
            "--backend=sqlite",
            "--entries=200",
            "--partitions=1,4",
            "--sleep-ms=1",
            f"--out={out}",
        ]
    )
    assert code == 0
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
