"""What one destination's read costs while other destinations' entries are queued.

    python bench/dest_read.py [--backend sqlite|postgresql|both]
                              [--others 0,100000,1000000] [--reads 200]
                              [--json bench/results/dest_read.json]

The seed's stream tags: a sender session reads its destination's entries by the
destination's tag (a partial index per destination: PostgreSQL's made at
registration, SQLite's by the first read that walks many entries of others), so its
read must cost the same whatever other destinations hold. Per backend, a store with
destinations ``b`` and ``c``: 5 entries for ``b`` are transmitted first, then
entries for ``c`` only, up to each ``--others`` count in turn (untimed, in
transactions of 10,000, then sequenced and analyzed). At each count, the session's
read of ``b`` after its cursor (0, so the read must also find that nothing of ``b``
follows its 5 entries) is timed ``--reads`` times; the report gives the median and
p99 and the median's ratio to the same read with no other entries (the control,
measured in the same run), and the first read after the fill apart (SQLite makes
``b``'s partial index in it, the first time others' entries outnumber ``b``'s: a
pass over the send queue, once).
Target (reported, never asserted): **<= 2x the control at every count**.
SQLite: a file in a temporary directory; PostgreSQL: a throwaway schema on
``LR_BENCH_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    fmt_ratio,
    machine_facts,
    print_table,
    queue_store,
    write_json,
)
from lr_client import LRMessageWithDestinations, RoutingQueueClient  # noqa: E402
from lr_client.store import SQLAlchemyQueueStore  # noqa: E402

CLIENT = "bench"
#: Entries of ``b``, transmitted before any other.
OWN = 5
#: Entries per transaction while filling.
FILL_BATCH = 10_000
#: The read's limit (a session's batch).
LIMIT = 100
#: Target: a read costs at most this times the read with no other entries queued.
TARGET = 2.0


def fill(store: SQLAlchemyQueueStore, client: RoutingQueueClient, count: int) -> None:
    """Transmit ``count`` entries for ``c`` (untimed), then sequence and analyze."""
    message = LRMessageWithDestinations(b"o" * 64, ["c"])
    left = count
    while left > 0:
        n = min(FILL_BATCH, left)
        with store.engine.begin() as conn:
            client.transmit_log_entry_messages(conn, [message] * n)
        left -= n
    store.send.sequence()
    store.send.analyze()


def time_reads(store: SQLAlchemyQueueStore, reads: int) -> tuple[float, list[float]]:
    """Seconds of the first read of ``b``'s entries after position 0 (on SQLite, where
    others' entries outnumber ``b``'s, it makes ``b``'s index), then of each of
    ``reads`` more."""
    start = time.perf_counter()
    store.shipping.read_log_entries("b", CLIENT, 0, LIMIT)
    first = time.perf_counter() - start
    took = []
    for _ in range(5):  # warm: statement caches, pages
        store.shipping.read_log_entries("b", CLIENT, 0, LIMIT)
    for _ in range(reads):
        start = time.perf_counter()
        entries = store.shipping.read_log_entries("b", CLIENT, 0, LIMIT)
        took.append(time.perf_counter() - start)
        if len(entries) != OWN:
            raise AssertionError(f"read {len(entries)} entries of b, not {OWN}")
    return first, took


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def measure(backend: str, pg_url: str, levels: Sequence[int], reads: int) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    with queue_store(backend, pg_url, "dest_read") as (store, _schema):
        store.create_schema()
        client = RoutingQueueClient(store, "bench-src", CLIENT)
        client.register_destinations(["b", "c"])
        with store.engine.begin() as conn:
            client.transmit_log_entry_messages(
                conn, [LRMessageWithDestinations(b"mine", ["b"])] * OWN
            )
        queued = 0
        control: float | None = None
        for level in levels:
            fill(store, client, level - queued)
            queued = level
            first, took = time_reads(store, reads)
            median = statistics.median(took)
            control = median if control is None else control
            cells.append(
                {
                    "others": level,
                    "first_ms": round(first * 1e3, 3),
                    "median_ms": round(median * 1e3, 3),
                    "p99_ms": round(p99(took) * 1e3, 3),
                    "vs_control": round(median / control, 3),
                }
            )
    return cells


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--others", default="0,100000,1000000")
    p.add_argument("--reads", type=int, default=200)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "dest_read.json")
    args = p.parse_args(argv)
    args.levels = sorted({int(x) for x in args.others.split(",")})
    if args.levels[0] != 0:
        args.levels.insert(0, 0)  # the control
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    names = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    result: dict[str, Any] = {
        "benchmark": "dest_read",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {"levels": args.levels, "reads": args.reads, "own": OWN, "limit": LIMIT},
        "machine": machine_facts(),
        "target_vs_control_at_most": TARGET,
        "results": {},
    }
    rows: list[list[str]] = []
    for name in names:
        cells = measure(name, pg_url, args.levels, args.reads)
        result["results"][name] = cells
        for c in cells:
            rows.append(
                [
                    name,
                    f"{c['others']:,}",
                    f"{c['first_ms']:.1f}",
                    f"{c['median_ms']:.3f}",
                    f"{c['p99_ms']:.3f}",
                    fmt_ratio(c["vs_control"], TARGET, at_most=True),
                ]
            )
    console = Console(width=100)
    print_table(
        console,
        f"A destination's read of its {OWN} entries among others' (ms)",
        ["backend", "others queued", "first read", "median", "p99", "vs 0 others"],
        rows,
        caption=f"target: <= {TARGET:g}x the read with no other entries",
    )
    write_json(args.json, result)
    console.print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
