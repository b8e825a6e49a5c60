"""What a relay hop costs: root -> branch -> leaf against root -> leaf, in the same run.

    python bench/relay.py [--backend postgresql|sqlite] [--rate N] [--seconds N]
                          [--writers N] [--per-txn N] [--entries N] [--listener-poll S]
                          [--out bench/results/relay.json]

One cascaded client (docs/cascading.md) over four real ``lr server`` processes
(plaintext gRPC on loopback with a token, replication settings at their defaults,
a metrics port each): the root ``root`` ships it to the branch ``branch`` and to the
leaf ``direct``; the branch relays it from its receive queue to the leaf ``relayed``.
Both leaves get every entry of the same load at the same time, so the two paths are
compared under the same conditions, and the hop is relayed - direct of one run. Each
site has its own database: a schema of the PostgreSQL server at ``LR_BENCH_PG_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``), or a SQLite file
(``--backend sqlite``, for a quick run). This process plays the root's application
(it transmits, 1 KiB payloads). The listeners of the branch and the leaves run in a
process each, as a node's application would (``bench.soak.run_subscriber``: a
:class:`~lr_client.RoutingQueueSubscriber` whose listener writes each entry's
position and the time it was called into ``soak_applied``, in the delivery
transaction): no listener shares an interpreter (its GIL) with the transmitting
threads or with another listener. On PostgreSQL the subscribers are woken as their
receiver commits (``wake_on_arrival``) and poll at the product's default when idle
(0.5 s); on SQLite, which has no wake-up between processes, every 5 ms
(``--listener-poll`` sets either).

* ``latency``: a paced transmitter (``bench.replicate.paced_load``) offers ``--rate``
  entries/s (1,000) for ``--seconds``, ``--per-txn`` entries per transaction (1), from
  ``--writers`` threads (16: one writer cannot commit 1,000 transactions/s on a loaded machine's
  PostgreSQL); ``achieved_rate`` says what was reached. Latency of an entry
  at a leaf = the time its listener's ``process_log_entries`` was called with it minus
  the time the root's COMMIT returned (one clock: this machine's). The receive queue's
  ``received_at`` cannot serve: at a node of a cascade it keeps the origin's time. The
  first second is warm-up, excluded. The relay hop's cost = relayed p99 - direct p99
  (and p50 - p50). Also, per entry that reached both leaves, its relayed latency
  minus its direct latency (``per_entry_hop_ms``, p10/p50/p90/p99): what the hop
  costs the same entry, apart from each path's own tail; a diagnostic, not the
  target's figure. And the run's noise (``one_hop_spread_p50_ms``/``_p99_ms``): the
  branch's own listener's latency minus the direct leaf's. Both are one hop from the
  root, sent by the same server from the same reads, so their difference holds no hop:
  it is how far a difference of two p99s moves in that run with nothing between them.
* where the time goes (``latency.stages``): the servers' own histograms over the paced
  load, read from their metrics before and after it: ``lr_relay_lag_seconds`` at the
  branch and at each leaf (the root's transmit of an entry to its store there: the
  hop's share before the leaf's listener) and ``lr_batch_latency_seconds`` of the
  root's and the branch's sessions (a batch's send to its acknowledgement); p50/p99
  interpolated within the buckets. Also the machine's CPU busy fraction
  (``/proc/stat``: every process, PostgreSQL's too) and each process's CPU seconds:
  a machine near 100 % busy queues every stage, and the figures say so.
* ``throughput``: the listeners stop, the root's server stops, ``--entries`` entries
  are transmitted (500 per transaction, ``bench.replicate.prefill``), the root's server
  starts again and both leaves drain them. A leaf's rate = the entries it received
  between the first poll that saw the drain arrive and the one that saw its last entry
  (``sink_progress`` polled every 20 ms), over that span.

Targets (reported, never asserted): a relay hop adds <= 20 ms p99 at 1,000 entries/s;
relayed throughput >= 0.8x direct.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from rich.console import Console  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    fmt_rate,
    fmt_ratio,
    loadavg,
    machine_facts,
    print_table,
    process_cpu,
    write_json,
)
from bench.replicate import (  # noqa: E402
    Databases,
    Latency,
    Source,
    code_state,
    latency_of,
    paced_load,
    percentile,
    prefill,
    stop_process,
)
from bench.soak import APPLIED, create_applied_table, last_applied, run_subscriber  # noqa: E402
from lr_client import RoutingQueueClient  # noqa: E402
from lr_client.store import SQLAlchemyQueueStore, open_store  # noqa: E402
from tests.kit.procs import LrServer  # noqa: E402
from tests.kit.sites import CascadeTree, free_port  # noqa: E402

CLIENT = "bench"
TOKEN = "token-relay-bench"
PAYLOAD_BYTES = 1024
WARMUP_SECONDS = 1.0
POLL = 0.02
#: How often the listeners' subscribers poll when idle, by backend: on PostgreSQL the
#: product's default, as they are woken as each batch is stored (wake_on_arrival); SQLite
#: has no wake-up between processes, so they poll often.
LISTENER_POLL = {"postgresql": 0.5, "sqlite": 0.005}
#: The set: node -> provider. ``direct`` is the root's child, ``relayed`` the branch's.
TREE = {"branch": "root", "direct": "root", "relayed": "branch"}
SITES = ("root", *TREE)
LEAVES = ("direct", "relayed")

#: Targets: measured and reported, never asserted.
TARGET_HOP_P99_MS = 20.0
TARGET_THROUGHPUT = 0.8


def node_config(path: Path, site: str, url: str, ports: dict[str, int]) -> Path:
    """A node's config: children as destinations, provider and children as sources
    (with addresses: reports go to the provider), the set's ``[cascade.bench]``."""
    lines = [
        "[site]",
        f'id = "{site}"',
        f'database_url = "{url}"',
        f'listen = "127.0.0.1:{ports[site]}"',
        "[security]",
        'transport = "plaintext"',
        'client_auth = "token"',
        f'token = "{TOKEN}"',
        "[[clients]]",
        f'name = "{CLIENT}"',
    ]
    tree = CascadeTree("root", TREE)
    lines.append(tree.node_sections(site, CLIENT, ports, token=lambda _: TOKEN))
    path.write_text("\n".join(lines) + "\n")
    return path


class Tree:
    """The four sites of one backend, their servers and stores."""

    def __init__(self, dbs: Databases, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = {s: free_port() for s in SITES}
        self.urls = {s: dbs.new(f"relay_{s}") for s in SITES}
        self.configs = {
            s: node_config(workdir / f"{s}.toml", s, self.urls[s], self.ports) for s in SITES
        }
        self.metrics_ports = {s: free_port() for s in SITES}
        self.stores: dict[str, SQLAlchemyQueueStore] = {}
        for s in SITES:
            store = open_store(self.urls[s])
            store.create_schema()
            self.stores[s] = store
        self.servers: dict[str, LrServer] = {}
        root = self.stores["root"]
        client = RoutingQueueClient(root, source_id="root", client_name=CLIENT)
        client.register_destinations(list(TREE))
        # The application addresses a cascaded client to every node of its set.
        self.source = Source("root", self.urls["root"], root, client, list(TREE), list(TREE))

    def start(self, site: str) -> None:
        metrics = ["--metrics-port", str(self.metrics_ports[site])]
        server = LrServer(self.configs[site], self.workdir, args=metrics).start()
        server.wait_listening(self.ports[site], timeout=60)
        self.servers[site] = server

    def stop(self, site: str) -> None:
        stop_process(self.servers.pop(site), timeout=10)

    def received(self, leaf: str) -> int:
        return self.stores[leaf].recv.sink_progress("root", CLIENT).last_position

    def applied(self, site: str) -> int:
        """The newest position the site's listener applied (0: none)."""
        return last_applied(self.stores[site])[0]

    def scrape(self) -> dict[str, ServerHistogram]:
        """Each stage's histogram now (:data:`STAGES`), from its server's metrics."""
        return {
            stage: ServerHistogram.scrape(self.metrics_ports[site], name, labels)
            for stage, site, name, labels in STAGES
        }

    def close(self) -> None:
        for site in list(self.servers):
            self.stop(site)
        for store in self.stores.values():
            store.engine.dispose()


def _wait(what: str, done: Any, timeout: float, tree: Tree) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {s}\n{srv.log()[-2000:]}" for s, srv in tree.servers.items())
            raise RuntimeError(f"{what}: not within {timeout:.0f}s\n{logs}")
        time.sleep(POLL)


# -- where the time goes: the servers' own histograms, the CPU -------------------------

#: (stage, the site whose metrics hold it, histogram, labels). ``lr_relay_lag_seconds``:
#: the root's transmit of an entry to its store at a node (its receiver's transaction
#: committed); ``lr_batch_latency_seconds``: a batch's send to its acknowledgement.
STAGES: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("stored at branch", "branch", "lr_relay_lag_seconds", {}),
    ("stored at direct", "direct", "lr_relay_lag_seconds", {}),
    ("stored at relayed", "relayed", "lr_relay_lag_seconds", {}),
    ("ack root -> branch", "root", "lr_batch_latency_seconds", {"destination": "branch"}),
    ("ack root -> direct", "root", "lr_batch_latency_seconds", {"destination": "direct"}),
    ("ack branch -> relayed", "branch", "lr_batch_latency_seconds", {"destination": "relayed"}),
)


@dataclass
class ServerHistogram:
    """A Prometheus histogram's cumulative buckets (upper bound in s -> count), sum, count."""

    buckets: dict[float, float]
    sum: float
    count: float

    @classmethod
    def scrape(cls, port: int, name: str, labels: dict[str, str]) -> ServerHistogram:
        """The histogram ``name`` of the server at ``port``, over the series matching."""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        h = cls({}, 0.0, 0.0)
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                if any(s.labels.get(k) != v for k, v in labels.items()):
                    continue
                if s.name == f"{name}_bucket":
                    bound = float(s.labels["le"])
                    h.buckets[bound] = h.buckets.get(bound, 0.0) + s.value
                elif s.name == f"{name}_sum":
                    h.sum += s.value
                elif s.name == f"{name}_count":
                    h.count += s.value
        return h

    def since(self, before: ServerHistogram) -> ServerHistogram:
        return ServerHistogram(
            {b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()},
            self.sum - before.sum,
            self.count - before.count,
        )

    def quantile(self, q: float) -> float | None:
        """As PromQL's ``histogram_quantile``: linear within the bucket that holds it."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-9)
            lower, below = bound, cumulative
        return lower


def relay_ways(port: int) -> dict[str, float]:
    """The branch's batches relayed so far by way (``lr_relay_batches``): forwarded as
    received, or read from its receive queue."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        body = r.read().decode()
    ways = {"forwarded": 0.0, "stored": 0.0}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == "lr_relay_batches_total":
                ways[s.labels["way"]] = ways.get(s.labels["way"], 0.0) + s.value
    return ways


@dataclass
class Stage:
    """One stage over the paced load: observations (entries or batches), mean and the
    bucket-interpolated p50/p99 (ms)."""

    observations: int
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, h: ServerHistogram) -> Stage:
        def ms(v: float | None) -> float | None:
            return None if v is None else round(v * 1000.0, 1)

        mean = h.sum / h.count if h.count > 0 else None
        return cls(int(h.count), ms(mean), ms(h.quantile(0.5)), ms(h.quantile(0.99)))


STAGE_FIGURES = ("mean_ms", "p50_ms", "p99_ms")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine since boot, in ticks (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return float(sum(fields) - idle), float(sum(fields))


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: process_cpu(pid) or 0.0 for name, pid in pids.items()}


@dataclass
class LatencyResult:
    offered_rate: float
    achieved_rate: float
    transmitted: int
    complete: bool
    direct: Latency
    relayed: Latency
    hop_p50_ms: float
    hop_p99_ms: float
    #: The branch's own listener: root -> branch, one hop from the root as ``direct`` is.
    branch: Latency
    #: Branch - direct, p50 and p99: two paths built alike, so their difference is the
    #: run's noise, what a difference of p99s moves by with no hop in it.
    one_hop_spread_p50_ms: float
    one_hop_spread_p99_ms: float
    #: Per entry seen at both leaves: its relayed latency - its direct latency, in ms
    #: (p10, p50, p90, p99): what the hop costs the same entry, not the target's figure.
    per_entry_hop_ms: dict[str, float]
    #: Each stage of the paths over the paced load (see :data:`STAGES`).
    stages: dict[str, Stage]
    #: The branch's batches to the relayed leaf over the paced load, by way: forwarded
    #: as received (before the branch stored them) or read from its receive queue.
    relay_batches: dict[str, int]
    #: The machine's CPU busy over the paced load (0..1, every process and PostgreSQL).
    machine_cpu_busy: float
    #: CPU seconds per process over the paced load, and its wall-clock seconds.
    cpu_seconds: dict[str, float]
    wall_seconds: float


@dataclass
class ThroughputResult:
    entries: int
    direct_rate: float
    relayed_rate: float
    direct_seconds: float
    relayed_seconds: float
    ratio: float


def applied_times(store: SQLAlchemyQueueStore) -> dict[int, float]:
    """Origin position -> when the site's listener was first called with it."""
    with store.read() as conn:
        rows = conn.execute(
            select(APPLIED.c.position, func.min(APPLIED.c.applied_at)).group_by(APPLIED.c.position)
        ).all()
    return {int(p): float(at) for p, at in rows}


def measure_latency(
    tree: Tree,
    rate: float,
    seconds: float,
    payloads: Sequence[bytes],
    writers: int,
    listener_poll: float,
    per_txn: int = 1,
) -> LatencyResult:
    for site in TREE:
        create_applied_table(tree.stores[site])
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    listeners = {
        s: ctx.Process(target=run_subscriber, args=(tree.urls[s], stop, listener_poll), daemon=True)
        for s in TREE
    }
    for proc in listeners.values():
        proc.start()
    try:
        # Ready: an entry has reached both leaves' listeners (connections, first contact).
        src = tree.source
        with src.store.engine.begin() as conn:
            ref = src.client.transmit_log_entry_message(conn, payloads[0], src.destinations)
        (first,) = src.client.positions_of([ref], timeout=60)
        assert first is not None
        _wait("first entry", lambda: all(tree.applied(s) >= first for s in LEAVES), 120, tree)
        pids = {f"lr server {s}": srv.proc.pid for s, srv in tree.servers.items() if srv.proc}
        pids |= {f"listener {s}": p.pid for s, p in listeners.items() if p.pid is not None}
        pids["bench (transmitter)"] = os.getpid()
        cpu0, machine0, stages0 = cpu_of(pids), machine_cpu(), tree.scrape()
        ways0 = relay_ways(tree.metrics_ports["branch"])
        started = time.time()
        load = paced_load(
            src.store,
            src.client,
            src.destinations,
            rate,
            seconds,
            payloads,
            per_txn=per_txn,
            writers=writers,
        )
        last = max(p for p, _ in load.commits)
        complete = True
        try:
            _wait("load delivered", lambda: all(tree.applied(s) >= last for s in LEAVES), 60, tree)
        except RuntimeError:
            complete = False
        cpu1, machine1, stages1 = cpu_of(pids), machine_cpu(), tree.scrape()
        ways1 = relay_ways(tree.metrics_ports["branch"])
        wall = time.time() - started
    finally:
        stop.set()
        for proc in listeners.values():
            proc.join(timeout=15)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    seen = {site: applied_times(tree.stores[site]) for site in TREE}
    return latency_result(
        rate,
        load.achieved_rate,
        load.commits,
        complete,
        seen,
        started,
        seconds,
        {name: stages1[name].since(stages0[name]) for name in stages1},
        {way: ways1[way] - ways0.get(way, 0.0) for way in ways1},
        (machine1[0] - machine0[0], machine1[1] - machine0[1]),
        {name: cpu1[name] - cpu0[name] for name in pids},
        wall,
    )


def latency_result(
    rate: float,
    achieved_rate: float,
    commits: Sequence[tuple[int, float]],
    complete: bool,
    seen: dict[str, dict[int, float]],
    started: float,
    seconds: float,
    stages: dict[str, ServerHistogram],
    ways: dict[str, float],
    machine: tuple[float, float],
    cpu: dict[str, float],
    wall: float,
) -> LatencyResult:
    """The paced load's figures from what was measured: ``commits`` (position, commit
    time), ``seen`` (node -> position -> when its listener had it), the servers'
    histograms and relay counters over the load, the machine's (busy, total) CPU ticks
    and each process's CPU seconds over it."""
    warm_until = started + min(WARMUP_SECONDS, seconds / 4)
    committed = {p: at for p, at in commits if at >= warm_until}
    lat = {
        leaf: latency_of(
            [(seen[leaf][p] - at) * 1000.0 for p, at in committed.items() if p in seen[leaf]]
        )
        for leaf in (*LEAVES, "branch")
    }
    both = [
        (seen["relayed"][p] - seen["direct"][p]) * 1000.0
        for p in committed
        if p in seen["relayed"] and p in seen["direct"]
    ]
    both.sort()
    per_entry = (
        {f"p{round(q * 100)}": round(percentile(both, q), 2) for q in (0.10, 0.50, 0.90, 0.99)}
        if both
        else {}
    )
    return LatencyResult(
        rate,
        round(achieved_rate, 1),
        len(commits),
        complete,
        lat["direct"],
        lat["relayed"],
        round(lat["relayed"].p50_ms - lat["direct"].p50_ms, 2),
        round(lat["relayed"].p99_ms - lat["direct"].p99_ms, 2),
        lat["branch"],
        round(lat["branch"].p50_ms - lat["direct"].p50_ms, 2),
        round(lat["branch"].p99_ms - lat["direct"].p99_ms, 2),
        per_entry,
        {name: Stage.of(h) for name, h in stages.items()},
        {way: int(n) for way, n in ways.items()},
        round(machine[0] / max(machine[1], 1.0), 3),
        {name: round(used, 2) for name, used in cpu.items()},
        round(wall, 2),
    )


def measure_throughput(tree: Tree, entries: int, payloads: Sequence[bytes]) -> ThroughputResult:
    tree.stop("root")
    before = {leaf: tree.received(leaf) for leaf in LEAVES}
    last, _ = prefill(tree.source, entries, payloads)
    tree.start("root")
    first_seen: dict[str, tuple[float, int]] = {}
    done_at: dict[str, float] = {}
    deadline = time.monotonic() + max(120.0, entries / 200)
    while len(done_at) < len(LEAVES) and time.monotonic() < deadline:
        now = time.perf_counter()
        for leaf in LEAVES:
            if leaf in done_at:
                continue
            pos = tree.received(leaf)
            if leaf not in first_seen and pos > before[leaf]:
                first_seen[leaf] = (now, pos)
            if pos >= last:
                done_at[leaf] = now
        time.sleep(POLL)
    if len(done_at) < len(LEAVES):
        raise RuntimeError(f"the drain of {entries} entries did not finish: {done_at}")
    return throughput_result(entries, last, first_seen, done_at)


def throughput_result(
    entries: int, last: int, first_seen: dict[str, tuple[float, int]], done_at: dict[str, float]
) -> ThroughputResult:
    """The drain's rates: per leaf, from its first entry seen (when, position) to the
    drain's ``last`` position reached (when)."""
    rates, spans = {}, {}
    for leaf in LEAVES:
        t0, pos0 = first_seen[leaf]
        spans[leaf] = max(done_at[leaf] - t0, POLL)
        # Positions of the drain are consecutive on both backends here (one writer).
        rates[leaf] = (last - pos0) / spans[leaf] if last > pos0 else entries / spans[leaf]
    return ThroughputResult(
        entries,
        round(rates["direct"], 1),
        round(rates["relayed"], 1),
        round(spans["direct"], 3),
        round(spans["relayed"], 3),
        round(rates["relayed"] / rates["direct"], 3),
    )


def listener_poll(args: argparse.Namespace) -> float:
    poll: float = args.listener_poll
    return LISTENER_POLL[args.backend] if poll is None else poll


def run(args: argparse.Namespace) -> dict[str, Any]:
    payloads = [os.urandom(PAYLOAD_BYTES) for _ in range(64)]
    machine = machine_facts()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lr-relay-")))
        dbs = Databases(args.backend, stack, workdir, args.pg_url, own_databases=True)
        facts = dbs.facts()
        tree = Tree(dbs, workdir)
        stack.callback(tree.close)
        for site in ("relayed", "direct", "branch", "root"):
            tree.start(site)
        latency = measure_latency(
            tree,
            args.rate,
            args.seconds,
            payloads,
            args.writers,
            listener_poll(args),
            args.per_txn,
        )
        throughput = measure_throughput(tree, args.entries, payloads)
    return relay_data(args, machine, facts, latency, throughput)


def relay_data(
    args: argparse.Namespace,
    machine: dict[str, Any],
    facts: dict[str, Any],
    latency: LatencyResult,
    throughput: ThroughputResult,
) -> dict[str, Any]:
    """The JSON the benchmark writes, from the run's settings and what it measured."""
    return {
        "benchmark": "relay",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": args.backend,
        "settings": {
            "rate": args.rate,
            "seconds": args.seconds,
            "entries": args.entries,
            "writers": args.writers,
            "per_txn": args.per_txn,
            "payload_bytes": PAYLOAD_BYTES,
            "tree": TREE,
            "listeners": "a process per node (RoutingQueueSubscriber, bench.soak.ApplyListener)",
            "listener_poll_seconds": listener_poll(args),
        },
        "machine": machine,
        "loadavg_at_end": loadavg(),
        "database": facts,
        "code": code_state(),
        "latency": asdict(latency),
        "throughput": asdict(throughput),
        "ratios": {
            "hop_p99_ms": latency.hop_p99_ms,
            "one_hop_spread_p99_ms": latency.one_hop_spread_p99_ms,
            "relayed_vs_direct_p99": round(latency.relayed.p99_ms / latency.direct.p99_ms, 3)
            if latency.direct.p99_ms
            else None,
            "relayed_vs_direct_throughput": throughput.ratio,
        },
        "targets": {
            "hop_p99_ms_at_most": TARGET_HOP_P99_MS,
            "throughput_ratio_at_least": TARGET_THROUGHPUT,
            "hop_p99_met": latency.hop_p99_ms <= TARGET_HOP_P99_MS,
            "throughput_met": throughput.ratio >= TARGET_THROUGHPUT,
        },
    }


def report(console: Console, data: dict[str, Any]) -> None:
    lat, thr = data["latency"], data["throughput"]
    rows = []
    for leaf in LEAVES:
        path = "root -> leaf" if leaf == "direct" else "root -> branch -> leaf"
        rows.append(
            [
                path,
                f"{lat[leaf]['p50_ms']:.1f}",
                f"{lat[leaf]['p99_ms']:.1f}",
                f"{lat[leaf]['max_ms']:.1f}",
                str(lat[leaf]["entries"]),
                fmt_rate(thr[f"{leaf}_rate"]),
            ]
        )
    print_table(
        console,
        f"Relay hop on {data['backend']}: latency at {lat['achieved_rate']:,.0f} entries/s "
        f"(offered {lat['offered_rate']:,.0f}), drain of {thr['entries']:,} entries",
        ["path", "p50 ms", "p99 ms", "max ms", "entries", "entries/s"],
        rows,
    )
    hop = data["ratios"]["hop_p99_ms"]
    met = "[green]met[/]" if hop <= TARGET_HOP_P99_MS else "[red]missed[/]"
    console.print(
        f"relay hop adds {lat['hop_p50_ms']:+.1f} ms p50, {hop:+.1f} ms p99 "
        f"(target <= {TARGET_HOP_P99_MS:.0f} ms: {met}); relayed/direct p99 "
        f"{fmt_ratio(data['ratios']['relayed_vs_direct_p99'])}; throughput relayed/direct "
        f"{fmt_ratio(thr['ratio'], TARGET_THROUGHPUT)} (target >= {TARGET_THROUGHPUT}x)"
    )
    console.print(
        f"one-hop spread (the branch's listener - direct, both one hop from the root): "
        f"{lat['one_hop_spread_p50_ms']:+.1f} ms p50, {lat['one_hop_spread_p99_ms']:+.1f} ms p99"
    )
    per_entry = lat["per_entry_hop_ms"]
    if per_entry:
        figures = ", ".join(f"{k} {v:+.1f}" for k, v in per_entry.items())
        console.print(f"per entry, relayed - direct latency of the same entry (ms): {figures}")
    print_table(
        console,
        "Where the time goes over the paced load (the servers' histograms)",
        ["stage", "observed", "mean ms", "p50 ms", "p99 ms"],
        [
            [
                name,
                f"{st['observations']:,}",
                *("-" if v is None else f"{v:.1f}" for v in (st[k] for k in STAGE_FIGURES)),
            ]
            for name, st in lat["stages"].items()
        ],
        caption="stored at X: from the root's transmit (before its COMMIT) to X's receiver "
        "transaction; ack A -> B: a batch from its send to its acknowledgement; "
        "p50/p99 interpolated within the histogram's buckets",
    )
    ways = lat["relay_batches"]
    console.print(
        f"the branch relayed {ways.get('forwarded', 0):,} batches as received (before "
        f"storing them) and {ways.get('stored', 0):,} from its receive queue"
    )
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in lat["cpu_seconds"].items())
    console.print(
        f"CPU over the paced load ({lat['wall_seconds']:.0f} s): machine "
        f"{100 * lat['machine_cpu_busy']:.0f} % busy; CPU seconds: {cpu}"
    )
    console.print(
        f"load average at start {data['machine']['loadavg_at_start']}, "
        f"at end {data['loadavg_at_end']}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    p.add_argument(
        "--listener-poll",
        type=float,
        default=None,
        help="listeners' idle poll, seconds (0.5 on PostgreSQL, 0.005 on SQLite)",
    )
    p.add_argument("--pg-url", default=os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL))
    p.add_argument("--rate", type=float, default=1000.0, help="paced entries/s (latency)")
    p.add_argument("--seconds", type=float, default=20.0, help="paced load duration")
    p.add_argument(
        "--writers",
        type=int,
        default=16,
        help="transmitting threads sharing the paced schedule (one connection each)",
    )
    p.add_argument(
        "--per-txn",
        type=int,
        default=1,
        help="entries per transmitting transaction (the same entries/s in fewer commits)",
    )
    p.add_argument("--entries", type=int, default=50_000, help="entries drained (throughput)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "relay.json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    data = run(args)
    report(Console(), data)
    write_json(args.out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
