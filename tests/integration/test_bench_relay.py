"""``bench/relay.py``'s figures, JSON and report, from measured inputs.

The benchmark runs four ``lr server`` processes of a cascade (root, branch, two leaves);
this test feeds the code that turns what it measured into its JSON and its report with
known measurements (commit times, the times each listener had each entry, the servers'
histograms), in this process, and checks each figure is computed from them. The
benchmarks' wiring with real servers is proven by tests/integration/test_bench_lanes.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench.common import machine_facts, write_json
from bench.relay import (
    STAGES,
    ServerHistogram,
    latency_result,
    parse_args,
    relay_data,
    report,
    throughput_result,
)

STARTED = 1_000.0
#: Each node's listener has entry i this many ms after its commit: one hop for the
#: branch and the direct leaf, two for the relayed leaf; i's own jitter on top.
DELAY_MS = {"direct": 2.0, "branch": 2.5, "relayed": 5.0}


def measured(n: int) -> tuple[list[tuple[int, float]], dict[str, dict[int, float]]]:
    commits = [(p, STARTED + 0.005 * p) for p in range(1, n + 1)]
    seen = {
        node: {p: at + (ms + (p % 7) * 0.1 * (1 + k)) / 1000.0 for p, at in commits}
        for k, (node, ms) in enumerate(DELAY_MS.items())
    }
    return commits, seen


def histogram(count: int, mean_s: float) -> ServerHistogram:
    half = count // 2
    return ServerHistogram(
        {0.001: 0.0, 0.005: float(half), 0.025: float(count), math.inf: float(count)},
        mean_s * count,
        float(count),
    )


def test_relay_benchmark_compares_both_paths_in_one_run(tmp_path: Path) -> None:
    out = str(tmp_path / "relay.json")
    args = parse_args(
        ["--backend", "sqlite", "--rate", "200", "--seconds", "1", "--entries", "1000",
         "--writers", "2", "--out", out]
    )  # fmt: skip
    commits, seen = measured(200)
    stages = {name: histogram(200, 0.004) for name, *_ in STAGES}
    cpu = {f"lr server {s}": 0.5 for s in ("root", "branch", "direct", "relayed")}
    cpu |= {f"listener {s}": 0.25 for s in ("branch", "direct", "relayed")}
    latency = latency_result(
        200.0, 199.96, commits, True, seen, STARTED, 1.0, stages,
        {"forwarded": 180.0, "stored": 20.0}, (150.0, 400.0), cpu, 1.5,
    )  # fmt: skip
    throughput = throughput_result(
        1000, 2000, {"direct": (10.0, 1001), "relayed": (10.1, 1001)},
        {"direct": 10.5, "relayed": 10.725},
    )  # fmt: skip
    facts = {"backend": "sqlite"}
    write_json(args.out, relay_data(args, machine_facts(), facts, latency, throughput))
    data: dict[str, Any] = json.loads(args.out.read_text())

    assert data["benchmark"] == "relay" and data["backend"] == "sqlite"
    assert data["settings"]["tree"] == {"branch": "root", "direct": "root", "relayed": "branch"}
    lat = data["latency"]
    assert lat["complete"] and lat["offered_rate"] == 200 and lat["achieved_rate"] == 200.0
    assert lat["transmitted"] == 200
    # The warm-up (a quarter of the 1 s load) is left out: commits 5 ms apart, from 0.25 s on.
    warm = [p for p, at in commits if at >= STARTED + 0.25]
    for node in ("direct", "relayed", "branch"):
        assert lat[node]["entries"] == len(warm)
        assert 0 < lat[node]["p50_ms"] <= lat[node]["p99_ms"] <= lat[node]["max_ms"]
        delays = [(seen[node][p] - at) * 1000 for p, at in commits if p in warm]
        assert lat[node]["max_ms"] == pytest.approx(max(delays))
        assert min(delays) <= lat[node]["p50_ms"]
    assert lat["relayed"]["p50_ms"] > lat["direct"]["p50_ms"] + 2  # the second hop
    assert lat["hop_p99_ms"] == pytest.approx(
        lat["relayed"]["p99_ms"] - lat["direct"]["p99_ms"], abs=0.01
    )
    assert lat["hop_p50_ms"] == pytest.approx(
        lat["relayed"]["p50_ms"] - lat["direct"]["p50_ms"], abs=0.01
    )
    # The run's noise: the branch's own listener against the direct leaf, one hop each.
    assert lat["one_hop_spread_p99_ms"] == pytest.approx(
        lat["branch"]["p99_ms"] - lat["direct"]["p99_ms"], abs=0.01
    )
    assert lat["one_hop_spread_p50_ms"] == pytest.approx(
        lat["branch"]["p50_ms"] - lat["direct"]["p50_ms"], abs=0.01
    )
    assert data["ratios"]["one_hop_spread_p99_ms"] == lat["one_hop_spread_p99_ms"]
    assert data["ratios"]["hop_p99_ms"] == lat["hop_p99_ms"]
    assert data["ratios"]["relayed_vs_direct_p99"] == round(
        lat["relayed"]["p99_ms"] / lat["direct"]["p99_ms"], 3
    )
    # Per entry: the same entries' relayed - direct latency, its quantiles in order.
    hop = lat["per_entry_hop_ms"]
    assert list(hop) == ["p10", "p50", "p90", "p99"]
    assert hop["p10"] <= hop["p50"] <= hop["p90"] <= hop["p99"]
    each = [(seen["relayed"][p] - seen["direct"][p]) * 1000 for p in warm]
    assert min(each) - 0.01 <= hop["p10"] and hop["p99"] <= max(each) + 0.01
    # Where the time goes: each stage's figures from its histogram over the load.
    stages_out = lat["stages"]
    assert list(stages_out) == [name for name, *_ in STAGES]
    for st in stages_out.values():
        assert st["observations"] == 200 and st["mean_ms"] == 4.0
        assert 1.0 < st["p50_ms"] <= 5.0 < st["p99_ms"] <= 25.0
    assert lat["relay_batches"] == {"forwarded": 180, "stored": 20}
    assert lat["machine_cpu_busy"] == 0.375 and lat["wall_seconds"] == 1.5
    assert lat["cpu_seconds"] == cpu
    thr = data["throughput"]
    assert thr["entries"] == 1000 and data["settings"]["writers"] == 2
    assert thr["direct_rate"] == pytest.approx(999 / 0.5, rel=0.01)
    assert thr["relayed_rate"] == pytest.approx(999 / 0.625, rel=0.01)
    assert thr["ratio"] == pytest.approx(thr["relayed_rate"] / thr["direct_rate"], rel=0.01)
    assert data["ratios"]["relayed_vs_direct_throughput"] == thr["ratio"]
    assert data["targets"] == {
        "hop_p99_ms_at_most": 20.0,
        "throughput_ratio_at_least": 0.8,
        "hop_p99_met": lat["hop_p99_ms"] <= 20.0,
        "throughput_met": thr["ratio"] >= 0.8,
    }
    assert data["targets"]["hop_p99_met"] and data["targets"]["throughput_met"]
    assert len(data["machine"]["loadavg_at_start"]) == 3 and len(data["loadavg_at_end"]) == 3

    console = Console(record=True, width=200)
    report(console, data)
    shown = console.export_text()
    assert "relay hop adds" in shown and "one-hop spread" in shown
    assert "per entry, relayed - direct" in shown
    assert "root -> branch -> leaf" in shown and "ack branch -> relayed" in shown
    assert "180 batches as received" in shown
