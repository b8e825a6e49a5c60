"""``bench/replicate.py``'s JSON, ratios, report and chart, from measured cells.

The benchmark runs real ``lr server`` processes (two sinks and a source per cell); this
test feeds the code that turns its cells into its JSON, its ratios against the targets,
its report and its send-queue chart with known cells of the shapes it measures, in this
process. The benchmarks' wiring with real servers is proven by
tests/integration/test_bench_lanes.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench.common import machine_facts, write_json
from bench.replicate import (
    BackendResult,
    Baseline,
    CpuUse,
    DestRate,
    Latency,
    LatencyCell,
    PacedLoad,
    ThroughputCell,
    parse_args,
    queue_svg,
    replicate_result,
    report,
)

ENTRIES = 1000


def throughput(dests: int, stalled: int, rate: float, order: int = 0) -> ThroughputCell:
    healthy = [f"sink-{i}" for i in range(1, dests - stalled + 1)]
    per = [DestRate(d, ENTRIES, 10, ENTRIES / rate, rate) for d in healthy]
    return ThroughputCell(
        "sqlite", dests, stalled, ENTRIES, 20_000.0, True, ENTRIES / rate,
        rate * len(per), per, ENTRIES if stalled else 0, CpuUse(0.2, 0.3, 1.5), order,
    )  # fmt: skip


def latency(dests: int, stalled: int, idle: bool, p99: float) -> LatencyCell:
    pooled = Latency(96 * (dests - stalled), p99 / 3, p99, p99 * 1.5)
    return LatencyCell(
        "sqlite", dests, stalled, 200.0, 192.0, 96, 0, 3.0, Latency(96, 1.0, 2.0, 2.5),
        False, True, pooled,
        {f"sink-{i}": pooled for i in range(1, dests - stalled + 1)},
        send_queue=[(0.0, 0), (0.25, 40 + 40 * stalled), (0.5, 10 + 86 * stalled)],
        drops=[{"destination": "sink-2", "dropped_after_s": 0.4}] if stalled else [],
        cpu=CpuUse(0.1, 0.1, 2.0), writers=3, idle_transaction=idle,
    )  # fmt: skip


def measured() -> BackendResult:
    return BackendResult(
        "sqlite",
        Baseline("sqlite", 100, 5000, 0.5, 10_000.0),
        [throughput(1, 0, 4000.0), throughput(2, 0, 3000.0, 0), throughput(2, 1, 2700.0, 1)],
        [
            latency(1, 0, False, 6.0),
            latency(1, 0, True, 9.0),
            latency(2, 0, False, 8.0),
            latency(2, 1, False, 10.0),
        ],
        {"backend": "sqlite"},
        PacedLoad([], 198.0, 0, 2.0, Latency(100, 1.0, 2.0, 3.0), False),
    )


def test_replicate_benchmark_writes_positive_rates(tmp_path: Path) -> None:
    out, svg = tmp_path / "replicate.json", tmp_path / "queue.svg"
    args = parse_args(
        ["--backend", "sqlite", "--seconds", "0.5", "--entries", str(ENTRIES),
         "--rate", "200", "--entries-per-txn", "2", "--writers", "3", "--idle-transaction",
         "--destinations", "2", "--rounds", "1", "--out", str(out), "--svg", str(svg)]
    )  # fmt: skip
    results = [measured()]
    result = replicate_result(args, results, 12.34, machine_facts(), "2026-01-01T00:00:00+00:00")
    write_json(out, result)
    svg.write_text(queue_svg(results, "Send queue size"))

    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "replicate" and data["elapsed_seconds"] == 12.3
    assert data["settings"]["paced_entries_per_txn"] == 2
    assert data["settings"]["paced_writers"] == 3
    assert data["settings"]["idle_transaction_cell"] is True
    assert data["settings"]["sinks"] == 2 and data["settings"]["backends"] == ["sqlite"]
    assert len(data["machine"]["loadavg_at_start"]) == 3
    assert data["backend_facts"] == {"sqlite": {"backend": "sqlite"}}
    sqlite = data["results"]["sqlite"]
    assert sqlite["baseline"]["rate"] == 10_000.0
    assert sqlite["transmit_control"]["achieved_rate"] == 198.0
    cells = sqlite["throughput"]
    assert [(c["destinations"], c["stalled"]) for c in cells] == [(1, 0), (2, 0), (2, 1)]
    for cell in cells:
        assert cell["complete"], cell
        healthy = cell["destinations"] - cell["stalled"]
        assert len(cell["per_destination"]) == healthy
        assert all(d["entries"] == ENTRIES and d["rate"] > 0 for d in cell["per_destination"])
        rates = [d["rate"] for d in cell["per_destination"]]
        assert cell["mean_rate"] == pytest.approx(sum(rates) / len(rates))
        assert cell["cpu"] == {"source": 0.2, "sinks": 0.3, "ms_per_1k_deliveries": 1.5}
    assert cells[2]["send_queue_after"] == ENTRIES  # the stalled destination acked nothing
    shapes = [(c["destinations"], c["stalled"], c["idle_transaction"]) for c in sqlite["latency"]]
    assert shapes == [(1, 0, False), (1, 0, True), (2, 0, False), (2, 1, False)]
    for cell in sqlite["latency"]:
        assert cell["writers"] == 3 and cell["complete"]
        assert cell["worst_p99_ms"] == max(d["p99_ms"] for d in cell["per_destination"].values())
        assert cell["send_queue"] and all(len(s) == 2 for s in cell["send_queue"])
    ratios = data["ratios"]["sqlite"]
    assert ratios["one_dest_vs_baseline"] == pytest.approx(4000 / 10_000)
    assert ratios["one_dest_vs_copy_baseline"] is None  # SQLite has no COPY
    assert ratios["many_dest_aggregate_vs_baseline"] == pytest.approx(6000 / 10_000)
    assert ratios["many_dest_mean_rate_healthy"] == 3000.0
    assert ratios["many_dest_mean_rate_stalled"] == 2700.0
    assert ratios["stalled_throughput_vs_healthy"] == pytest.approx(0.9)
    assert ratios["stalled_p99_ratio_healthy_over_stalled"] == pytest.approx(0.8)
    met = ratios["targets_met"]
    assert met["p99_at_offered_load"] == {"1d": True, "2d": True, "2d+stall": True}
    assert set(met) == {"one_dest_vs_baseline", "p99_at_offered_load", "stalled_throughput",
                        "stalled_p99"}  # fmt: skip
    # The chart: a line per many-destination latency cell, the drop marked.
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<polyline") == 2
    assert "sink-2 dropped" in text

    console = Console(record=True, width=160)
    report(console, results, data["ratios"])
    shown = console.export_text()
    assert "1 stalled" in shown and "4,000" in shown
