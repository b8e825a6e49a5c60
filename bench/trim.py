"""What the SQLite trim costs per entry, against a raw delete of the same rows.

    python bench/trim.py [--entries 100000] [--destinations 1,8] [--rounds 3]
                         [--json bench/results/trim.json]

On SQLite the send queue is trimmed row by row (PostgreSQL retires whole slots: a
partition dropped, nothing per entry). Per count of destinations, a store is filled
with ``--entries`` entries of 1 KiB, each naming every destination (transactions of
500, untimed), every destination's cursor is set to the head, then:

* ``trim``: ``store.retention.trim()`` with the server's batch (5,000 entries per
  transaction) until nothing is left: it reads the acknowledgements, judges each
  entry by the destinations it names, deletes, and records each stream's trim mark;
* ``raw``: the same rows deleted by position ranges of 5,000 in the driver's own
  ``DELETE``, one transaction each: nothing judged, nothing recorded (the floor).

Both run ``--rounds`` times in turns (raw, trim, trim, raw, ...), each on a fresh
file; the report gives the median CPU (this process's ``process_time``) per 1,000
entries and the trim's ratio to the raw delete. No target: it shows where the trim's
cost stands against the least any trim could cost.
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

from bench.common import fmt_ratio, machine_facts, print_table, queue_store, write_json  # noqa: E402
from lr_client.store import SQLAlchemyQueueStore  # noqa: E402

CLIENT = "bench"
#: Entries per transaction while filling.
FILL_BATCH = 500
#: Entries per trim transaction (the server's ``[retention] trim_batch``).
TRIM_BATCH = 5000
PAYLOAD_BYTES = 1024


def fill(store: SQLAlchemyQueueStore, entries: int, destinations: int) -> int:
    """``entries`` entries naming every destination, all acknowledged; the head."""
    names = [f"d{i}" for i in range(destinations)]
    nums = store.sites.register_sites(names)
    entry = (os.urandom(PAYLOAD_BYTES), [nums[n] for n in names])
    left = entries
    while left > 0:
        n = min(FILL_BATCH, left)
        with store.write() as conn:
            store.send.append_log_entries(conn, CLIENT, [entry] * n)
        left -= n
    head = store.send.head_position()
    for name in names:
        store.shipping.set_cursor(name, CLIENT, head)
    return head


def run_trim(store: SQLAlchemyQueueStore, head: int) -> int:
    done = store.retention.trim(TRIM_BATCH)
    if store.retention.trimmed_through("d0", CLIENT) != head:
        raise AssertionError("the trim did not reach the head")
    return done


def run_raw(store: SQLAlchemyQueueStore, head: int) -> int:
    raw = store.engine.raw_connection()
    try:
        db = raw.driver_connection
        assert db is not None
        done, low = 0, 0
        while low < head:
            high = min(head, low + TRIM_BATCH)
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute(
                "DELETE FROM lrq_send_log_entries WHERE position > ? AND position <= ?",
                (low, high),
            )
            done += cur.rowcount
            db.execute("COMMIT")
            low = high
        return done
    finally:
        raw.close()


def measure_once(kind: str, entries: int, destinations: int) -> float:
    """CPU seconds per 1,000 entries of one ``kind`` on a fresh file."""
    with queue_store("sqlite", "", f"trim_{kind}") as (store, _):
        store.create_schema()
        head = fill(store, entries, destinations)
        start = time.process_time()
        done = (run_trim if kind == "trim" else run_raw)(store, head)
        used = time.process_time() - start
    if done != entries:
        raise AssertionError(f"{kind} deleted {done} of {entries} entries")
    return used * 1000 / entries


def measure(entries: int, destinations: int, rounds: int) -> dict[str, Any]:
    took: dict[str, list[float]] = {"raw": [], "trim": []}
    for i in range(rounds):
        order = ("raw", "trim") if i % 2 == 0 else ("trim", "raw")
        for kind in order:
            took[kind].append(measure_once(kind, entries, destinations))
    raw, trim = statistics.median(took["raw"]), statistics.median(took["trim"])
    return {
        "destinations": destinations,
        "entries": entries,
        "raw_cpu_ms_per_1k": round(raw * 1e3, 2),
        "trim_cpu_ms_per_1k": round(trim * 1e3, 2),
        "trim_vs_raw": round(trim / raw, 3),
        "rounds": {k: [round(v * 1e3, 2) for v in vs] for k, vs in took.items()},
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--destinations", default="1,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "trim.json")
    args = p.parse_args(argv)
    args.counts = [int(x) for x in args.destinations.split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cells = [measure(args.entries, d, args.rounds) for d in args.counts]
    result = {
        "benchmark": "trim",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {"entries": args.entries, "rounds": args.rounds, "batch": TRIM_BATCH},
        "machine": machine_facts(),
        "results": {"sqlite": cells},
    }
    console = Console(width=100)
    print_table(
        console,
        f"SQLite trim of {args.entries:,} acknowledged entries: CPU ms per 1,000 (median)",
        ["destinations", "raw delete", "trim", "trim / raw"],
        [
            [
                str(c["destinations"]),
                f"{c['raw_cpu_ms_per_1k']:.2f}",
                f"{c['trim_cpu_ms_per_1k']:.2f}",
                fmt_ratio(c["trim_vs_raw"]),
            ]
            for c in cells
        ],
        caption="raw: DELETE by position ranges of 5,000, nothing judged or recorded",
    )
    write_json(args.json, result)
    console.print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
