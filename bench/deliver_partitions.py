"""Delivery by partition: entries/s of one receive queue with 1, 2, 4, 8 partitions.

    python bench/deliver_partitions.py [--entries N] [--batch-size B] [--keys K]
                                       [--partitions 1,2,4,8] [--sleep-ms 5]
                                       [--backend sqlite|postgresql|both]
                                       [--out bench/results/deliver_partitions.json]

A receive queue is filled (untimed, through ``apply_log_batch``) with
``--entries`` log entries of 256-byte payloads, each with one of ``--keys``
partition keys, then delivered by ``RoutingQueueSubscriber.run`` with
``partitions = N`` (N worker threads); the rate is entries per second of
wall time until the queue is empty. Listeners:

* ``io``: waits ``--sleep-ms`` per batch (a listener bound by a remote call);
* ``insert``: inserts one application row per entry through its session.

SQLite: a file in a temporary directory; PostgreSQL: a throwaway schema on
``LR_BENCH_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from sqlalchemy import Column, Integer, LargeBinary, MetaData, String, Table, insert  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    Measurement,
    fmt_rate,
    machine_facts,
    print_table,
    queue_store,
    write_json,
)
from lr_client import (  # noqa: E402
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
)
from lr_client.records import ReplicationType, WireEntry  # noqa: E402
from lr_client.store import SQLAlchemyQueueStore  # noqa: E402

CLIENT = "bench"
app_meta = MetaData()
app_rows = Table(
    "bench_applied",
    app_meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pkey", String(64), nullable=False),
    Column("position", Integer, nullable=False),
    Column("payload", LargeBinary, nullable=False),
)


class IoListener(RoutingQueueListener):
    """Waits a fixed time per batch, as a listener calling a remote service.

    Counts the messages it is given, so the drain waits on an event rather than
    polling the queue's depth all along (the polls took CPU from the workers).
    """

    def __init__(self, sleep: float, expect: int = 0) -> None:
        self.sleep = sleep
        self.expect = expect
        self.seen = 0
        self.lock = threading.Lock()
        self.all_seen = threading.Event()

    def count(self, messages: Sequence[RoutingQueueMessage]) -> None:
        with self.lock:
            self.seen += len(messages)
            if self.seen >= self.expect:
                self.all_seen.set()

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        time.sleep(self.sleep)
        self.count(messages)
        return True

    def on_error(self, error: BaseException) -> None:
        pass


class InsertListener(IoListener):
    """One application row per entry, through the delivery's session."""

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        session.execute(
            insert(app_rows),
            [
                {
                    "pkey": (m.key or b"").decode(),
                    "position": m.source_position,
                    "payload": m.payload,
                }
                for m in messages
            ],
        )
        self.count(messages)
        return True


def fill(
    store: SQLAlchemyQueueStore, source: str, entries: int, keys: int, client: str = CLIENT
) -> None:
    payload = b"x" * 256
    for first in range(1, entries + 1, 1000):
        batch = [
            WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, payload, key=b"k%d" % (p % keys))
            for p in range(first, min(first + 1000, entries + 1))
        ]
        store.recv.apply_log_batch(source, client, batch)


def drain(
    store: SQLAlchemyQueueStore,
    listener: IoListener,
    partitions: int,
    batch: int,
    client: str = CLIENT,
) -> float:
    sub = RoutingQueueSubscriber(
        store, client, listener, partitions=partitions, batch_size=batch, poll_interval=0.01
    )
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop,))
    started = time.perf_counter()
    runner.start()
    try:
        listener.all_seen.wait()  # every entry given once at least: the last commits follow
        while store.inspection.queue_depths():
            time.sleep(0.005)
        return time.perf_counter() - started
    finally:
        stop.set()
        runner.join()


@contextlib.contextmanager
def backend_store(name: str, pg_url: str) -> Iterator[SQLAlchemyQueueStore]:
    with queue_store(name, pg_url, "deliver_partitions") as (store, _schema):
        yield store


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", default="1,2,4,8")
    parser.add_argument("--sleep-ms", type=float, default=5.0)
    parser.add_argument("--listeners", default="io,insert")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "deliver_partitions.json"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    counts = [int(n) for n in args.partitions.split(",")]
    results: dict[str, Any] = {}
    rows: list[list[str]] = []
    for backend in backends:
        with backend_store(backend, pg_url) as store:
            store.create_schema()
            app_meta.create_all(store.engine)
            for kind in args.listeners.split(","):
                base = None
                for n, count in enumerate(counts):
                    listener = (
                        IoListener(args.sleep_ms / 1000, args.entries)
                        if kind == "io"
                        else InsertListener(0.0, args.entries)
                    )
                    # A client (so a queue) per run: a subscriber with another partition
                    # count leaves the earlier runs' queues alone (it would refuse one
                    # whose partitions were stopped apart, PartitionCountError).
                    source = f"{kind}-{count}-{n}"
                    client = f"{CLIENT}-{source}"
                    fill(store, source, args.entries, args.keys, client)
                    load = os.getloadavg()[0]
                    cpu = time.process_time()
                    seconds = drain(store, listener, count, args.batch_size, client)
                    cpu = time.process_time() - cpu
                    m = Measurement(args.entries, seconds)
                    base = base or m.rate
                    results[f"{backend}/{kind}/{count}"] = {
                        "entries": args.entries,
                        "seconds": seconds,
                        "rate": m.rate,
                        "speedup": m.rate / base,
                        "load1_at_start": load,
                        # CPU of this process (every thread) per listener batch's worth
                        # of entries: the client's side of a batch.
                        "cpu_ms_per_batch": 1000 * cpu * args.batch_size / args.entries,
                    }
                    rows.append(
                        [
                            backend,
                            kind,
                            str(count),
                            fmt_rate(m.rate),
                            f"{m.rate / base:.2f}x",
                            f"{1000 * cpu * args.batch_size / args.entries:.2f}",
                            f"{load:.1f}",
                        ]
                    )
    print_table(
        console,
        "delivery by partition",
        ["backend", "listener", "partitions", "entries/s", "vs 1", "cpu ms/batch", "load"],
        rows,
    )
    write_json(
        args.out,
        {
            "benchmark": "deliver_partitions",
            "at": datetime.now(UTC).isoformat(),
            "machine": machine_facts(),
            "args": {k: str(v) for k, v in vars(args).items()},
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
