"""bench/snapshot.py --sink-rows runs end to end on both backends and writes its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_URL
from tests.kit.wait import scaled

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_sink_delivery_bench_smoke(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "sink.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "snapshot.py"),
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
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, "LR_BENCH_PG_URL": PG_URL},
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["results"][backend]
    assert (run["rows"], run["row_bytes"]) == (2500, 512)  # every row reached the listener
    assert (run["snapshot_batch_size"], run["batch_max_bytes"]) == (1000, 1000 * (512 + 64))
    assert run["rows_per_second"] > 0 and run["cpu_us_per_row"]["deliver"] > 0
    assert ("database" in run["cpu_us_per_row"]) == (backend == "postgresql")
    assert run["cprofile_self_seconds"]
