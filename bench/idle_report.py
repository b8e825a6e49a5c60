"""``bench/idle.py``'s report: from what was measured to its JSON, table and target.

:mod:`bench.idle` runs the processes and measures; this module only computes.
A cell holds, per process, the CPU seconds it used over the measured window (utime +
stime of ``/proc/<pid>/stat``) and, on PostgreSQL, per site database the transactions
committed or rolled back over it (``pg_stat_database``) and the most connections seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console

from bench.common import print_table

#: The issue's target: at most this % of one core per ``lr server`` process and per
#: subscriber process, whatever the number of destinations and clients.
TARGET_PERCENT = 0.5

#: Roles of the processes a cell runs.
SOURCE, SINK, SUBSCRIBER = "source", "sink", "subscriber"


@dataclass
class ProcessUse:
    """One process over the measured window."""

    role: str  # SOURCE (an ``lr server`` member of the source), SINK or SUBSCRIBER
    name: str
    cpu_seconds: float
    wall_seconds: float

    @property
    def percent(self) -> float:
        """% of one core."""
        return 100.0 * self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass
class DbUse:
    """One site's PostgreSQL database over the measured window."""

    role: str  # SOURCE or SINK
    site: str
    transactions: int  # xact_commit + xact_rollback, delta
    seconds: float
    connections_max: int  # the most backends connected to it at one sample

    @property
    def per_second(self) -> float:
        return self.transactions / self.seconds if self.seconds > 0 else 0.0


@dataclass
class IdleCell:
    backend: str
    destinations: int
    clients: int
    members: int
    seconds: float = 0.0  # the measured window
    settled_after_s: float = 0.0  # first process started -> every session streaming
    processes: list[ProcessUse] = field(default_factory=list)
    databases: list[DbUse] = field(default_factory=list)  # empty on SQLite
    sink_backend: str = ""  # the sinks' databases ("": the cell's backend)
    skipped: str = ""  # why the cell did not run ("" if it ran)
    loadavg_after: list[float] = field(default_factory=list)

    @property
    def shape(self) -> str:
        return f"{self.destinations}x{self.clients}"


@dataclass
class Spread:
    """% of one core over the processes of one role."""

    count: int
    max: float
    mean: float


def spread(cell: IdleCell, role: str) -> Spread | None:
    values = [p.percent for p in cell.processes if p.role == role]
    if not values:
        return None
    return Spread(len(values), max(values), sum(values) / len(values))


def db_per_second(cell: IdleCell, role: str) -> float | None:
    """Transactions per idle second of the source's database, or per sink database
    (mean); None without PostgreSQL figures."""
    values = [d.per_second for d in cell.databases if d.role == role]
    return sum(values) / len(values) if values else None


def worst(cell: IdleCell) -> ProcessUse | None:
    """The process using the most CPU (every role counts against the target)."""
    return max(cell.processes, key=lambda p: p.percent, default=None)


def target_met(cell: IdleCell) -> bool | None:
    top = worst(cell)
    return None if top is None else top.percent <= TARGET_PERCENT


def cell_dict(cell: IdleCell) -> dict[str, Any]:
    out = asdict(cell)
    for p, d in zip(out["processes"], cell.processes, strict=True):
        p["percent_of_core"] = round(d.percent, 3)
    for p, d in zip(out["databases"], cell.databases, strict=True):
        p["transactions_per_s"] = round(d.per_second, 2)
    summary: dict[str, Any] = {}
    for role in (SOURCE, SINK, SUBSCRIBER):
        s = spread(cell, role)
        summary[role] = None if s is None else {k: round(v, 3) for k, v in asdict(s).items()}
    src_db, sink_db = db_per_second(cell, SOURCE), db_per_second(cell, SINK)
    summary["source_db_transactions_per_s"] = None if src_db is None else round(src_db, 2)
    summary["sink_db_transactions_per_s_mean"] = None if sink_db is None else round(sink_db, 2)
    top = worst(cell)
    summary["worst"] = None if top is None else {"name": top.name, "percent": round(top.percent, 3)}
    summary["target_met"] = target_met(cell)
    out["shape"] = cell.shape
    out["summary"] = summary
    return out


def idle_result(
    settings: dict[str, Any],
    cells: Sequence[IdleCell],
    machine: dict[str, Any],
    backend_facts: dict[str, Any],
    elapsed: float,
    at: str,
) -> dict[str, Any]:
    """The JSON document."""
    return {
        "benchmark": "idle",
        "at": at,
        "elapsed_seconds": round(elapsed, 1),
        "settings": settings,
        "target_percent_of_core": TARGET_PERCENT,
        "machine": machine,
        "backend_facts": backend_facts,
        "results": [cell_dict(c) for c in cells],
        "targets_met": {
            f"{c.backend}/{c.shape}/m{c.members}": target_met(c) for c in cells if not c.skipped
        },
    }


def _pct(s: Spread | None) -> str:
    return "-" if s is None else f"{s.max:.2f} / {s.mean:.2f}"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _met(cell: IdleCell) -> str:
    met, top = target_met(cell), worst(cell)
    if met is None or top is None:
        return "-"
    return "[green]met[/]" if met else f"[red]missed[/]: {top.name}"


def report(console: Console, cells: Sequence[IdleCell]) -> None:
    rows = []
    for c in cells:
        sinks = f" (sinks: {c.sink_backend})" if c.sink_backend not in ("", c.backend) else ""
        head = [c.backend + sinks, c.shape, str(c.members)]
        if c.skipped:
            rows.append([*head, *["-"] * 7, f"skipped: {c.skipped}"])
            continue
        src_conn = sum(d.connections_max for d in c.databases if d.role == SOURCE)
        sink_conn = [d.connections_max for d in c.databases if d.role == SINK]
        rows.append(
            [
                *head,
                f"{c.seconds:.0f}",
                _pct(spread(c, SOURCE)),
                _pct(spread(c, SINK)),
                _pct(spread(c, SUBSCRIBER)),
                _rate(db_per_second(c, SOURCE)),
                _rate(db_per_second(c, SINK)),
                f"{src_conn} / {max(sink_conn) if sink_conn else 'n/a'}" if c.databases else "n/a",
                _met(c),
            ]
        )
    print_table(
        console,
        "Idle sites: % of one core per process, max / mean (utime + stime over the window)",
        [
            "backend",
            "dests x clients",
            "members",
            "s",
            "source",
            "sink",
            "subscriber",
            "source db tx/s",
            "sink db tx/s",
            "conns",
            f"<= {TARGET_PERCENT} %",
        ],
        rows,
        caption=(
            "source: each lr server member of the source; sink: each sink's lr server; "
            "subscriber: each sink's subscriber process (a subscriber per client); "
            "tx/s: transactions per idle second of the source's database and per sink "
            "database (mean); conns: most backends at once, source / largest sink "
            "database; missed: the process using the most"
        ),
        left=3,
    )


__all__ = [
    "SINK",
    "SOURCE",
    "SUBSCRIBER",
    "TARGET_PERCENT",
    "DbUse",
    "IdleCell",
    "ProcessUse",
    "Spread",
    "cell_dict",
    "db_per_second",
    "idle_result",
    "report",
    "spread",
    "target_met",
    "worst",
]
