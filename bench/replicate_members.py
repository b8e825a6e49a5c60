"""``bench/replicate.py --members N[,N...]``: one source site run by N ``lr server`` members.

PostgreSQL only (several members share one database). ``--destinations`` (8) sink
sites are started once; per N a fresh source site (its own schema) gets N ``lr server``
processes (``--member-id m-1`` .. ``m-N``, ``[members]`` at its defaults: lease timeout
5 s, heartbeat 1 s) and replicates one client to every sink (8 sender streams plus the
trim job: 9 units, placed by rendezvous hashing). Per N, three phases:

* ``drain``: ``--entries`` (5,000 by default) entries of 1 KiB per destination are prefilled; the
  N members start at once and drain them. The aggregate rate divides every entry delivered
  by the span from the first batch anywhere to the last batch anywhere (the members'
  start-up, the first joiner holding every unit until the others join, is inside it).
* ``latency``: once the placement has settled, the paced transmitter of the other cells
  offers ``--rate`` entries/s for ``--seconds``; p50/p99 of ``received_at`` at the sink
  minus the COMMIT of the source transaction, the first second excluded.
* ``failover`` (N >= 2): the same paced load for ``lease timeout + 8 s``; 2 s in, the member
  owning the most streams is SIGKILLed. Reported: the time until every unit is owned by a
  live member (the lease table), and the time until the first entry committed after the kill
  reaches a destination the dead member shipped to (a new owner sent it: the dead one never
  read it), first over its destinations and at the last of them. Target: at most lease
  timeout + 1 s. Entries the dead member had not had acknowledged are shipped again first,
  so this is an upper bound of the first delivery by a new owner.

The source runs with ``[retention] rotation_period = 600`` (default 30 s): the benchmark
asks for the positions of its entries once a load is over, and PostgreSQL knows the
position of an entry delivered everywhere and trimmed only for a slot's life.

CPU: user + system seconds of the N members over the latency phase. Database: over the
latency phase, the most connections each member held at once (``pg_stat_activity``, each
member's ``application_name``), and the row writes and scans per second of the
coordination tables (``pg_stat_user_tables`` of the source's schema: ``lrq_members``,
heartbeats and placement reads; ``lrq_unit_leases``, renewals and the fence check of every
fenced write).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import text

from bench.common import loadavg, machine_facts, print_table, write_json
from bench.replicate import (
    CLIENT,
    PAYLOAD_BYTES,
    WARMUP_SECONDS,
    Cluster,
    Databases,
    Latency,
    PacedLoad,
    Source,
    code_state,
    latency_of,
    paced_load,
    prefill,
    process_cpu,
    source_site,
    stop_process,
    wait_delivered,
    write_site_config,
)
from lr_server.cluster.placement import TRIM_UNIT, place, stream_unit
from lr_server.config import MembersConfig
from tests.kit.procs import LrServer

LEASE = MembersConfig().lease_timeout  # the default: the benchmark runs with it
HEARTBEAT = MembersConfig().heartbeat_interval
FAILOVER_TARGET = LEASE + 1.0
KILL_AFTER = 2.0  # seconds into the failover load
ROTATION_PERIOD = 600.0  # the source's [retention] rotation_period (see start_members)


@dataclass
class Failover:
    victim: str
    victim_streams: int
    units_owned_after_s: float  # kill -> every unit owned by a live member
    first_delivery_s: float | None  # kill -> first post-kill entry at one of its destinations
    all_resumed_s: float | None  # ... at the last of its destinations
    target_s: float = FAILOVER_TARGET
    lease_timeout_s: float = LEASE
    complete: bool = False  # every entry of the load delivered afterwards

    @property
    def met(self) -> bool:
        return self.all_resumed_s is not None and self.all_resumed_s <= self.target_s


@dataclass
class MembersCell:
    members: int
    destinations: int
    units: int
    streams_per_member: dict[str, int]
    settled_after_s: float  # launch -> every unit owned by its rendezvous winner
    drain_entries_per_destination: int
    drain_complete: bool
    aggregate_rate: float
    offered_rate: float
    achieved_rate: float
    latency_complete: bool
    pooled: Latency
    per_destination_p99_ms: dict[str, float]
    cpu_seconds: float  # the members, over the latency phase
    db: DbLoad
    failover: Failover | None = None
    loadavg_after: list[float] = field(default_factory=list)


# -- the members ------------------------------------------------------------------------------


def site_units(src: Source) -> list[str]:
    return [stream_unit(d, CLIENT) for d in src.destinations] + [TRIM_UNIT]


def placement(src: Source) -> dict[str, str | None]:
    """unit -> the live member owning it (None: nobody alive holds it)."""
    live = {m.instance: m.member_id for m in src.store.members.list_members(LEASE) if m.alive}
    leases = {x.unit: x.owner for x in src.store.members.list_leases()}
    return {u: live.get(leases.get(u) or "") for u in site_units(src)}


def wait_placement(
    src: Source, members: Sequence[str], timeout: float, settled: bool
) -> dict[str, str | None]:
    """Every unit owned by one of ``members`` (``settled``: by its rendezvous winner)."""
    want = place(site_units(src), {m: 1 for m in members})
    deadline = time.monotonic() + timeout
    while True:
        now = placement(src)
        if (now == want) if settled else all(o in members for o in now.values()):
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(f"placement over {list(members)} not reached: {now}")
        time.sleep(0.02)


def start_members(cluster: Cluster, src: Source, n: int) -> list[LrServer]:
    """N ``lr server`` members of the source; each tags its connections ``<site>-m-<i>``."""
    servers = []
    for i in range(1, n + 1):
        name = f"{src.site_id}-m-{i}"
        cfg = write_site_config(
            cluster.workdir / f"{name}.toml",
            src.site_id,
            f"{src.url}{'&' if '?' in src.url else '?'}application_name={name}",
            destinations=[(d, cluster.ports[d]) for d in src.destinations],
        )
        # Positions of trimmed entries stay known for a slot's life: long enough for the
        # benchmark to ask for them after a long (slowed down) load.
        cfg.write_text(cfg.read_text() + f"[retention]\nrotation_period = {ROTATION_PERIOD:g}\n")
        server = LrServer(cfg, cluster.workdir, args=["--member-id", f"m-{i}"], name=name)
        servers.append(server.start())
    return servers


def members_cpu(servers: Sequence[LrServer]) -> float:
    return sum(process_cpu(s) for s in servers)


# -- the database's side ------------------------------------------------------------------------

#: pg_stat_user_tables counters of the coordination tables, per table.
_TABLE_STATS = text(
    "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del, coalesce(seq_scan, 0) + "
    "coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE schemaname = current_schema() "
    "AND relname IN ('lrq_members', 'lrq_unit_leases')"
)


@dataclass
class DbLoad:
    """What the members cost the source database over the latency phase (per second)."""

    seconds: float
    connections_max: dict[str, int]  # member -> most connections open at once
    members_row_writes_per_s: float  # heartbeats (lrq_members)
    members_scans_per_s: float  # placement reads of the members
    lease_row_writes_per_s: float  # lease renewals, takes, releases and fence checks
    lease_scans_per_s: float


class DbWatch:
    """Samples the members' connections (by application_name) and the coordination tables."""

    def __init__(self, src: Source, members: Sequence[str]) -> None:
        self.src, self.members = src, list(members)
        self.conns = dict.fromkeys(self.members, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="db-watch", daemon=True)

    def _stats(self) -> dict[str, tuple[int, int]]:
        with self.src.store.engine.connect() as conn:
            return {str(r[0]): (int(r[1]), int(r[2])) for r in conn.execute(_TABLE_STATS)}

    def _run(self) -> None:
        q = text(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE application_name LIKE :p GROUP BY application_name"
        )
        while not self._stop.wait(0.25):
            with self.src.store.engine.connect() as conn:
                rows = conn.execute(q, {"p": f"{self.src.site_id}-m-%"}).all()
            for name, count in rows:
                member = "m-" + str(name).rsplit("-", 1)[1]
                if member in self.conns:
                    self.conns[member] = max(self.conns[member], int(count))

    def __enter__(self) -> DbWatch:
        self.t0, self.before = time.monotonic(), self._stats()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        time.sleep(1.1)  # backends flush their table statistics at most once a second
        after, seconds = self._stats(), time.monotonic() - self.t0

        def rate(table: str, k: int) -> float:
            got = after.get(table, (0, 0))[k] - self.before.get(table, (0, 0))[k]
            return round(got / seconds, 1)

        self.load = DbLoad(
            round(seconds, 1),
            dict(self.conns),
            rate("lrq_members", 0),
            rate("lrq_members", 1),
            rate("lrq_unit_leases", 0),
            rate("lrq_unit_leases", 1),
        )


# -- phases -----------------------------------------------------------------------------------


def drain_rate(cluster: Cluster, src: Source) -> float:
    """Entries delivered over the span from the first batch anywhere to the last anywhere."""
    firsts, lasts, total = [], [], 0
    for sink in src.destinations:
        groups = cluster.received_groups(sink, src.site_id)
        total += sum(c for _, c in groups)
        if groups:
            firsts.append(groups[0][0])
            lasts.append(groups[-1][0])
    span = max(lasts) - min(firsts) if firsts else 0.0
    return total / span if span > 0 else 0.0


def latencies(
    cluster: Cluster, src: Source, load: PacedLoad, since: float
) -> tuple[Latency, dict[str, float]]:
    committed = dict(load.commits)
    pooled: list[float] = []
    p99: dict[str, float] = {}
    for sink in src.destinations:
        values = [
            (received - committed[pos]) * 1000.0
            for pos, received in cluster.received_positions(sink, src.site_id)
            if pos in committed and committed[pos] >= since
        ]
        pooled += values
        p99[sink] = latency_of(values).p99_ms
    return latency_of(pooled), p99


def failover(
    cluster: Cluster,
    src: Source,
    servers: list[LrServer],
    rate: float,
    payloads: Sequence[bytes],
) -> Failover:
    """Kill -9 the member owning the most streams under a paced load; see the module doc."""
    members = [f"m-{i}" for i in range(1, len(servers) + 1)]
    seconds = LEASE + 8.0
    loads: list[PacedLoad] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loads.append(
                paced_load(src.store, src.client, src.destinations, rate, seconds, payloads)
            )
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="failover-load")
    thread.start()
    time.sleep(KILL_AFTER)
    before = placement(src)
    owned = Counter(o for u, o in before.items() if u != TRIM_UNIT)
    victim = max(members, key=lambda m: (owned[m], m))
    lost_dests = [d for d in src.destinations if before[stream_unit(d, CLIENT)] == victim]
    server = servers[members.index(victim)]
    assert server.proc is not None
    killed = time.time()
    server.proc.kill()
    server.proc.wait(timeout=10)
    rest = [m for m in members if m != victim]
    wait_placement(src, rest, timeout=LEASE * 6, settled=False)
    owned_after = time.time() - killed
    thread.join()
    if failed:
        raise failed[0]
    (load,) = loads
    last = max((p for p, _ in load.commits), default=0)
    complete, _ = wait_delivered(cluster, src, last, timeout=60)
    committed = dict(load.commits)
    firsts = []
    for sink in lost_dests:
        after = [
            received
            for pos, received in cluster.received_positions(sink, src.site_id)
            if pos in committed and committed[pos] > killed
        ]
        firsts.append(min(after) - killed if after else None)
    seen = [f for f in firsts if f is not None]
    return Failover(
        victim,
        len(lost_dests),
        round(owned_after, 3),
        round(min(seen), 3) if seen else None,
        round(max(seen), 3) if seen and len(seen) == len(firsts) else None,
        complete=complete,
    )


def members_cell(
    cluster: Cluster, n: int, args: argparse.Namespace, payloads: Sequence[bytes], console: Console
) -> MembersCell:
    site_id = f"src-m{n}"
    entries = args.entries or 5000
    dests = len(cluster.sink_ids)
    with source_site(cluster, site_id, dests, False) as src:
        console.log(f"{n} member(s): prefill {entries:,} entries for each of {dests} destinations")
        last, _ = prefill(src, entries, payloads)
        launched = time.monotonic()
        servers = start_members(cluster, src, n)
        members = [f"m-{i}" for i in range(1, n + 1)]
        try:
            settled = wait_placement(src, members, timeout=60, settled=True)
            settled_after = time.monotonic() - launched
            drained, _ = wait_delivered(cluster, src, last, timeout=max(60.0, 6 * args.seconds))
            aggregate = drain_rate(cluster, src)
            console.log(f"{n} member(s): drained at {aggregate:,.0f} entries/s; paced load")
            cpu0 = members_cpu(servers)
            started = time.time()
            with DbWatch(src, members) as watch:
                load = paced_load(
                    src.store, src.client, src.destinations, args.rate, args.seconds, payloads
                )
                final = max((p for p, _ in load.commits), default=last)
                complete, _ = wait_delivered(
                    cluster, src, final, timeout=max(30.0, 3 * args.seconds)
                )
                cpu = members_cpu(servers) - cpu0
            pooled, p99 = latencies(
                cluster, src, load, started + min(WARMUP_SECONDS, args.seconds / 4)
            )
            fo = None
            if n >= 2:
                console.log(f"{n} members: failover, kill -9 of the member with the most streams")
                fo = failover(cluster, src, servers, args.rate, payloads)
            streams = Counter(o for u, o in settled.items() if u != TRIM_UNIT)
            return MembersCell(
                n,
                dests,
                len(site_units(src)),
                {m: streams[m] for m in members},
                round(settled_after, 2),
                entries,
                drained,
                round(aggregate, 1),
                args.rate,
                round(load.achieved_rate, 1),
                complete,
                pooled,
                p99,
                round(cpu, 2),
                watch.load,
                fo,
                loadavg(),
            )
        finally:
            for server in servers:
                stop_process(server, timeout=5)


# -- the run ----------------------------------------------------------------------------------


def parse_members(value: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3] (each 1 to 3)."""
    try:
        counts = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected member counts like 1,2,3: {value!r}") from None
    if not counts or any(not 1 <= c <= 3 for c in counts):
        raise argparse.ArgumentTypeError(f"member counts are 1, 2 or 3: {value!r}")
    return counts


def report(console: Console, cells: Sequence[MembersCell]) -> None:
    rows = []
    for c in cells:
        fo = c.failover
        rows.append(
            [
                str(c.members),
                " ".join(str(v) for v in c.streams_per_member.values()),
                f"{c.aggregate_rate:,.0f}" + ("" if c.drain_complete else " (cut)"),
                f"{c.achieved_rate:,.0f}",
                f"{c.pooled.p50_ms:.1f}",
                f"{c.pooled.p99_ms:.1f}" + ("" if c.latency_complete else " (cut)"),
                f"{c.cpu_seconds:.1f}",
                " ".join(str(v) for v in c.db.connections_max.values()),
                f"{c.db.members_row_writes_per_s:g} / {c.db.members_scans_per_s:g}",
                f"{c.db.lease_row_writes_per_s:g} / {c.db.lease_scans_per_s:g}",
                f"{fo.victim} ({fo.victim_streams})" if fo else "-",
                f"{fo.units_owned_after_s:.2f}" if fo else "-",
                f"{fo.first_delivery_s:.2f}" if fo and fo.first_delivery_s is not None else "-",
                f"{fo.all_resumed_s:.2f}" if fo and fo.all_resumed_s is not None else "-",
                ("yes" if fo.met else "NO") if fo else "-",
            ]
        )
    print_table(
        console,
        f"Source site of N members, {cells[0].destinations} destinations, PostgreSQL",
        [
            "members",
            "streams each",
            "drain entries/s",
            "paced/s",
            "p50 ms",
            "p99 ms",
            "cpu s",
            "conns each",
            "members w/r per s",
            "leases w/r per s",
            "killed (streams)",
            "units moved s",
            "first new s",
            "all resumed s",
            f"<= {FAILOVER_TARGET:g} s",
        ],
        rows,
        caption=f"lease timeout {LEASE:g} s (default), heartbeat {HEARTBEAT:g} s; "
        f"load average now {loadavg()}",
    )


def members_result(
    args: argparse.Namespace,
    cells: Sequence[MembersCell],
    machine: dict[str, Any],
    facts: dict[str, Any],
    elapsed: float,
    started_at: str | None = None,
) -> dict[str, Any]:
    """The JSON the benchmark writes, from its settings and the cells it measured."""
    if started_at is None:
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
    result: dict[str, Any] = {
        "benchmark": "replicate-members",
        "format": 1,
        "started_at": started_at,
        "settings": {
            "members": args.members,
            "destinations": args.destinations,
            "entries_per_destination": args.entries or 5000,
            "offered_rate": args.rate,
            "seconds": args.seconds,
            "payload_bytes": PAYLOAD_BYTES,
            "lease_timeout": LEASE,
            "heartbeat_interval": HEARTBEAT,
            "failover_target_s": FAILOVER_TARGET,
            "kill_after_s": KILL_AFTER,
            "backend": "postgresql",
            "source_rotation_period": ROTATION_PERIOD,
        },
        "machine": machine,
        "loadavg_at_end": loadavg(),
        "code": code_state(),
        "backend_facts": facts,
        "results": [
            {
                **asdict(c),
                "failover": ({**asdict(c.failover), "met": c.failover.met} if c.failover else None),
            }
            for c in cells
        ],
        "elapsed_seconds": round(elapsed, 1),
    }
    return result


def run_members(args: argparse.Namespace, pg_url: str, default_out: Path) -> int:
    console = Console(width=180)
    out = args.out
    if out == default_out:
        out = default_out.with_name("replicate_members.json")
    payloads = [os.urandom(PAYLOAD_BYTES) for _ in range(1024)]
    started = time.perf_counter()
    machine = machine_facts()
    cells: list[MembersCell] = []
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lrbench-mem-")))
        dbs = Databases("postgresql", stack, workdir, pg_url)
        facts = dbs.facts()
        cluster = Cluster(dbs, workdir, [f"src-m{n}" for n in args.members], args.destinations)
        stack.callback(cluster.close)
        console.log(f"starting {args.destinations} sinks on PostgreSQL")
        cluster.start()
        for n in args.members:
            cells.append(members_cell(cluster, n, args, payloads, console))
    result = members_result(args, cells, machine, facts, time.perf_counter() - started)
    report(console, cells)
    write_json(out, result)
    console.print(f"wrote {out} in {result['elapsed_seconds']} s")
    return 0


__all__ = ["members_result", "parse_members", "run_members"]
