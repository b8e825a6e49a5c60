"""bench/transmit.py runs end to end on SQLite and writes the JSON it documents."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from bench.transmit import main as transmit_main
from lr_client.store import open_store
from tests.conftest import PgSchema


def test_transmit_bench_sqlite_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "transmit.json"
    code = transmit_main(
        [
            "--seconds",
            "0.2",
            "--backend",
            "sqlite",
            "--storage-entries",
            "200",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "Transmit throughput" in capsys.readouterr().out

    data = json.loads(out.read_text())
    for key in ("settings", "machine", "targets", "results", "ratios", "storage", "storage_ratios"):
        assert key in data, key
    assert data["settings"]["backends"] == ["sqlite"]

    cells = {(c["system"], c["entries_per_txn"], c["destinations"]) for c in data["results"]}
    for system in ("ours", "plain", "outbox"):
        for per_txn in (1, 100):
            for dests in (1, 8):
                assert (system, per_txn, dests) in cells
    assert all(c["backend"] == "sqlite" and c["writers"] == 1 for c in data["results"])
    for c in data["results"]:
        # the rates are what was measured: entries over seconds, per slice and in all
        assert c["entries"] > 0 and c["rate"] == pytest.approx(c["entries"] / c["seconds"])
        assert c["slice_rates"] and all(x > 0 for x in c["slice_rates"])
    cell = {(c["system"], c["entries_per_txn"], c["destinations"]): c for c in data["results"]}

    plain_ratios = [r for r in data["ratios"] if r["system"] == "ours" and r["baseline"] == "plain"]
    assert sorted((r["entries_per_txn"], r["destinations"]) for r in plain_ratios) == [
        (1, 1),
        (1, 8),
        (100, 1),
        (100, 8),
    ]
    for r in plain_ratios:
        ours = cell[("ours", r["entries_per_txn"], r["destinations"])]
        plain = cell[("plain", r["entries_per_txn"], r["destinations"])]
        # each ratio is computed from the measured cells, and judged against its target
        assert r["ratio_of_totals"] == pytest.approx(ours["rate"] / plain["rate"])
        pairs = [x / y for x, y in zip(ours["slice_rates"], plain["slice_rates"], strict=False)]
        assert r["ratio"] == pytest.approx(statistics.median(pairs))
        assert r["met"] is (r["ratio"] >= r["target"])

    ours_storage = {s["destinations"]: s for s in data["storage"] if s["system"] == "ours"}
    assert set(ours_storage) == {1, 8}
    # 1 KiB payloads: at least the payload is stored per entry.
    assert all(s["bytes_per_entry"] >= 1024 for s in ours_storage.values())
    (ours_ratio,) = [x for x in data["storage_ratios"] if x["system"] == "ours"]
    assert ours_ratio["ratio_8_to_1"] > 0


def ours_and_plain(pg_schema: PgSchema) -> list[Any]:
    """bench/transmit.py's "ours" and "plain" systems, set up in ``pg_schema``."""
    from bench.transmit import Ours, Plain, Slot

    systems: list[Any] = []
    for kind in (Ours, Plain):
        system = kind(Slot("postgresql", pg_schema.engine(), pg_schema.name), ["site-1"])
        system.setup()
        systems.append(system)
    return systems


@pytest.mark.postgres
def test_concurrent_writers_section_measures_each_system_and_its_ratio(
    pg_schema: PgSchema,
) -> None:
    from rich.console import Console

    from bench.writers import measure_writers, report_writers

    systems = ours_and_plain(pg_schema)
    console = Console(record=True, width=140)
    cells, ratios = measure_writers(
        systems, 0.4, 2, [b"x" * 1024], console, writer_counts=[1, 3], holds_ms=[0, 2]
    )
    assert sorted((c.system, c.writers, c.hold_ms) for c in cells) == sorted(
        (s, w, h) for s in ("ours", "plain") for w in (1, 3) for h in (0, 2)
    )
    for c in cells:
        assert c.entries > 0 and c.rate == pytest.approx(c.entries / c.seconds)
        assert len(c.slice_rates) == 2
    rate = {(c.system, c.writers, c.hold_ms): c for c in cells}
    assert sorted((r.writers, r.hold_ms) for r in ratios) == [(1, 0), (1, 2), (3, 0), (3, 2)]
    for r in ratios:
        ours, plain = rate[("ours", r.writers, r.hold_ms)], rate[("plain", r.writers, r.hold_ms)]
        pairs = [x / y for x, y in zip(ours.slice_rates, plain.slice_rates, strict=True)]
        assert r.baseline == "plain" and r.ratio == pytest.approx(statistics.median(pairs))
        assert r.met is (r.ratio >= 0.9)
    # Every transaction wrote its application row and its entry, committed.
    open_store(pg_schema.engine()).send.sequence()  # their positions are given after commit
    with pg_schema.engine().connect() as conn:
        app = conn.execute(text("SELECT count(*) FROM bench_app_rows")).scalar_one()
        sent = conn.execute(text("SELECT count(*) FROM lrq_send_log_entries")).scalar_one()
        plain_rows = conn.execute(text("SELECT count(*) FROM bench_plain")).scalar_one()
    assert sent >= sum(c.entries for c in cells if c.system == "ours")
    assert app == sent + plain_rows  # one application row per transaction of either system
    report_writers(console, cells, ratios)
    assert "ours/plain" in console.export_text()


@pytest.mark.postgres
def test_writers_section_reports_entries_per_cpu_second(pg_schema: PgSchema) -> None:
    from rich.console import Console

    from bench.common import ServerCpu
    from bench.writers import measure_writers, report_writers

    systems = ours_and_plain(pg_schema)
    cpu = ServerCpu(pg_schema.url)
    try:
        assert cpu.available  # the server runs on this host
        console = Console(record=True, width=140)
        cells, ratios = measure_writers(
            systems, 0.4, 1, [b"x" * 1024], console, writer_counts=[4], holds_ms=[0], cpu=cpu
        )
    finally:
        cpu.close()
    assert sorted(c.system for c in cells) == ["ours", "plain"]
    for c in cells:
        assert c.client_cpu > 0 and c.server_cpu > 0
        assert c.per_core == pytest.approx(c.entries / (c.client_cpu + c.server_cpu))
    report_writers(console, cells, ratios)
    shown = console.export_text()
    assert "Per-core efficiency" in shown and "entries per CPU-second" in shown


@pytest.mark.postgres
def test_storage_of_a_partitioned_table_counts_its_partitions(pg_schema: PgSchema) -> None:
    """The send queue is partitioned on PostgreSQL: its size is its partitions' sizes."""
    from bench.common import pg_relation_bytes

    engine = pg_schema.engine()
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE parted (k int, v text) PARTITION BY LIST (k)"))
        conn.execute(text("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES IN (1)"))
        conn.execute(text("CREATE TABLE plain_t (v text)"))
        conn.execute(
            text("INSERT INTO parted SELECT 1, repeat('x', 500) FROM generate_series(1, 200)")
        )
        conn.execute(
            text("INSERT INTO plain_t SELECT repeat('x', 500) FROM generate_series(1, 200)")
        )
    with engine.connect() as conn:
        one = pg_relation_bytes(conn, pg_schema.name, ["parted"])
        leaf = conn.execute(text("SELECT pg_total_relation_size('parted_1')")).scalar_one()
        both = pg_relation_bytes(conn, pg_schema.name, ["parted", "plain_t"])
        plain = conn.execute(text("SELECT pg_total_relation_size('plain_t')")).scalar_one()
    assert one == leaf > 0
    assert both == leaf + plain
