"""Concurrent application writers on PostgreSQL: the section of ``bench/transmit.py --writers``.

Each writer thread runs application transactions in a loop: INSERT one
application row, queue one 1 KiB entry (ours: ``transmit_log_entry_message``;
plain: one outbox row; PgQ: ``pgq.insert_event``), hold the transaction open
for 0, 2 or 10 ms (the application's other work), COMMIT. With 1, 4, 16 and 64
writers. Every writer has a connection of its own (a pool of exactly that
many, opened before the timed slice and closed after it, so the three systems
never hold more than one cell's connections at once). The systems of one cell
run interleaved; the ratio is the median of per-slice ratios.

Per-core efficiency: where the server's backends are visible (:class:`ServerCpu`),
each cell also records the CPU it used, this process's (``time.process_time``) plus
that of the PostgreSQL backends of the benchmark's database, and reports entries per
CPU-second: the entries/s one fully used core would carry.

SQLite is not measured here: it has one writer at a time whatever the
product does, so concurrent writers only queue for its lock.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import sqlalchemy
from rich.console import Console
from sqlalchemy import BigInteger, Column, Identity, MetaData, String, Table, text
from sqlalchemy.orm import Session

from bench.common import (
    Measurement,
    ServerCpu,
    fmt_rate,
    fmt_ratio,
    interleaved,
    paired_ratio,
    print_table,
    run_threads,
)
from lr_client import create_engine

WRITER_COUNTS = (1, 4, 16, 64)
HOLD_MS = (0, 2, 10)
#: Target: ours >= 0.9x plain in every cell (measured and reported, never asserted).
TARGET_VS_PLAIN = 0.9

app_meta = MetaData()
app_rows = Table(
    "bench_app_rows",
    app_meta,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("note", String(16), nullable=False),
)
_APP_INSERT = text("INSERT INTO bench_app_rows (note) VALUES ('order')")


class Writes(Protocol):
    """What one system does inside the application's transaction (bench/transmit.py's systems)."""

    name: ClassVar[str]
    engine: sqlalchemy.Engine

    def write(self, session: Session, payloads: list[bytes]) -> None: ...


@dataclass
class WriterCell:
    system: str
    writers: int
    hold_ms: int
    entries: int
    seconds: float
    rate: float
    slice_rates: list[float]
    client_cpu: float = 0.0  # CPU seconds of this process over the cell's slices
    server_cpu: float = 0.0  # of the database's backends (0 when not visible)

    @property
    def per_core(self) -> float | None:
        """Entries per CPU-second (client + server): the rate one busy core carries."""
        used = self.client_cpu + self.server_cpu
        return self.entries / used if used > 0 and self.server_cpu > 0 else None


@dataclass
class WriterRatio:
    writers: int
    hold_ms: int
    baseline: str
    ratio: float
    target: float | None
    met: bool | None


def _transaction(
    engine: sqlalchemy.Engine, system: Writes, hold: float, payloads: Sequence[bytes]
) -> Callable[[], int]:
    pool = itertools.cycle(payloads)

    def step() -> int:
        with Session(engine) as session, session.begin():
            session.execute(_APP_INSERT)
            system.write(session, [next(pool)])
            if hold:
                time.sleep(hold)  # the application's own work, inside its transaction
        return 1

    return step


def _free_connections(engine: sqlalchemy.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT current_setting('max_connections')::int"
                    " - current_setting('superuser_reserved_connections')::int"
                    " - (SELECT count(*) FROM pg_stat_activity)"
                )
            ).scalar_one()
        )


def _check_connections(engine: sqlalchemy.Engine, writers: int, wait_s: float = 30.0) -> None:
    """Wait (connections just closed take a moment to go) until the server can take
    one connection per writer; fail clearly if it cannot."""
    deadline = time.monotonic() + wait_s
    while (free := _free_connections(engine)) < writers:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"{writers} writers need {writers} connections; the server has {free} free "
                "(raise max_connections, or pass a smaller --writer-counts)"
            )
        time.sleep(0.5)


def _slice(
    system: Writes,
    writers: int,
    hold_ms: int,
    payloads: Sequence[bytes],
    cpu: ServerCpu | None,
    seconds: float,
) -> Measurement:
    url = system.engine.url.render_as_string(hide_password=False)
    _check_connections(system.engine, writers)
    engine = create_engine(url, pool_size=writers, max_overflow=0)
    try:
        steps = [
            _transaction(engine, system, hold_ms / 1000, [*payloads[i:], *payloads[:i]])
            for i in range(writers)
        ]
        run_threads(0.2, steps)  # every writer's connection opened and warm
        return run_threads(seconds, steps, cpu)
    finally:
        engine.dispose()


def measure_writers(
    systems: Sequence[Writes],
    seconds: float,
    rounds: int,
    payloads: Sequence[bytes],
    console: Console,
    writer_counts: Sequence[int] = WRITER_COUNTS,
    holds_ms: Sequence[int] = HOLD_MS,
    cpu: ServerCpu | None = None,
) -> tuple[list[WriterCell], list[WriterRatio]]:
    """Every (writers, hold) cell for every system; ours against each other system.

    With ``cpu`` (the backends of the systems' database), cells record the CPU used.
    """
    for system in systems:
        app_meta.create_all(system.engine)
    cells: list[WriterCell] = []
    ratios: list[WriterRatio] = []
    for writers in writer_counts:
        for hold in holds_ms:
            console.log(f"postgresql: {writers} writer(s), hold {hold} ms")
            cases = {
                s.name: functools.partial(_slice, s, writers, hold, payloads, cpu) for s in systems
            }
            got = interleaved(cases, seconds, rounds)
            for name, m in got.items():
                cells.append(
                    WriterCell(
                        name,
                        writers,
                        hold,
                        m.count,
                        m.seconds,
                        m.rate,
                        m.slices,
                        round(m.client_cpu, 3),
                        round(m.server_cpu, 3),
                    )
                )
            if "ours" not in got:
                continue
            for baseline in (n for n in got if n != "ours"):
                value = paired_ratio(got["ours"], got[baseline])
                target = TARGET_VS_PLAIN if baseline == "plain" else None
                met = None if target is None else value >= target
                ratios.append(WriterRatio(writers, hold, baseline, value, target, met))
    return cells, ratios


def report_writers(console: Console, cells: list[WriterCell], ratios: list[WriterRatio]) -> None:
    systems = list(dict.fromkeys(c.system for c in cells))
    baselines = list(dict.fromkeys(r.baseline for r in ratios))
    rate = {(c.system, c.writers, c.hold_ms): c.rate for c in cells}
    ratio = {(r.baseline, r.writers, r.hold_ms): r.ratio for r in ratios}
    keys = sorted({(c.writers, c.hold_ms) for c in cells})
    rows = [
        [
            str(w),
            str(h),
            *(fmt_rate(rate.get((s, w, h))) for s in systems),
            *(
                fmt_ratio(ratio.get((b, w, h)), TARGET_VS_PLAIN if b == "plain" else None)
                for b in baselines
            ),
        ]
        for w, h in keys
    ]
    print_table(
        console,
        "Concurrent writers, PostgreSQL: transactions/s (app row + one 1 KiB entry, held open)",
        ["writers", "hold ms", *systems, *(f"ours/{b}" for b in baselines)],
        rows,
        caption=f"target: ours/plain >= {TARGET_VS_PLAIN} in every cell",
    )
    per_core = {(c.system, c.writers, c.hold_ms): c.per_core for c in cells}
    if not any(v is not None for v in per_core.values()):
        return  # the server's backends were not visible
    rows = [
        [str(w), str(h), *(fmt_rate(per_core.get((s, w, h))) for s in systems)]
        for w, h in keys
        if h == 0
    ]
    print_table(
        console,
        "Per-core efficiency, PostgreSQL: entries per CPU-second, one entry per transaction",
        ["writers", "hold ms", *systems],
        rows,
        caption="CPU: this process plus the PostgreSQL backends of the benchmark's database "
        "(/proc/<pid>/stat); the entries/s one fully used core would carry",
    )


__all__ = [
    "HOLD_MS",
    "WRITER_COUNTS",
    "WriterCell",
    "WriterRatio",
    "measure_writers",
    "report_writers",
]
