"""A subscriber process for the reliability tests.

Its listener writes one ``app_applied`` row per message (and per snapshot
start / end) through the session it is given. ``--block-in CALLBACK
--block-at N`` makes the N-th call of that callback write its rows, create
``--marker`` (holding the batch's positions as JSON) and hang, so a test can
SIGKILL it mid-callback. ``--exit-when-empty`` ends the process once every
receive queue of the client is empty; ``--release-every-poll`` gives the
leases up after each poll so competing processes trade queues constantly.
``--api aio`` runs the async subscriber (``AsyncRoutingQueueSubscriber``, the
same listener awaited, see :mod:`tests.kit.aio`) in an event loop, through
``--driver`` (PostgreSQL: psycopg or asyncpg). ``--partitions N`` (N > 1)
delivers by partition with N worker threads (:meth:`RoutingQueueSubscriber.run`),
or N tasks with ``--api aio``;
``--sleep S`` makes each log batch wait up to S seconds at random (an I/O-bound
listener). ``--poison P,Q`` makes a log batch holding one of those positions raise
(before it writes or counts as a call); ``--park-after N`` runs the subscriber
with the ``park`` failure policy, ``max_attempts=N``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.orm import Session

from lr_client import (
    FailurePolicy,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
)
from lr_client.aio import AsyncRoutingQueueSubscriber
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store

app_metadata = MetaData()
app_applied = Table(
    "app_applied",
    app_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("owner", String(128), nullable=False),
    Column("source_id", String(63), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("snapshot_id", String(64), nullable=False),
    Column("position", Integer, nullable=False),
    Column("pkey", String(64)),  # the message's partition key (NULL: none)
)


class AppListener(RoutingQueueListener):
    def __init__(
        self, owner: str, block_in: str, block_at: int, marker: Path | None, sleep: float = 0.0
    ) -> None:
        self.owner = owner
        self.sleep = sleep
        self.delivered = 0
        self.lock = threading.Lock()
        self.block_in = block_in
        self.block_at = block_at
        self.marker = marker
        self.calls: dict[str, int] = {}
        self.poison: set[int] = set()

    def _write(
        self,
        session: Session,
        callback: str,
        kind: str,
        source: str,
        rows: list[tuple[str, int]],
        keys: Sequence[bytes | None] = (),
    ) -> None:
        if rows:
            session.execute(
                insert(app_applied),
                [
                    {
                        "owner": self.owner,
                        "source_id": source,
                        "kind": kind,
                        "snapshot_id": sid,
                        "position": pos,
                        "pkey": key.decode() if key else None,
                    }
                    for (sid, pos), key in zip(rows, keys or [None] * len(rows), strict=True)
                ],
            )
        with self.lock:
            self.calls[callback] = self.calls.get(callback, 0) + 1
        if callback == self.block_in and self.calls[callback] == self.block_at:
            session.flush()
            assert self.marker is not None
            tmp = self.marker.with_suffix(".tmp")
            tmp.write_text(json.dumps({"kind": kind, "source": source, "rows": rows}))
            tmp.rename(self.marker)
            while True:  # hang inside the callback, rows written, until killed
                time.sleep(60)

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._write(session, "on_full_sync_start", "start", source_id, [(snapshot_id, 0)])

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._write(session, "on_full_sync_end", "end", source_id, [(snapshot_id, 0)])

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        rows = [(m.snapshot_id, m.source_position) for m in messages]
        self._write(session, "process_full_sync", "full_sync", source_id, rows)
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        rows = [("", m.source_position) for m in messages]
        bad = self.poison & {m.source_position for m in messages}
        if bad:
            raise RuntimeError(f"poisoned: {sorted(bad)}")
        if self.sleep:
            time.sleep(random.random() * self.sleep)
        self._write(
            session,
            "process_log_entries",
            "log_entries",
            source_id,
            rows,
            [m.key for m in messages],
        )
        return True

    def on_error(self, error: BaseException) -> None:
        print(f"on_error: {error}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--client", default="policy")
    parser.add_argument("--owner", required=True)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--snapshot-batch-size", type=int, default=0, help="default: --batch-size")
    parser.add_argument("--block-in", default="")
    parser.add_argument("--block-at", type=int, default=1)
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--exit-when-empty", action="store_true")
    parser.add_argument("--release-every-poll", action="store_true")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--api", choices=["sync", "aio"], default="sync")
    parser.add_argument("--driver", default=None, help="aio on PostgreSQL: psycopg or asyncpg")
    parser.add_argument("--poison", default="", help="positions whose log batches raise")
    parser.add_argument("--park-after", type=int, default=0, help="park after N attempts")
    args = parser.parse_args(argv)

    engine = create_engine(args.url)
    store = open_store(engine)
    listener = AppListener(args.owner, args.block_in, args.block_at, args.marker, args.sleep)
    listener.poison = {int(p) for p in args.poison.split(",") if p}
    policy = FailurePolicy("park", args.park_after) if args.park_after else None
    delivered = 0
    if args.partitions > 1:
        return run_partitioned(args, store, listener, engine)
    if args.api == "aio":
        try:
            return asyncio.run(run_async(args, store, listener))
        finally:
            engine.dispose()
    store_is_empty(store)  # connected, the store's queries run once: the idle size
    idle_peak = peak_rss()
    try:
        with RoutingQueueSubscriber(
            store,
            args.client,
            listener,
            batch_size=args.batch_size,
            snapshot_batch_size=args.snapshot_batch_size or args.batch_size,
            max_batches=3,
            owner=args.owner,
            lease_seconds=args.lease_seconds,
            retry_initial=0.05,
            failure_policy=policy,
        ) as sub:
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                n = sub.poll_once()
                delivered += n
                if args.release_every_poll:
                    sub.release_leases()
                if n == 0:
                    if args.exit_when_empty and store_is_empty(store):
                        break
                    time.sleep(0.01)
            else:
                print("timed out", file=sys.stderr)
                return 3
    finally:
        engine.dispose()
    report = {"owner": args.owner, "pid": os.getpid(), "delivered": delivered}
    report |= {"idle_peak_rss": idle_peak, "peak_rss": peak_rss()}
    print(json.dumps(report))
    return 0


def run_partitioned(
    args: argparse.Namespace, store: SQLAlchemyQueueStore, listener: AppListener, engine: object
) -> int:
    """Deliver with worker threads (``run``) until the queues are empty or the timeout."""
    if args.api == "aio":
        return asyncio.run(run_partitioned_async(args, store, listener))
    stop = threading.Event()
    with RoutingQueueSubscriber(
        store,
        args.client,
        listener,
        batch_size=args.batch_size,
        max_batches=3,
        owner=args.owner,
        lease_seconds=args.lease_seconds,
        retry_initial=0.05,
        poll_interval=0.05,
        partitions=args.partitions,
    ) as sub:
        worker = threading.Thread(target=sub.run, args=(stop,))
        worker.start()
        deadline = time.monotonic() + args.timeout
        try:
            while time.monotonic() < deadline:
                if args.exit_when_empty and store_is_empty(store):
                    break
                time.sleep(0.05)
            else:
                print("timed out", file=sys.stderr)
                return 3
        finally:
            stop.set()
            worker.join()
    print(json.dumps({"owner": args.owner, "pid": os.getpid(), "delivered": -1}))
    return 0


async def run_partitioned_async(
    args: argparse.Namespace, store: SQLAlchemyQueueStore, listener: AppListener
) -> int:
    """Deliver with the async subscriber's partition tasks (``run``) until the queues are
    empty or the timeout."""
    from tests.kit.aio import AsAsync, async_engine  # the test kit: not needed by sync runs

    engine = async_engine(args.url, args.driver)
    stop = asyncio.Event()
    try:
        async with AsyncRoutingQueueSubscriber(
            engine,
            args.client,
            AsAsync(listener),
            batch_size=args.batch_size,
            max_batches=3,
            owner=args.owner,
            lease_seconds=args.lease_seconds,
            retry_initial=0.05,
            poll_interval=0.05,
            partitions=args.partitions,
        ) as sub:
            task = asyncio.create_task(sub.run(stop))
            deadline = time.monotonic() + args.timeout
            try:
                while time.monotonic() < deadline:
                    if args.exit_when_empty and await asyncio.to_thread(store_is_empty, store):
                        break
                    await asyncio.sleep(0.05)
                else:
                    print("timed out", file=sys.stderr)
                    return 3
            finally:
                stop.set()
                await task
    finally:
        await engine.dispose()
    print(json.dumps({"owner": args.owner, "pid": os.getpid(), "delivered": -1}))
    return 0


async def run_async(
    args: argparse.Namespace, store: SQLAlchemyQueueStore, listener: AppListener
) -> int:
    """Deliver with the async subscriber until the queues are empty or the timeout."""
    from tests.kit.aio import AsAsync, async_engine  # the test kit: not needed by sync runs

    engine = async_engine(args.url, args.driver)
    delivered = 0
    try:
        sub = AsyncRoutingQueueSubscriber(
            engine,
            args.client,
            AsAsync(listener),
            batch_size=args.batch_size,
            snapshot_batch_size=args.snapshot_batch_size or args.batch_size,
            max_batches=3,
            owner=args.owner,
            lease_seconds=args.lease_seconds,
            retry_initial=0.05,
        )
        async with sub:
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                n = await sub.poll_once()
                delivered += n
                if args.release_every_poll:
                    await sub.release_leases()
                if n == 0:
                    if args.exit_when_empty and await asyncio.to_thread(store_is_empty, store):
                        break
                    await asyncio.sleep(0.01)
            else:
                print("timed out", file=sys.stderr)
                return 3
    finally:
        await engine.dispose()
    print(json.dumps({"owner": args.owner, "pid": os.getpid(), "delivered": delivered}))
    return 0


def peak_rss() -> int:
    """This process's peak resident size so far (``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def store_is_empty(store: SQLAlchemyQueueStore) -> bool:
    return not store.inspection.queue_depths()  # nothing undelivered


if __name__ == "__main__":
    sys.exit(main())
