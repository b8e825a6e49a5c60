"""bench/transmit.py --async runs end to end and writes the JSON it documents."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.transmit import main as transmit_main


def run_async_bench(tmp_path: Path, backend: str) -> dict[str, object]:
    out = tmp_path / "transmit-async.json"
    args = ["--async", "--seconds", "0.4", "--rounds", "2", "--tasks", "1,3"]
    code = transmit_main([*args, "--backend", backend, "--out", str(out)])
    assert code == 0
    data: dict[str, object] = json.loads(out.read_text())
    return data


def check_report(data: dict[str, object], backend: str, drivers: list[str]) -> None:
    for key in ("settings", "machine", "targets", "results", "ratios"):
        assert key in data, key
    results = data["results"]
    ratios = data["ratios"]
    assert isinstance(results, list) and isinstance(ratios, list)
    cells = {(c["driver"], c["system"], c["tasks"]): c for c in results}
    assert sorted(cells) == sorted(
        (d, s, t) for d in drivers for s in ("ours", "plain") for t in (1, 3)
    )
    for c in results:
        assert c["backend"] == backend
        # the rates are what was measured: entries over seconds, per slice and in all
        assert c["entries"] > 0 and c["rate"] == pytest.approx(c["entries"] / c["seconds"])
        assert len(c["slice_rates"]) == 2 and all(x > 0 for x in c["slice_rates"])
    assert sorted((r["driver"], r["tasks"]) for r in ratios) == sorted(
        (d, t) for d in drivers for t in (1, 3)
    )
    for r in ratios:
        ours = cells[(r["driver"], "ours", r["tasks"])]
        plain = cells[(r["driver"], "plain", r["tasks"])]
        pairs = [x / y for x, y in zip(ours["slice_rates"], plain["slice_rates"], strict=True)]
        assert r["ratio"] == pytest.approx(statistics.median(pairs))
        assert r["ratio_of_totals"] == pytest.approx(ours["rate"] / plain["rate"])
        assert r["met"] is (r["ratio"] >= r["target"] == 0.9)


def test_transmit_async_bench_sqlite_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    data = run_async_bench(tmp_path, "sqlite")
    assert "Async transmit throughput" in capsys.readouterr().out
    check_report(data, "sqlite", ["aiosqlite"])


@pytest.mark.postgres
def test_transmit_async_bench_postgresql_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import require_pg

    require_pg()
    monkeypatch.chdir(tmp_path)
    data = run_async_bench(tmp_path, "postgresql")
    check_report(data, "postgresql", ["psycopg_async", "asyncpg"])
