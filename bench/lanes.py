"""Several streams per destination: entries/s over a link with added round-trip time.

    python bench/lanes.py [--entries N] [--rtt-ms 50] [--streams 1,2,4] [--repeat 3]
                          [--batch-entries 100] [--window-batches 2] [--keys 64]
                          [--out bench/results/lanes.json]

Two sites on SQLite (files in a temporary directory), each a real ``lr server``
process, as on two machines: sink ``b`` and source ``a``, which reaches ``b``
through a TCP proxy in this process adding half of ``--rtt-ms`` to each direction
(``FaultProxy(latency=...)``). The source's queue is filled first with
``--entries`` keyed entries (256-byte payloads, ``--keys`` keys), then ``a``
starts with ``streams_per_destination = K``; the rate is entries per second from
the first entry received to the last. The window is kept small
(``--batch-entries`` x ``--window-batches`` per stream) so the round trip, not
the databases, bounds one stream, as on a long link with a large backlog.
Each K runs ``--repeat`` times, the Ks taking turns; the table shows each run
and the median, and the speed-up is median over median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.common import fmt_rate, machine_facts, print_table, write_json  # noqa: E402
from lr_client import RoutingQueueClient, open_store  # noqa: E402
from lr_client.store import SQLAlchemyQueueStore  # noqa: E402
from tests.kit.procs import LrServer  # noqa: E402
from tests.kit.sites import SiteSpec, free_port, write_config  # noqa: E402
from tests.kit.tcp_proxy import FaultProxy  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--streams", default="1,2,4")
    p.add_argument("--batch-entries", type=int, default=100)
    p.add_argument("--window-batches", type=int, default=2)
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="runs of each K, taking turns")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/lanes.json")
    return p.parse_args(argv)


def run_one(args: argparse.Namespace, streams: int, tmp: Path) -> float:
    """Entries/s with ``streams`` streams per destination."""
    urls = {s: f"sqlite:///{tmp}/{s}.db" for s in ("a", "b")}
    port = free_port()
    sink = LrServer(write_config(tmp, SiteSpec("b", urls["b"], port=port, sources=["a"])), tmp)
    sink.start().wait_listening(port, 60)
    src_store, sink_store = open_store(urls["a"]), open_store(urls["b"])
    assert isinstance(src_store, SQLAlchemyQueueStore)
    assert isinstance(sink_store, SQLAlchemyQueueStore)
    src_store.create_schema()
    client = RoutingQueueClient(src_store, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    payload = b"x" * 256
    with Session(src_store.engine) as session, session.begin():
        for i in range(args.entries):
            client.transmit_log_entry_message(session, payload, ["b"], key=b"k%d" % (i % args.keys))
    proxy = FaultProxy("127.0.0.1", port, latency=args.rtt_ms / 2000).start()
    replication = (
        f"streams_per_destination = {streams}\nbatch_max_entries = {args.batch_entries}\n"
        f"window_batches = {args.window_batches}"
    )
    spec = SiteSpec("a", urls["a"], destinations=[("b", proxy.port)], replication=replication)
    source = LrServer(write_config(tmp, spec), tmp).start()
    started = time.monotonic()
    try:
        deadline = time.monotonic() + args.timeout
        first = None
        while True:
            got = sink_store.recv.sink_progress("a", "policy").entries_received
            now = time.monotonic()
            if got and first is None:
                first = (now, got)
            if got >= args.entries:
                break
            if now > deadline:
                raise TimeoutError(f"{got} of {args.entries} entries after {args.timeout} s")
            time.sleep(0.01)
        assert first is not None
        if first[1] >= got:  # everything came at once: count from the source's start
            return got / max(now - started, 1e-9)
        return (got - first[1]) / max(now - first[0], 1e-9)
    finally:
        source.stop(10)
        proxy.stop()
        sink.stop(10)
        src_store.engine.dispose()
        sink_store.engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    facts = machine_facts()
    ks = [int(n) for n in args.streams.split(",")]
    runs: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.repeat):
        for k in ks:
            with tempfile.TemporaryDirectory() as tmp:
                runs[k].append(run_one(args, k, Path(tmp)))
    base = statistics.median(runs[ks[0]])
    results: dict[str, Any] = {}
    rows: list[list[str]] = []
    for k in ks:
        rate = statistics.median(runs[k])
        results[str(k)] = {"rate": rate, "speedup": rate / base, "runs": runs[k]}
        each = ", ".join(fmt_rate(r) for r in runs[k])
        rows.append([str(k), each, fmt_rate(rate), f"{rate / base:.2f}x"])
    print_table(
        console,
        f"{args.entries} entries, +{args.rtt_ms:g} ms RTT, window "
        f"{args.window_batches} x {args.batch_entries} entries per stream",
        ["streams", "entries/s of each run", "median", "vs 1"],
        rows,
    )
    write_json(
        args.out,
        {
            "at": datetime.now(UTC).isoformat(),
            "args": vars(args) | {"out": str(args.out)},
            "machine": facts,
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
