"""``bench/replicate.py --members`` runs end to end at a tiny size and writes sensible JSON.

It starts real ``lr server`` processes on PostgreSQL (two sinks; a source of one, then
two members, the second run with a kill -9); the figures are not checked, only that
every cell measured something and the failover was timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PG_URL, require_pg
from tests.kit.procs import ROOT, lr_env
from tests.kit.wait import scaled

pytestmark = pytest.mark.slow


def run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ROOT / "bench" / "replicate.py"), *args]
    env = lr_env() | {"LR_BENCH_PG_URL": PG_URL}
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(180)
    )


def test_members_benchmark_writes_a_cell_per_member_count(tmp_path: Path) -> None:
    require_pg()
    out = tmp_path / "members.json"
    proc = run(
        "--members", "1,2", "--seconds", "0.5", "--entries", "200", "--rate", "100",
        "--destinations", "2", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Source site of N members" in proc.stdout
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "replicate-members"
    assert data["settings"]["members"] == [1, 2]
    assert data["settings"]["lease_timeout"] == 5.0  # the default
    assert data["settings"]["failover_target_s"] == 6.0
    assert len(data["machine"]["loadavg_at_start"]) == 3 and len(data["loadavg_at_end"]) == 3
    cells = data["results"]
    assert [c["members"] for c in cells] == [1, 2]
    for cell in cells:
        assert cell["units"] == 3  # two streams and the trim job
        assert sorted(cell["streams_per_member"]) == [
            f"m-{i}" for i in range(1, cell["members"] + 1)
        ]
        assert sum(cell["streams_per_member"].values()) == 2
        assert cell["drain_complete"] and cell["aggregate_rate"] > 0
        assert cell["latency_complete"] and cell["achieved_rate"] > 0
        assert 0 < cell["pooled"]["p50_ms"] <= cell["pooled"]["p99_ms"]
        assert set(cell["per_destination_p99_ms"]) == {"sink-1", "sink-2"}
        db = cell["db"]
        assert sorted(db["connections_max"]) == sorted(cell["streams_per_member"])
        assert all(n >= 1 for n in db["connections_max"].values())  # each member's own
        assert db["seconds"] > 0 and db["members_row_writes_per_s"] > 0  # heartbeats
        assert db["lease_row_writes_per_s"] > 0 and db["members_scans_per_s"] > 0
    assert cells[0]["failover"] is None  # nobody to fail over to
    fo = cells[1]["failover"]
    assert fo["victim"] in ("m-1", "m-2") and fo["victim_streams"] >= 1
    assert fo["complete"]
    assert fo["units_owned_after_s"] > 0
    assert 0 < fo["first_delivery_s"] <= fo["all_resumed_s"]
    assert isinstance(fo["met"], bool)


def test_members_counts_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    # The argument checks of bench/replicate.py's own entry point, called in this process.
    from bench.replicate import main

    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            main(list(args))
        assert exit_.value.code == 2
        return capsys.readouterr().err

    for bad in ("0", "4", "1,x"):
        err = refused("--members", bad)
        assert "--members" in err, err
    err = refused("--members", "2", "--backend", "sqlite")
    assert "PostgreSQL" in err, err
