"""``python -m bench.soak`` runs end to end for a few seconds and writes sensible JSON.

It starts real ``lr server`` processes (a source and two sinks) and two subscriber
processes; the figures themselves are not checked (no speed is asserted), only that every
sample measured what the benchmark promises and that every entry sent was applied.
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

PROCESSES = {
    "lr server src-soak",
    "lr server sink-1",
    "lr server sink-2",
    "bench (transmitter)",
    "subscriber sink-1",
    "subscriber sink-2",
}


def run_soak(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out, svg = tmp_path / "soak.json", tmp_path / "soak.svg"
    cmd = [
        sys.executable,
        "-m",
        "bench.soak",
        "--minutes",
        "0.1",
        "--sample-seconds",
        "2",
        "--out",
        str(out),
        "--svg",
        str(svg),
        *extra,
    ]
    env = lr_env() | {"LR_BENCH_PG_URL": PG_URL}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(300)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Targets," in proc.stdout and "shorter than 10 minutes" in proc.stdout
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<polyline") >= 4
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "soak" and data["settings"]["destinations"] == 2
    (run,) = data["runs"]
    return run


def check_run(run: dict[str, Any]) -> None:
    samples = run["samples"]
    assert [s["index"] for s in samples] == [0, 1, 2]  # 6 s in 2 s periods
    assert [s["end_s"] for s in samples] == pytest.approx([2.0, 4.0, 6.0])
    totals = run["totals"]
    assert totals["transmitted"] > 0
    assert totals["transmitted"] == sum(s["transmitted"] for s in samples)
    assert totals["applied"] == {"sink-1": totals["transmitted"], "sink-2": totals["transmitted"]}
    assert totals["undelivered"] == 0 and totals["transmit_errors"] == 0
    for s in samples:
        assert s["transmitted_per_s"] == pytest.approx(s["transmitted"] / 2.0)
        assert set(s["applied_per_s"]) == {"sink-1", "sink-2"}
        lat = s["latency_ms"]
        if lat["entries"]:
            assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
        assert set(s["rss_bytes"]) == PROCESSES
        assert all(v > 10 * 1024 * 1024 for v in s["rss_bytes"].values()), s["rss_bytes"]
        assert set(s["tables"]) == {"src-soak", "sink-1", "sink-2"}
        assert s["send_queue_bytes"] > 0 and s["recv_queue_bytes"] > 0
        # The replication's CPU is counted, cumulatively, and priced per entry sent.
        assert s["cpu_used_s"] > 0 and s["cpu_seconds"] >= s["cpu_used_s"]
        if s["transmitted"]:
            assert s["cpu_ms_per_entry"] == pytest.approx(1000 * s["cpu_used_s"] / s["transmitted"])
    assert [s["cpu_seconds"] for s in samples] == sorted(s["cpu_seconds"] for s in samples)
    assert sum(s["latency_ms"]["entries"] for s in samples) == 2 * totals["transmitted"]
    t = run["targets"]
    # A busy machine may stall a 2 s window: each figure is computed, not necessarily > 0.
    early, late = t["throughput"]["early"], t["throughput"]["late"]
    assert early is not None and late is not None and early + late > 0
    if early > 0:
        assert t["throughput"]["ratio"] == pytest.approx(late / early)
    p99 = [v for v in (t["p99"]["early_ms"], t["p99"]["late_ms"]) if v is not None]
    assert p99 and all(v > 0 for v in p99)
    eff = t["cpu_efficiency"]
    if eff["early_ms_per_entry"] and eff["late_ms_per_entry"]:
        assert eff["ratio"] == pytest.approx(eff["early_ms_per_entry"] / eff["late_ms_per_entry"])
    else:  # a window with nothing sent has no price per entry
        assert eff["ratio"] is None
    assert {f"rss_bytes.{p}" for p in PROCESSES} <= set(t["flat"])


def test_soak_sqlite_probes_the_rate_and_samples_files(tmp_path: Path) -> None:
    run = run_soak(tmp_path, "--backend", "sqlite", "--probe-seconds", "1")
    check_run(run)
    assert run["backend"] == "sqlite" and run["long_transaction"] is False
    probe = run["probe"]
    assert probe["entries"] > 0 and probe["end_to_end_rate"] > 0
    assert run["rate"] == pytest.approx(0.7 * probe["end_to_end_rate"])
    for s in run["samples"]:
        assert s["send_dead_tuples"] is None  # SQLite has none to count
        files = s["files"]["src-soak"]
        assert files["db_bytes"] > 0 and files["page_size"] > 0
        assert s["source_file_bytes"] == files["db_bytes"] + files["wal_bytes"]


def test_soak_postgresql_with_a_long_transaction_counts_dead_tuples(tmp_path: Path) -> None:
    require_pg()
    run = run_soak(tmp_path, "--backend", "postgresql", "--rate", "60", "--long-transaction")
    check_run(run)
    assert run["backend"] == "postgresql" and run["long_transaction"] is True
    assert run["rate"] == 60 and run["probe"] == {}
    held = run["held_session"]
    assert held["idle_in_transaction_session_timeout"] == "0"
    assert held["still_idle_in_transaction_at_end"] is True
    ages = [s["long_transaction"]["xid_age"] for s in run["samples"]]
    assert ages == sorted(ages) and ages[-1] > ages[0] > 0  # every commit since ages it
    for s in run["samples"]:
        assert s["long_transaction"]["state"] == "idle in transaction"
        for site in ("src-soak", "sink-1", "sink-2"):
            for table, stats in s["tables"][site].items():
                assert isinstance(stats["dead"], int) and isinstance(stats["live"], int), table
        assert isinstance(s["send_dead_tuples"], int) and isinstance(s["recv_dead_tuples"], int)
        assert "lrq_send_entries" in s["tables"]["src-soak"]
