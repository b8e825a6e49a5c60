"""``bench/relay.py`` runs end to end at a tiny size and writes sensible JSON.

It starts the four ``lr server`` processes of a cascade (root, branch, two leaves) on
SQLite; the figures themselves are not checked, only that both paths measured something.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kit.procs import ROOT, lr_env
from tests.kit.wait import scaled

pytestmark = pytest.mark.slow


def test_relay_benchmark_compares_both_paths_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "relay.json"
    cmd = [sys.executable, str(ROOT / "bench" / "relay.py"), "--backend", "sqlite"]
    cmd += [
        "--rate",
        "200",
        "--seconds",
        "1",
        "--entries",
        "1000",
        "--writers",
        "2",
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=lr_env(), capture_output=True, text=True, timeout=scaled(120)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "relay hop adds" in proc.stdout
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "relay" and data["backend"] == "sqlite"
    assert data["settings"]["tree"] == {"branch": "root", "direct": "root", "relayed": "branch"}
    lat = data["latency"]
    assert lat["complete"] and lat["offered_rate"] == 200
    assert 0 < lat["transmitted"] <= 200 and lat["achieved_rate"] > 0
    for leaf in ("direct", "relayed"):
        assert lat[leaf]["entries"] > 0
        assert 0 < lat[leaf]["p50_ms"] <= lat[leaf]["p99_ms"] <= lat[leaf]["max_ms"]
    assert lat["hop_p99_ms"] == pytest.approx(
        lat["relayed"]["p99_ms"] - lat["direct"]["p99_ms"], abs=0.01
    )
    # The run's noise: the branch's own listener against the direct leaf, one hop each.
    assert lat["branch"]["entries"] > 0
    assert lat["one_hop_spread_p99_ms"] == pytest.approx(
        lat["branch"]["p99_ms"] - lat["direct"]["p99_ms"], abs=0.01
    )
    assert lat["one_hop_spread_p50_ms"] == pytest.approx(
        lat["branch"]["p50_ms"] - lat["direct"]["p50_ms"], abs=0.01
    )
    assert data["ratios"]["one_hop_spread_p99_ms"] == lat["one_hop_spread_p99_ms"]
    assert "one-hop spread" in proc.stdout
    # Per entry: the same entries' relayed - direct latency, its quantiles in order.
    hop = lat["per_entry_hop_ms"]
    assert list(hop) == ["p10", "p50", "p90", "p99"]
    assert hop["p10"] <= hop["p50"] <= hop["p90"] <= hop["p99"]
    assert "per entry, relayed - direct" in proc.stdout
    # Where the time goes: every node stored what the load sent, the sessions were acked.
    stages = lat["stages"]
    for stage in ("stored at branch", "stored at direct", "stored at relayed"):
        assert stages[stage]["observations"] >= lat["transmitted"]
        st = stages[stage]
        assert st["mean_ms"] > 0 and st["p50_ms"] <= st["p99_ms"]
    for stage in ("ack root -> branch", "ack root -> direct", "ack branch -> relayed"):
        assert stages[stage]["observations"] > 0
    assert 0 < lat["machine_cpu_busy"] <= 1 and lat["wall_seconds"] > 0
    # The listeners ran in processes of their own, which used CPU.
    for node in ("branch", "direct", "relayed"):
        assert lat["cpu_seconds"][f"listener {node}"] > 0
    thr = data["throughput"]
    assert thr["entries"] == 1000 and data["settings"]["writers"] == 2
    assert thr["direct_rate"] > 0 and thr["relayed_rate"] > 0
    assert thr["ratio"] == pytest.approx(thr["relayed_rate"] / thr["direct_rate"], rel=0.01)
    assert data["ratios"]["relayed_vs_direct_throughput"] == thr["ratio"]
    assert set(data["targets"]) == {
        "hop_p99_ms_at_most",
        "throughput_ratio_at_least",
        "hop_p99_met",
        "throughput_met",
    }
    assert len(data["machine"]["loadavg_at_start"]) == 3
