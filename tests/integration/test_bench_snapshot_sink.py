"""bench/snapshot.py --sink-rows runs end to end on both backends and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.snapshot import main as snap_main
from tests.conftest import PG_URL


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_sink_delivery_bench_smoke(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LR_BENCH_PG_URL", PG_URL)
    out = tmp_path / "sink.json"
    code = snap_main(
        [
            "--sink-rows",
            "2500",
            "--deliver-row-bytes",
            "512",
            "--backend",
            backend,
            "--cprofile",
            "--sink-batch",
            "1000",
            "--sink-out",
            str(out),
        ]
    )
    assert code == 0
    (run,) = json.loads(out.read_text())["results"][backend]
    assert (run["rows"], run["row_bytes"]) == (2500, 512)  # every row reached the listener
    assert (run["snapshot_batch_size"], run["batch_max_bytes"]) == (1000, 1000 * (512 + 64))
    assert run["rows_per_second"] > 0 and run["cpu_us_per_row"]["deliver"] > 0
    assert ("database" in run["cpu_us_per_row"]) == (backend == "postgresql")
    assert run["cprofile_self_seconds"]
