"""``bench/soak.py``'s samples, totals, targets, JSON, report and chart, from observations.

The benchmark runs real ``lr server`` processes (a source and two sinks) and two
subscriber processes for minutes; this test feeds the code that turns what its observer
saw into its JSON (each sample, the run's totals and targets), its report and its chart
with known observations (commits and applications per period, each period's snapshot of
table sizes, RSS and CPU), in this process, for SQLite and for PostgreSQL with a long
transaction. The benchmarks' wiring with real servers is proven by
tests/integration/test_bench_lanes.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from rich.console import Console

from bench.common import write_json
from bench.soak import (
    RECV_TABLES,
    SEND_TABLES,
    SOURCE_ID,
    Soak,
    parse_args,
    report,
    run_record,
    soak_header,
    soak_svg,
)

PROCESSES = {
    "lr server src-soak",
    "lr server sink-1",
    "lr server sink-2",
    "bench (transmitter)",
    "subscriber sink-1",
    "subscriber sink-2",
}
SINKS = ["sink-1", "sink-2"]
MIB = 1 << 20


def tables(backend: str, i: int) -> dict[str, dict[str, dict[str, int | None]]]:
    def stats(size: int) -> dict[str, int | None]:
        if backend == "sqlite":
            return {"bytes": size, "live": None, "dead": None}
        return {"bytes": size, "live": size // 100, "dead": 10 * i}

    source = {t: stats((i + 1) * 8192) for t in SEND_TABLES[backend]}
    sink = {RECV_TABLES[0]: stats((i + 2) * 8192), "soak_applied": stats(8192)}
    return {SOURCE_ID: source, "sink-1": dict(sink), "sink-2": dict(sink)}


def observed(tmp_path: Path, backend: str, *extra: str) -> tuple[dict[str, Any], Path]:
    """The JSON of one run of the benchmark whose observer saw three 2 s periods: 100, 120
    and 140 entries sent, each applied at both sinks some ms later."""
    out, svg = tmp_path / "soak.json", tmp_path / "soak.svg"
    args = parse_args(
        ["--minutes", "0.1", "--sample-seconds", "2", "--backend", backend,
         "--out", str(out), "--svg", str(svg), *extra]
    )  # fmt: skip
    args.vacuum_seconds = 0.0  # as main() sets it where autovacuum runs
    long_tx = args.long_transaction == "on"
    cluster = SimpleNamespace(dbs=SimpleNamespace(backend=backend), sink_ids=SINKS)
    pids = {name: 1000 + n for n, name in enumerate(sorted(PROCESSES))}
    rate = 60.0 if args.rate else 0.7 * 400.0
    soak = Soak(cast(Any, None), cast(Any, cluster), pids, args, rate, {}, Console(), long_tx)
    soak.cpu_at_start = 0.5
    for i, period in enumerate(soak.periods):
        period.transmitted = 100 + 20 * i
        period.applied = {sink: period.transmitted for sink in SINKS}
        for n in range(2 * period.transmitted):
            period.latency.add(2.0 + (n % 50) * 0.2 + i)
        snap: dict[str, Any] = {
            "at_s": 2.0 * (i + 1),
            "tables": tables(backend, i),
            "rss_bytes": {name: (40 + i) * MIB for name in pids},
            "cpu_seconds": 0.5 + 0.3 * (i + 1),
            "loadavg": [1.0, 1.0, 1.0],
        }
        if backend == "sqlite":
            snap["files"] = {
                site: {"db_bytes": (i + 3) * 4096, "wal_bytes": 4096, "freelist_pages": 0,
                       "page_size": 4096}
                for site in (SOURCE_ID, *SINKS)
            }  # fmt: skip
        elif long_tx:
            snap["long_transaction"] = {"state": "idle in transaction", "xid_age": 100 * (i + 1)}
        period.snapshot = snap
    if long_tx:
        soak.held = {"pid": 4321, "idle_in_transaction_session_timeout": "0",
                     "still_idle_in_transaction_at_end": True}  # fmt: skip
    probe = {} if args.rate else {"seconds": 1.0, "entries": 400, "end_to_end_rate": 400.0}
    result = soak_header(args)
    result["runs"].append(run_record(soak, {"backend": backend}, probe, rate))
    write_json(out, result)
    svg.write_text(soak_svg(result["runs"], "Soak"))
    console = Console(record=True, width=170)
    report(console, result["runs"][0])
    shown = console.export_text()
    assert "Targets," in shown and "shorter than 10 minutes" in shown
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<polyline") >= 4
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "soak" and data["settings"]["destinations"] == 2
    (run,) = data["runs"]
    return run, out


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
        sent_tables = s["tables"]["src-soak"]
        assert s["send_queue_bytes"] == sum(sent_tables[t]["bytes"] for t in sent_tables)
        assert set(s["tables"]) == {"src-soak", "sink-1", "sink-2"}
        assert s["send_queue_bytes"] > 0 and s["recv_queue_bytes"] > 0
        # The replication's CPU is counted, cumulatively, and priced per entry sent.
        assert s["cpu_used_s"] > 0 and s["cpu_seconds"] >= s["cpu_used_s"]
        if s["transmitted"]:
            assert s["cpu_ms_per_entry"] == pytest.approx(1000 * s["cpu_used_s"] / s["transmitted"])
    assert [s["cpu_seconds"] for s in samples] == sorted(s["cpu_seconds"] for s in samples)
    assert sum(s["latency_ms"]["entries"] for s in samples) == 2 * totals["transmitted"]
    assert [s["cpu_used_s"] for s in samples] == pytest.approx([0.3, 0.3, 0.3])
    t = run["targets"]
    # The windows of a run shorter than 10 minutes: the samples within its first half
    # (0-2 s; its first is kept, being the only one) against those within its second (4-6 s).
    assert (t["early_samples"], t["late_samples"]) == ([0], [2])
    assert t["throughput"]["early"] == pytest.approx(100 / 2.0)
    assert t["throughput"]["late"] == pytest.approx(140 / 2.0)
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
    run, _ = observed(tmp_path, "sqlite", "--probe-seconds", "1")
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
    assert "flat" in run["targets"] and "source_file_bytes" in run["targets"]["flat"]


def test_soak_postgresql_with_a_long_transaction_counts_dead_tuples(tmp_path: Path) -> None:
    run, _ = observed(tmp_path, "postgresql", "--rate", "60", "--long-transaction")
    check_run(run)
    assert run["backend"] == "postgresql" and run["long_transaction"] is True
    assert run["rate"] == 60 and run["probe"] == {}
    assert run["vacuum_seconds"] == 0.0
    held = run["held_session"]
    assert held["idle_in_transaction_session_timeout"] == "0"
    assert held["still_idle_in_transaction_at_end"] is True
    ages = [s["long_transaction"]["xid_age"] for s in run["samples"]]
    assert ages == sorted(ages) and ages[-1] > ages[0] > 0
    for s in run["samples"]:
        assert s["long_transaction"]["state"] == "idle in transaction"
        for site in ("src-soak", "sink-1", "sink-2"):
            for table, stats in s["tables"][site].items():
                assert isinstance(stats["dead"], int) and isinstance(stats["live"], int), table
        assert isinstance(s["send_dead_tuples"], int) and isinstance(s["recv_dead_tuples"], int)
        assert "lrq_send_entries" in s["tables"]["src-soak"]
    assert {"send_dead_tuples", "recv_dead_tuples"} <= set(run["targets"]["flat"])
