"""bench/deliver.py, bench/dest_read.py and bench/trim.py run and report what
docs/benchmarks.md says (tiny runs: the figures come from the benchmarks' own runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import deliver, dest_read, trim


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_deliver_reports_every_case_and_the_async_subscriber_against_the_sync_one(
    tmp_path: Path, backend: str
) -> None:
    out = tmp_path / "deliver.json"
    args = ["--entries", "120", "--rounds", "2", "--batch-size", "40", "--backend", backend]
    assert deliver.main([*args, "--async", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["results"][backend]
    asyncpg = set(deliver.ASYNCPG_CASES) if backend == "postgresql" else set()
    assert set(result["cases"]) == {*deliver.CASES, *deliver.ASYNC_CASES, *asyncpg}
    assert all(c["entries"] == 120 and c["rate"] > 0 for c in result["cases"].values())
    ratios, cases = result["ratios"], result["cases"]
    # The median of the per-round ratios (two rounds: their mean).
    aio, sync = (cases[c]["round_rates"] for c in ("aio-noop", "noop"))
    per_round = [a / b for a, b in zip(aio, sync, strict=True)]
    assert ratios["aio_noop_vs_noop"] == pytest.approx(sum(per_round) / 2, rel=0.01)
    totals = result["ratios_of_totals"]
    rates = {k: v["rate"] for k, v in cases.items()}
    assert totals["aio_noop_vs_noop"] == pytest.approx(rates["aio-noop"] / rates["noop"], rel=0.01)
    assert "aio_insert_vs_insert" in ratios
    assert ("aio_noop_asyncpg_vs_noop" in ratios) == (backend == "postgresql")


def test_deliver_runs_only_the_cases_named(tmp_path: Path) -> None:
    out = tmp_path / "deliver.json"
    args = ["--entries", "80", "--rounds", "1", "--batch-size", "40", "--backend", "postgresql"]
    cases = "noop,aio-noop-asyncpg"
    assert deliver.main([*args, "--cases", cases, "--out", str(out)]) == 0
    result = json.loads(out.read_text())["results"]["postgresql"]
    assert set(result["cases"]) == {"noop", "aio-noop-asyncpg"}
    assert set(result["ratios"]) == {"aio_noop_asyncpg_vs_noop"}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_dest_read_reports_each_count_of_others_against_none(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "dest_read.json"
    args = ["--others", "300", "--reads", "3", "--backend", backend, "--json", str(out)]
    assert dest_read.main(args) == 0
    cells = json.loads(out.read_text())["results"][backend]
    assert [c["others"] for c in cells] == [0, 300]  # the control is always measured
    assert cells[0]["vs_control"] == 1.0 and cells[1]["median_ms"] > 0
    assert all(c["first_ms"] > 0 for c in cells)


def test_trim_reports_the_trim_against_a_raw_delete_per_count_of_destinations(
    tmp_path: Path,
) -> None:
    out = tmp_path / "trim.json"
    args = ["--entries", "1200", "--destinations", "1,3", "--rounds", "2", "--json", str(out)]
    assert trim.main(args) == 0
    cells = json.loads(out.read_text())["results"]["sqlite"]
    assert [c["destinations"] for c in cells] == [1, 3]
    for c in cells:  # each kind ran each round, in turns, and deleted every entry
        assert [len(c["rounds"][k]) for k in ("raw", "trim")] == [2, 2]
        assert c["trim_vs_raw"] == pytest.approx(
            c["trim_cpu_ms_per_1k"] / c["raw_cpu_ms_per_1k"], rel=0.01
        )
