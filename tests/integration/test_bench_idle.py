"""``bench/idle.py``'s JSON, target and report from measured cells; its settled state.

The benchmark runs real ``lr server`` and subscriber processes (a source, its sinks,
a subscriber per sink) and measures their CPU over an idle window; this test feeds the
code that turns its cells into its JSON, its target and its table with known cells of
the shapes it measures, in this process, and checks the state it waits for before it
measures against ``lr status --json`` documents. The benchmarks' wiring with real
servers is proven by tests/integration/test_bench_lanes.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench.common import machine_facts, write_json
from bench.idle import parse_args, parse_grid, settings, settled
from bench.idle_pg import PG_MARGIN, pg_connections_needed
from bench.idle_report import (
    SINK,
    SOURCE,
    SUBSCRIBER,
    DbUse,
    IdleCell,
    ProcessUse,
    idle_result,
    report,
    target_met,
)
from lr_server.cluster.placement import TRIM_UNIT, place, stream_unit

WINDOW = 20.0


def cell(backend: str, dests: int, members: int, source_cpu: float) -> IdleCell:
    """A measured cell: each source member used ``source_cpu`` seconds (the first twice
    that), each sink 0.02 s, each subscriber 0.04 s over a 20 s window."""
    c = IdleCell(backend, dests, 2, members, seconds=WINDOW, settled_after_s=3.5)
    names = [f"src-m-{i}" for i in range(1, members + 1)] if members > 1 else ["src"]
    for i, name in enumerate(names):
        c.processes.append(ProcessUse(SOURCE, name, source_cpu * (2 if i == 0 else 1), WINDOW))
    for d in range(1, dests + 1):
        c.processes.append(ProcessUse(SINK, f"sink-{d}", 0.02, WINDOW))
        c.processes.append(ProcessUse(SUBSCRIBER, f"sink-{d}-subscriber", 0.04, WINDOW))
    if backend == "postgresql":
        c.databases.append(DbUse(SOURCE, "src", 600, WINDOW, 3 * members))
        for d in range(1, dests + 1):
            c.databases.append(DbUse(SINK, f"sink-{d}", 40 * d, WINDOW, 4))
    return c


def test_idle_benchmark_reports_cpu_per_process_and_transactions(tmp_path: Path) -> None:
    out = tmp_path / "idle.json"
    args = parse_args(
        ["--seconds", "20", "--grid", "1x2,2x2", "--members", "1,3", "--backend", "both",
         "--json", str(out)]
    )  # fmt: skip
    assert args.grid == [(1, 2), (2, 2)] and args.members == [1, 3]
    assert args.backends == ["sqlite", "postgresql"]
    cells = [
        cell("sqlite", 2, 1, 2.0),  # 10 % and more: missed
        IdleCell("sqlite", 2, 2, 3, skipped="a SQLite site runs one server"),
        cell("postgresql", 2, 3, 0.05),  # 0.5 % at most: met
    ]
    result = idle_result(
        settings(args), cells, machine_facts(), {"postgresql": {"server_version": "15"}},
        12.34, "2026-01-01T00:00:00+00:00",
    )  # fmt: skip
    write_json(out, result)

    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "idle" and data["elapsed_seconds"] == 12.3
    assert data["target_percent_of_core"] == 0.5
    assert data["settings"]["grid"] == ["1x2", "2x2"] and data["settings"]["seconds"] == 20.0
    assert data["backend_facts"] == {"postgresql": {"server_version": "15"}}
    assert len(data["machine"]["loadavg_at_start"]) == 3
    assert data["targets_met"] == {"sqlite/2x2/m1": False, "postgresql/2x2/m3": True}

    lite, skipped, pg = data["results"]
    assert lite["shape"] == "2x2" and lite["settled_after_s"] == 3.5
    assert {p["name"]: p["percent_of_core"] for p in lite["processes"]} == {
        "src": 20.0, "sink-1": 0.1, "sink-1-subscriber": 0.2,
        "sink-2": 0.1, "sink-2-subscriber": 0.2,
    }  # fmt: skip
    s = lite["summary"]
    assert s["source"] == {"count": 1, "max": 20.0, "mean": 20.0}
    assert s["sink"] == {"count": 2, "max": 0.1, "mean": 0.1}
    assert s["subscriber"] == {"count": 2, "max": 0.2, "mean": 0.2}
    assert s["source_db_transactions_per_s"] is None  # SQLite: n/a
    assert s["sink_db_transactions_per_s_mean"] is None and lite["databases"] == []
    assert s["worst"] == {"name": "src", "percent": 20.0} and s["target_met"] is False

    assert skipped["skipped"] and skipped["processes"] == []
    assert skipped["summary"]["target_met"] is None

    s = pg["summary"]
    assert s["source"] == {"count": 3, "max": 0.5, "mean": pytest.approx(1 / 3, abs=1e-3)}
    assert s["source_db_transactions_per_s"] == 30.0  # 600 over 20 s
    assert s["sink_db_transactions_per_s_mean"] == 3.0  # (2 + 4) / 2
    assert [d["transactions_per_s"] for d in pg["databases"]] == [30.0, 2.0, 4.0]
    assert [d["connections_max"] for d in pg["databases"]] == [9, 4, 4]
    assert s["worst"]["name"] == "src-m-1" and s["target_met"] is True  # at the target

    # Every role counts against the target: a subscriber over it misses it.
    busy = cell("postgresql", 1, 1, 0.01)
    busy.processes.append(ProcessUse(SUBSCRIBER, "sink-9-subscriber", 0.2, WINDOW))
    assert target_met(busy) is False

    console = Console(record=True, width=200)
    report(console, cells)
    shown = console.export_text()
    assert "20.00 / 20.00" in shown and "missed: src" in shown
    assert "skipped: a SQLite site runs one server" in shown
    assert "0.50 / 0.33" in shown and "30.0" in shown and "9 / 4" in shown and "met" in shown


def test_cells_on_postgresql_say_what_they_hold_and_where_their_sinks_are() -> None:
    assert pg_connections_needed("sqlite", "sqlite", 20, 5, 1) == 0
    assert pg_connections_needed("postgresql", "sqlite", 20, 5, 3) == 3 * 8 + PG_MARGIN
    assert pg_connections_needed("postgresql", "postgresql", 8, 2, 1) == 8 + 8 * 9 + PG_MARGIN
    mixed = cell("postgresql", 1, 1, 0.01)
    mixed.databases = mixed.databases[:1]  # the sinks' are SQLite files: only the source's
    mixed.sink_backend = "sqlite"
    full = IdleCell("postgresql", 20, 5, 3, skipped="needs about 340 PostgreSQL connections")
    console = Console(record=True, width=200)
    report(console, [mixed, full])
    shown = console.export_text()
    assert "postgresql (sinks: sqlite)" in shown and "3 / n/a" in shown
    assert "skipped: needs about 340 PostgreSQL connections" in shown


def test_grid_cells_are_destinations_by_clients() -> None:
    assert parse_grid("1x1, 8x2,20x5") == [(1, 1), (8, 2), (20, 5)]
    for bad in ("8", "0x2", "8x", "ax2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_grid(bad)


def status(owners: dict[tuple[str, str], str], connected: bool = True) -> dict[str, Any]:
    """An ``lr status --json`` document of the source, with streams owned by ``owners``."""
    dests = sorted({d for d, _ in owners})
    return {
        "sessions": [
            {"destination": d, "state": "log_entry_sync", "connected": connected} for d in dests
        ],
        "send": [
            {"destination": d, "client": c, "state": "log entry sync", "owner": o}
            for (d, c), o in owners.items()
        ],
    }


def test_settled_is_every_session_streaming_and_every_stream_placed() -> None:
    dests, clients = ["sink-1", "sink-2"], ["client-1", "client-2"]
    keys = [(d, c) for d in dests for c in clients]
    assert settled(status(dict.fromkeys(keys, "vm")), dests, clients, None)
    assert not settled(status(dict.fromkeys(keys, "vm"), connected=False), dests, clients, None)
    assert not settled(status(dict.fromkeys(keys[:-1], "vm")), dests, clients, None)
    assert not settled(status(dict.fromkeys(keys, "")), dests, clients, None)  # no owner
    lagging = status(dict.fromkeys(keys, "vm"))
    lagging["sessions"][0]["state"] = "connected"  # negotiating
    assert not settled(lagging, dests, clients, None)

    members = ["m-1", "m-2", "m-3"]
    units = [stream_unit(d, c) for d, c in keys] + [TRIM_UNIT]
    want = place(units, dict.fromkeys(members, 1))
    placed = {(d, c): str(want[stream_unit(d, c)]) for d, c in keys}
    assert settled(status(placed), dests, clients, members)
    # The first member to start holds every unit until the others join: not settled.
    assert len(set(placed.values())) > 1
    assert not settled(status(dict.fromkeys(keys, "m-1")), dests, clients, members)
