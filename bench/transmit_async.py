"""Async transmit throughput: ``AsyncRoutingQueueClient`` against a plain async INSERT.

    python bench/transmit.py --async [--seconds N] [--rounds R]
                             [--backend sqlite|postgresql|both] [--tasks 1,16]
                             [--out bench/results/transmit-async.json]

Entries per second with 1 KiB payloads, one entry per transaction to one
destination, from 1 and 16 concurrent tasks of one event loop, each running
``async with AsyncSession(engine) as s, s.begin()`` around its write:

  ours    ``await client.transmit_log_entry_message(s, payload, [dest])``
  plain   ``await s.execute(INSERT ...)`` of the same row (client name, payload,
          timestamp) into a bare table with an identity primary key

on every async driver of a backend: SQLite through aiosqlite (a file in a
temporary directory, engines from :func:`lr_client.aio.create_async_engine`:
WAL, synchronous=NORMAL) and PostgreSQL through psycopg's async driver and
asyncpg (a schema per system in a throwaway database, as bench/transmit.py).
Both systems of a cell use the same engine settings (a pool of as many
connections as tasks). The cases of a cell run interleaved (``--rounds``
slices each, in rotating order) and the ratio is the median of per-round
ratios, so load swings on a shared machine hit both alike. Target: ours >=
0.9x plain.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from bench.common import (
    Measurement,
    fmt_rate,
    fmt_ratio,
    interleaved,
    loadavg,
    machine_facts,
    paired_ratio,
    print_table,
    write_json,
)
from bench.transmit import (
    CLIENT_NAME,
    DESTINATIONS,
    PAYLOAD_BYTES,
    PLAIN_INSERT,
    SOURCE_ID,
    TARGET_VS_PLAIN,
    Backend,
    Slot,
    bench_meta,
    open_backend,
    plain_table,
)
from lr_client import RoutingQueueClient
from lr_client.aio import AsyncRoutingQueueClient, create_async_engine

TASK_COUNTS = (1, 16)
#: The async drivers of each backend (SQLAlchemy driver names).
DRIVERS = {
    "sqlite": {"aiosqlite": "sqlite+aiosqlite"},
    "postgresql": {"psycopg_async": "postgresql+psycopg", "asyncpg": "postgresql+asyncpg"},
}


@dataclass
class AsyncCell:
    backend: str
    driver: str
    system: str
    tasks: int
    entries: int
    seconds: float
    rate: float
    slice_rates: list[float]
    client_cpu_us_per_entry: float


@dataclass
class AsyncRatio:
    backend: str
    driver: str
    tasks: int
    system: str
    baseline: str
    ratio: float  # median of per-round ratios
    ratio_of_totals: float
    target: float
    met: bool


class AsyncSystem:
    """One way of writing a payload in an application's async transaction."""

    name = ""

    def __init__(self, slot: Slot, driver: str, pool: int) -> None:
        self.slot = slot
        url = make_url(slot.engine.url.render_as_string(hide_password=False))
        async_url = url.set(drivername=DRIVERS[slot.backend][driver])
        self.engine: AsyncEngine = create_async_engine(async_url, pool_size=pool)

    async def write(self, session: AsyncSession, payload: bytes) -> None:
        raise NotImplementedError


class AsyncOurs(AsyncSystem):
    name = "ours"

    def __init__(self, slot: Slot, driver: str, pool: int) -> None:
        super().__init__(slot, driver, pool)
        setup = RoutingQueueClient(slot.engine, SOURCE_ID, CLIENT_NAME)
        setup.store.create_schema()
        setup.register_destinations(DESTINATIONS[:1])
        self.client = AsyncRoutingQueueClient(setup.store, SOURCE_ID, CLIENT_NAME)
        self.destinations = DESTINATIONS[:1]

    async def write(self, session: AsyncSession, payload: bytes) -> None:
        await self.client.transmit_log_entry_message(session, payload, self.destinations)


class AsyncPlain(AsyncSystem):
    name = "plain"

    def __init__(self, slot: Slot, driver: str, pool: int) -> None:
        super().__init__(slot, driver, pool)
        bench_meta.create_all(slot.engine, tables=[plain_table])

    async def write(self, session: AsyncSession, payload: bytes) -> None:
        row = {"client_name": CLIENT_NAME, "payload": payload, "created_at": time.time()}
        await session.execute(PLAIN_INSERT, row)


async def run_tasks(
    system: AsyncSystem, tasks: int, seconds: float, payloads: Sequence[bytes]
) -> Measurement:
    """``tasks`` tasks, each one transaction of one entry after another, for ``seconds``."""
    counts = [0] * tasks
    deadline = time.perf_counter() + seconds

    async def task(i: int) -> None:
        pool = itertools.cycle([*payloads[i:], *payloads[:i]])
        while True:
            async with AsyncSession(system.engine) as session, session.begin():
                await system.write(session, next(pool))
            counts[i] += 1
            if time.perf_counter() >= deadline:
                return

    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(tasks)))
    elapsed = time.perf_counter() - start
    m = Measurement(count=sum(counts), seconds=elapsed)
    m.client_cpu = time.process_time() - cpu
    return m


def measure_driver(
    backend: Backend,
    driver: str,
    seconds: float,
    rounds: int,
    task_counts: Sequence[int],
    payloads: Sequence[bytes],
) -> tuple[list[AsyncCell], list[AsyncRatio]]:
    """Ours and plain on one driver, at each task count, interleaved."""
    cells: list[AsyncCell] = []
    ratios: list[AsyncRatio] = []
    pool = max(task_counts)
    with asyncio.Runner() as runner:
        systems: list[AsyncSystem] = [
            kind(backend.slot(), driver, pool) for kind in (AsyncOurs, AsyncPlain)
        ]
        try:
            for tasks in task_counts:

                def case(s: AsyncSystem, t: int, secs: float) -> Measurement:
                    return runner.run(run_tasks(s, t, secs, payloads))

                warm = min(0.3, seconds / 10)
                for s in systems:
                    case(s, tasks, warm)
                got = interleaved(
                    {s.name: functools.partial(case, s, tasks) for s in systems}, seconds, rounds
                )
                for name, m in got.items():
                    cells.append(
                        AsyncCell(
                            backend.name,
                            driver,
                            name,
                            tasks,
                            m.count,
                            m.seconds,
                            m.rate,
                            m.slices,
                            1e6 * m.client_cpu / m.count,
                        )
                    )
                ours, plain = got["ours"], got["plain"]
                ratio = paired_ratio(ours, plain)
                ratios.append(
                    AsyncRatio(
                        backend.name,
                        driver,
                        tasks,
                        "ours",
                        "plain",
                        ratio,
                        ours.rate / plain.rate,
                        TARGET_VS_PLAIN,
                        ratio >= TARGET_VS_PLAIN,
                    )
                )
        finally:
            for s in systems:
                runner.run(_dispose(s.engine))
    return cells, ratios


def _dispose(engine: AsyncEngine) -> Awaitable[None]:
    return engine.dispose()


def report(console: Console, cells: list[AsyncCell], ratios: list[AsyncRatio]) -> None:
    rate = {(c.backend, c.driver, c.system, c.tasks): c for c in cells}
    rows = [
        [
            r.backend,
            r.driver,
            str(r.tasks),
            fmt_rate(rate[(r.backend, r.driver, "ours", r.tasks)].rate),
            fmt_rate(rate[(r.backend, r.driver, "plain", r.tasks)].rate),
            fmt_ratio(r.ratio, r.target),
        ]
        for r in ratios
    ]
    print_table(
        console,
        "Async transmit throughput (entries/s, 1 entry/txn, 1 destination)",
        ["db", "driver", "tasks", "ours", "plain", "ours/plain"],
        rows,
        caption=f"target: ours >= {TARGET_VS_PLAIN}x plain (median of per-round ratios)",
        left=2,
    )


def run(
    args: argparse.Namespace,
    names: Sequence[str],
    pg_url: str,
    console: Console,
    payloads: Sequence[bytes],
) -> dict[str, Any]:
    """Measure every async driver of ``names``; the JSON result (also written to ``args.out``)."""
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "transmit-async",
        "format": 1,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "seconds_per_case": args.seconds,
            "rounds": args.rounds,
            "payload_bytes": PAYLOAD_BYTES,
            "entries_per_txn": 1,
            "destinations": 1,
            "tasks": list(args.tasks),
            "backends": list(names),
        },
        "machine": machine_facts(),
        "targets": {"ours_vs_plain_at_least": TARGET_VS_PLAIN},
    }
    cells: list[AsyncCell] = []
    ratios: list[AsyncRatio] = []
    for name in names:
        for driver in DRIVERS[name]:
            with open_backend(name, pg_url) as backend:
                console.log(f"{name} ({driver}): {', '.join(map(str, args.tasks))} task(s)")
                c, r = measure_driver(
                    backend, driver, args.seconds, args.rounds, args.tasks, payloads
                )
                cells += c
                ratios += r
    result["results"] = [asdict(c) for c in cells]
    result["ratios"] = [asdict(r) for r in ratios]
    result["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    result["machine"]["loadavg_at_end"] = loadavg()
    report(console, cells, ratios)
    write_json(args.out, result)
    return result


__all__ = ["DRIVERS", "TASK_COUNTS", "AsyncCell", "AsyncRatio", "run"]
