"""Delivery throughput: ``RoutingQueueSubscriber`` against reading + deleting with plain SQL.

    python bench/deliver.py [--entries N] [--batch-size B] [--rounds R] [--async]
                            [--cases C,...] [--backend sqlite|postgresql|both]
                            [--out bench/results/deliver.json]

A receive queue is pre-filled (untimed, through ``apply_log_batch``) with
``--entries`` log entries of 256-byte payloads, then drained; the rate is
entries per second of wall time until the queue is empty. Cases:

* ``raw``: one transaction per batch: ``SELECT ... ORDER BY seq LIMIT B`` then
  ``DELETE`` of those rows (plain SQL, same engine and batch size);
* ``raw+insert``: the same plus one INSERT per entry into an application table
  (an executemany in the same transaction);
* ``noop``: the subscriber, with a listener that returns True;
* ``insert``: the subscriber, with a listener that inserts one application row per
  entry through the session it is given (the same executemany).

With ``--async``, two more: ``aio-noop`` and ``aio-insert``, the same listeners
awaited by ``AsyncRoutingQueueSubscriber`` (aiosqlite; PostgreSQL through
psycopg's async driver) in one event loop, and on PostgreSQL the same through
asyncpg (``aio-noop-asyncpg``, ``aio-insert-asyncpg``); target: at least
``ASYNC_TARGET`` of the sync subscriber's rate. ``--cases`` runs only the cases
named (a ratio needs both of its cases).

Each case drains ``--entries`` in total, as ``--rounds`` slices in rotating
order (the queue is refilled before each slice, untimed), so load drift on a
shared machine hits every case alike; a ratio is the median of the per-round
ratios of the two cases' rates (``ratios_of_totals``: of their total rates).
PostgreSQL tables are VACUUMed after each refill, also untimed. SQLite: a file
in a temporary directory; PostgreSQL: a throwaway schema on ``LR_BENCH_PG_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from sqlalchemy import Column, Integer, LargeBinary, MetaData, String, Table, insert, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    Measurement,
    fmt_rate,
    fmt_ratio,
    machine_facts,
    paired_ratio,
    pg_facts,
    print_table,
    queue_store,
    quote_ident,
    write_json,
)
from lr_client import (  # noqa: E402
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
)
from lr_client.aio import (  # noqa: E402
    AsyncRoutingQueueListener,
    AsyncRoutingQueueSubscriber,
    create_async_engine,
)
from lr_client.records import ReplicationType, WireEntry  # noqa: E402
from lr_client.store import SQLAlchemyQueueStore  # noqa: E402

PAYLOAD_BYTES = 256
SOURCE_ID = "bench-src"
CLIENT_NAME = "bench"
CASES = ("raw", "raw+insert", "noop", "insert")
ASYNC_CASES = ("aio-noop", "aio-insert")
#: The async cases through asyncpg (PostgreSQL only).
ASYNCPG_CASES = ("aio-noop-asyncpg", "aio-insert-asyncpg")
#: The async drivers of PostgreSQL, by the suffix of their cases.
PG_ASYNC_DRIVERS = {"": "postgresql+psycopg", "-asyncpg": "postgresql+asyncpg"}
#: (ratio, case, baseline): each reported when both cases ran.
RATIOS = (
    ("noop_vs_raw", "noop", "raw"),
    ("insert_vs_raw", "insert", "raw"),
    ("insert_vs_raw_insert", "insert", "raw+insert"),
    ("aio_noop_vs_noop", "aio-noop", "noop"),
    ("aio_insert_vs_insert", "aio-insert", "insert"),
    ("aio_noop_asyncpg_vs_noop", "aio-noop-asyncpg", "noop"),
    ("aio_insert_asyncpg_vs_insert", "aio-insert-asyncpg", "insert"),
)
#: Target: the subscriber delivers at least half the raw read+delete rate.
TARGET = 0.5
#: Target: the async subscriber delivers at least this share of the sync one's rate.
ASYNC_TARGET = 0.9

app_meta = MetaData()
app_table = Table(
    "bench_app",
    app_meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source_id", String(63), nullable=False),
    Column("position", Integer, nullable=False),
    Column("payload", LargeBinary, nullable=False),
)

_READ = text(
    "SELECT seq, type, source_position, snapshot_id, payload FROM lrq_recv_entries "
    "WHERE queue_id = :q AND seq > coalesce((SELECT delivered_seq FROM lrq_subscriber_state"
    " WHERE queue_id = :q), 0) ORDER BY seq LIMIT :n"
)
_DELETE = text("DELETE FROM lrq_recv_entries WHERE seq >= :lo AND seq <= :hi AND queue_id = :q")


class NoopListener(RoutingQueueListener):
    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def on_error(self, error: BaseException) -> None:
        raise RuntimeError(f"delivery failed during the benchmark: {error}") from error


class InsertListener(NoopListener):
    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        session.execute(
            insert(app_table),
            [
                {"source_id": m.source_id, "position": m.source_position, "payload": m.payload}
                for m in messages
            ],
        )
        return True


class AsyncNoop(AsyncRoutingQueueListener):
    async def process_full_sync(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    async def on_error(self, error: BaseException) -> None:
        raise RuntimeError(f"delivery failed during the benchmark: {error}") from error


class AsyncInsert(AsyncNoop):
    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        await session.execute(
            insert(app_table),
            [
                {"source_id": m.source_id, "position": m.source_position, "payload": m.payload}
                for m in messages
            ],
        )
        return True


# -- one backend -------------------------------------------------------------------------


class Bench:
    def __init__(self, store: SQLAlchemyQueueStore, batch_size: int, schema: str | None) -> None:
        self.store = store
        self.batch_size = batch_size
        self.schema = schema
        self.position = 0
        store.create_schema()
        app_meta.create_all(store.engine)
        self.payload = os.urandom(PAYLOAD_BYTES)
        self.loop: asyncio.Runner | None = None
        #: The async engines of this database, by driver suffix ("" or "-asyncpg").
        self.async_engines: dict[str, AsyncEngine] = {}

    def refill(self, count: int) -> None:
        """Append ``count`` log entries to the queue and tidy up (untimed)."""
        for first in range(self.position + 1, self.position + count + 1, 2000):
            last = min(self.position + count, first + 1999)
            self.store.recv.apply_log_batch(
                SOURCE_ID,
                CLIENT_NAME,
                [
                    WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, self.payload)
                    for p in range(first, last + 1)
                ],
            )
        self.position += count
        self.store.queues.rotate_receive_queues(period=0.0)  # what the subscriber cases delivered
        if self.schema is not None:
            with self.store.engine.connect().execution_options(
                isolation_level="AUTOCOMMIT"
            ) as conn:
                for table in ("lrq_recv_entries", "bench_app", "lrq_subscriber_state"):
                    conn.exec_driver_sql(f"VACUUM ANALYZE {quote_ident(self.schema)}.{table}")

    def queue_id(self) -> int:
        return self.store.queues.list_queues(CLIENT_NAME)[0].queue_id

    def raw(self, with_insert: bool) -> Callable[[], int]:
        qid = self.queue_id()

        def step() -> int:
            with self.store.write() as conn:
                rows = conn.execute(_READ, {"q": qid, "n": self.batch_size}).all()
                if not rows:
                    return 0
                entries = [
                    (r.seq, ReplicationType(r.type), r.source_position, r.snapshot_id, r.payload)
                    for r in rows
                ]
                if with_insert:
                    conn.execute(
                        insert(app_table),
                        [
                            {"source_id": SOURCE_ID, "position": e[2], "payload": bytes(e[4])}
                            for e in entries
                        ],
                    )
                conn.execute(_DELETE, {"lo": entries[0][0], "hi": entries[-1][0], "q": qid})
                return len(entries)

        return step

    def subscriber(self, listener: RoutingQueueListener) -> Callable[[], int]:
        sub = RoutingQueueSubscriber(
            self.store, CLIENT_NAME, listener, batch_size=self.batch_size, owner="bench"
        )
        return sub.poll_once

    def async_subscriber(
        self, listener: AsyncRoutingQueueListener, driver: str = ""
    ) -> Callable[[], int]:
        """``poll_once`` of an async subscriber, run in this bench's event loop (``driver``:
        "" for aiosqlite or psycopg's async driver, "-asyncpg")."""
        if self.loop is None:
            self.loop = asyncio.Runner()
        if driver not in self.async_engines:
            url = self.store.engine.url
            if url.get_backend_name() == "postgresql":
                url = url.set(drivername=PG_ASYNC_DRIVERS[driver])
            self.async_engines[driver] = create_async_engine(
                url.render_as_string(hide_password=False)
            )
        sub = AsyncRoutingQueueSubscriber(
            self.async_engines[driver],
            CLIENT_NAME,
            listener,
            batch_size=self.batch_size,
            owner="bench",
        )
        loop = self.loop
        return lambda: loop.run(sub.poll_once())

    def close(self) -> None:
        if self.loop is not None:
            for engine in self.async_engines.values():
                self.loop.run(engine.dispose())
            self.loop.close()

    def step_for(self, case: str) -> Callable[[], int]:
        if case.startswith("aio-"):
            driver = "-asyncpg" if case.endswith("-asyncpg") else ""
            insert = case.removesuffix(driver) == "aio-insert"
            return self.async_subscriber(AsyncInsert() if insert else AsyncNoop(), driver)
        if case == "raw":
            return self.raw(with_insert=False)
        if case == "raw+insert":
            return self.raw(with_insert=True)
        if case == "noop":
            return self.subscriber(NoopListener())
        return self.subscriber(InsertListener())

    def drain(self, case: str, count: int) -> Measurement:
        self.refill(count)
        step = self.step_for(case)
        done = 0
        start = time.perf_counter()
        while done < count:
            n = step()
            if n == 0:
                raise RuntimeError(f"{case}: queue empty after {done} of {count} entries")
            done += n
        return Measurement(done, time.perf_counter() - start)


def backend_store(
    name: str, pg_url: str
) -> contextlib.AbstractContextManager[tuple[SQLAlchemyQueueStore, str | None]]:
    return queue_store(name, pg_url, "deliver")


def measure(
    bench: Bench, entries: int, rounds: int, console: Console, cases: tuple[str, ...] = CASES
) -> dict[str, Measurement]:
    totals = {c: Measurement() for c in cases}
    per_round = max(1, entries // rounds)
    for r in range(rounds):
        order = cases[r % len(cases) :] + cases[: r % len(cases)]
        for case in order:
            m = bench.drain(case, per_round)
            totals[case].add(m)
            console.log(f"round {r + 1}/{rounds} {case}: {m.rate:,.0f} entries/s")
    return totals


def cases_of(backend: str, aio: bool, only: tuple[str, ...] | None) -> tuple[str, ...]:
    """The cases run on ``backend``: ``only`` (those that apply), else every case."""
    every = CASES + ASYNC_CASES + (ASYNCPG_CASES if backend == "postgresql" else ())
    if only is not None:
        return tuple(c for c in every if c in only)
    return every if aio else CASES


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=50_000, help="per case (default 50000)")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--async", dest="aio", action="store_true", help="also the async subscriber"
    )
    parser.add_argument(
        "--cases",
        type=lambda v: tuple(c for c in v.split(",") if c),
        default=None,
        help="only these cases, comma-separated (default: all, with --async the async ones)",
    )
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "deliver.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    console = Console(width=120)
    names = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    known = CASES + ASYNC_CASES + ASYNCPG_CASES
    unknown = [c for c in args.cases or () if c not in known]
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(unknown)} (known: {', '.join(known)})")
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "deliver",
        "format": 1,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "entries_per_case": args.entries,
            "batch_size": args.batch_size,
            "rounds": args.rounds,
            "payload_bytes": PAYLOAD_BYTES,
            "backends": names,
            "cases": {name: list(cases_of(name, args.aio, args.cases)) for name in names},
        },
        "machine": machine_facts(),
        "backend_facts": {},
        "target_vs_raw_at_least": TARGET,
        "async_target_vs_sync_at_least": ASYNC_TARGET,
        "results": {},
    }
    rows: list[list[str]] = []
    for name in names:
        cases = cases_of(name, args.aio, args.cases)
        with backend_store(name, pg_url) as (store, schema):
            if schema is not None:
                with store.engine.connect() as conn:
                    result["backend_facts"][name] = pg_facts(conn)
            bench = Bench(store, args.batch_size, schema)
            try:
                totals = measure(bench, args.entries, args.rounds, console, cases)
            finally:
                bench.close()
        rate = {c: totals[c].rate for c in cases}
        pairs = [(k, a, b) for k, a, b in RATIOS if a in cases and b in cases]
        ratios = {k: paired_ratio(totals[a], totals[b]) for k, a, b in pairs}
        result["results"][name] = {
            "cases": {
                c: {
                    "entries": totals[c].count,
                    "seconds": round(totals[c].seconds, 3),
                    "rate": round(rate[c], 1),
                    "round_rates": [round(x, 1) for x in totals[c].slices],
                }
                for c in cases
            },
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "ratios_of_totals": {k: round(rate[a] / rate[b], 3) for k, a, b in pairs},
        }
        for c in cases:
            rows.append([name, c, fmt_rate(rate[c]), ""])
        for k, a, b in pairs:
            target = ASYNC_TARGET if a.startswith("aio-") else TARGET
            rows.append([name, f"{a} / {b}", "", fmt_ratio(ratios[k], target)])
    result["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    print_table(
        console,
        f"Delivery, entries/s ({args.entries:,} per case, batch {args.batch_size}, "
        f"{PAYLOAD_BYTES}-byte payloads)",
        ["backend", "case", "entries/s", "ratio (median of rounds)"],
        rows,
        caption=f"target: subscriber >= {TARGET}x raw; async >= {ASYNC_TARGET}x sync",
    )
    write_json(args.out, result)
    console.print(f"wrote {args.out} in {result['elapsed_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
