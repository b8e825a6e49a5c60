"""What idle sites cost: CPU per process and database transactions with nothing sent.

    python bench/idle.py [--backend sqlite|postgresql|both] [--grid 1x1,8x2,20x5]
                         [--members 1,3] [--seconds 120] [--settle-timeout 120]
                         [--sink-backend same|sqlite]
                         [--json bench/results/idle.json]

Per cell, sites configured as a user writes them (plaintext gRPC on loopback with
token auth, every other setting at its default), each set up by ``lr init-db`` and run
by ``lr server`` processes: a source ``src`` with D destinations and C clients
(``--grid DxC``), and the D sink sites ``sink-1`` .. ``sink-D``, each accepting ``src``
(a sink stands for one destination: a destination is a site with its own receive
queues), each with a subscriber process (:mod:`bench.idle_subscriber`: one
``RoutingQueueSubscriber`` per client at its defaults). With ``--members N`` the source
is run by N ``lr server`` members sharing its database (``--member-id m-1`` ..;
PostgreSQL only: a SQLite site runs one server, so those cells are skipped). Each site
has its own database: a SQLite file in a temporary directory, or a database created on
the PostgreSQL server at ``LR_BENCH_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and dropped afterwards.

PostgreSQL sites hold connections (a sink's database about 3 plus 3 per client of its
subscriber): a cell that would not fit in the server's free connections is skipped and
says so; ``--sink-backend sqlite`` keeps the sinks on SQLite files whatever the cell's
backend (the source's figures are then those of PostgreSQL, the sinks' of SQLite).

Nothing is transmitted. Once every sender session is connected and in log entry sync
and every stream owned by its member (``lr status --json`` of the source) and every
subscriber runs, each process's CPU (utime + stime, ``/proc/<pid>/stat``) is measured
over ``--seconds``, and on PostgreSQL each site database's transactions
(``xact_commit + xact_rollback`` of ``pg_stat_database``; backends report them at most
every second, or 10 s when idle, so short windows are approximate) and the most
backends connected to it at once (sampled every second). On SQLite the transactions are
reported as n/a.

Target (reported, never asserted): at most 0.5 % of one core per ``lr server`` process
and per subscriber process, whatever the number of destinations and clients. The report
is built by :mod:`bench.idle_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402
from rich.console import Console  # noqa: E402

from bench.common import DEFAULT_PG_URL, loadavg, machine_facts, write_json  # noqa: E402
from bench.cpu_profile import process_cpu  # noqa: E402
from bench.idle_pg import PgWatch, pg_connections_needed, pg_free_connections  # noqa: E402
from bench.idle_report import (  # noqa: E402
    SINK,
    SOURCE,
    SUBSCRIBER,
    DbUse,
    IdleCell,
    ProcessUse,
    idle_result,
    report,
)
from bench.idle_subscriber import Subscriber  # noqa: E402
from bench.replicate import Databases, code_state, stop_process, write_site_config  # noqa: E402
from lr_server.cluster.placement import TRIM_UNIT, place, stream_unit  # noqa: E402
from lr_server.ops.status_records import StreamState  # noqa: E402
from lr_server.sending.streams import SessionState  # noqa: E402
from tests.kit.procs import ROOT as KIT_ROOT  # noqa: E402
from tests.kit.procs import LrServer, lr_env  # noqa: E402
from tests.kit.sites import free_port  # noqa: E402

SOURCE_ID = "src"
DEFAULT_OUT = ROOT / "bench" / "results" / "idle.json"
STATUS_INTERVAL = 1.0  # seconds between two `lr status --json` while settling


def parse_grid(spec: str) -> list[tuple[int, int]]:
    """``"1x1,8x2"`` -> ``[(1, 1), (8, 2)]`` (destinations, clients)."""
    out = []
    for part in spec.split(","):
        d, _, c = part.strip().partition("x")
        if not d.isdigit() or not c.isdigit() or int(d) < 1 or int(c) < 1:
            raise argparse.ArgumentTypeError(f"grid cell {part!r}: expected DxC, e.g. 8x2")
        out.append((int(d), int(c)))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--grid", type=parse_grid, default=parse_grid("1x1,8x2,20x5"))
    p.add_argument("--members", default="1,3", help="source members per cell, e.g. 1,3")
    p.add_argument("--seconds", type=float, default=120.0, help="the measured window")
    p.add_argument("--settle-timeout", type=float, default=120.0)
    p.add_argument(
        "--sink-backend",
        choices=["same", "sqlite"],
        default="same",
        help="the sinks' databases: the cell's backend, or SQLite files whatever it is "
        "(PostgreSQL sinks hold connections by the dozen: see --help's description)",
    )
    p.add_argument("--json", "--out", dest="json", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    args.members = [int(m) for m in str(args.members).split(",")]
    if any(m < 1 for m in args.members):
        p.error("--members: each count at least 1")
    args.backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "backends": args.backends,
        "grid": [f"{d}x{c}" for d, c in args.grid],
        "members": args.members,
        "seconds": args.seconds,
        "config": "plaintext loopback, token auth, every other setting at its default",
        "subscriber": "RoutingQueueSubscriber per client at its defaults, a process per sink",
        "code": code_state(),
    }


# -- processes ---------------------------------------------------------------------------------


def lr(*cmd: str, timeout: float = 120.0) -> str:
    """Run ``lr CMD`` (this tree's code) and return its stdout; fail with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "lr_server.cli", *cmd],
        capture_output=True,
        text=True,
        env=lr_env(),
        cwd=KIT_ROOT,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"lr {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


@dataclass
class Running:
    """The processes of one cell: (role, name, pid), and how to check they still run."""

    servers: dict[str, tuple[str, LrServer]] = field(default_factory=dict)
    subscribers: list[Subscriber] = field(default_factory=list)

    def pids(self) -> list[tuple[str, str, int]]:
        out = []
        for name, (role, server) in self.servers.items():
            assert server.proc is not None
            out.append((role, name, server.proc.pid))
        out += [(SUBSCRIBER, s.name, s.proc.pid) for s in self.subscribers]
        return out

    def check_alive(self) -> None:
        for name, (_, server) in self.servers.items():
            if server.proc is None or server.proc.poll() is not None:
                raise RuntimeError(f"lr server {name} exited:\n{server.log()}")
        for s in self.subscribers:
            s.ready()

    def stop(self) -> None:
        for s in self.subscribers:
            s.stop()
        for _, server in self.servers.values():
            stop_process(server, timeout=15)


# -- the settled state -------------------------------------------------------------------------


def settled(status: dict[str, Any], dests: Sequence[str], clients: Sequence[str],
            members: Sequence[str] | None) -> bool:  # fmt: skip
    """Every session connected and in log entry sync, every stream in log entry sync and
    owned by a member (``members``: by the one rendezvous hashing places it on)."""
    sessions = {s["destination"]: s for s in status.get("sessions") or []}
    for d in dests:
        s = sessions.get(d)
        if s is None or not s["connected"] or s["state"] != SessionState.LOG_ENTRY_SYNC:
            return False
    streams = {(s["destination"], s["client"]): s for s in status.get("send") or []}
    want: dict[str, str | None] = {}
    if members:
        units = [stream_unit(d, c) for d in dests for c in clients] + [TRIM_UNIT]
        want = place(units, {m: 1 for m in members})
    for d in dests:
        for c in clients:
            s = streams.get((d, c))
            if s is None or s["state"] != StreamState.LOG_ENTRY_SYNC or not s["owner"]:
                return False
            if members and s["owner"] != want[stream_unit(d, c)]:
                return False
    return True


def wait_settled(cfg: Path, running: Running, dests: Sequence[str], clients: Sequence[str],
                 members: Sequence[str] | None, timeout: float) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    seen = ""
    while True:
        running.check_alive()
        try:
            status = json.loads(lr("status", "--config", str(cfg), "--json"))
            seen = json.dumps(status)[:3000]
        except RuntimeError as exc:  # the database refused it (too many clients): again
            status, seen = {}, str(exc)
        if settled(status, dests, clients, members) and all(s.ready() for s in running.subscribers):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not settled after {timeout:g} s: {seen}")
        time.sleep(STATUS_INTERVAL)


def measure(running: Running, seconds: float, watch: PgWatch | None) -> IdleCell:
    """CPU of every process, transactions of every database, over ``seconds``."""
    pids = running.pids()
    tx0 = watch.transactions() if watch is not None else {}
    start = time.monotonic()
    cpu0 = {pid: process_cpu(pid) or 0.0 for _, _, pid in pids}
    end = start + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        running.check_alive()
        if watch is not None:
            watch.sample_connections()
    cpu1 = {pid: process_cpu(pid) or 0.0 for _, _, pid in pids}
    wall = time.monotonic() - start
    tx1 = watch.transactions() if watch is not None else {}
    cell = IdleCell("", 0, 0, 0, seconds=round(wall, 2))
    cell.processes = [
        ProcessUse(role, name, round(cpu1[pid] - cpu0[pid], 3), round(wall, 3))
        for role, name, pid in pids
    ]
    if watch is not None:
        for db, (role, site) in watch.databases.items():
            used = tx1.get(db, 0) - tx0.get(db, 0)
            cell.databases.append(
                DbUse(role, site, used, round(wall, 3), watch.connections_max[db])
            )
    return cell


# -- one cell ----------------------------------------------------------------------------------


def run_cell(args: argparse.Namespace, backend: str, dests_n: int, clients_n: int,
             members_n: int) -> IdleCell:  # fmt: skip
    if backend == "sqlite" and members_n > 1:
        return IdleCell(backend, dests_n, clients_n, members_n,
                        skipped="a SQLite site runs one server")  # fmt: skip
    sink_backend = backend if args.sink_backend == "same" else args.sink_backend
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    need = pg_connections_needed(backend, sink_backend, dests_n, clients_n, members_n)
    if need and need > (free := pg_free_connections(pg_url)):
        why = f"needs about {need} PostgreSQL connections, {free} free"
        return IdleCell(backend, dests_n, clients_n, members_n, sink_backend=sink_backend,
                        skipped=why)  # fmt: skip
    dests = [f"sink-{i}" for i in range(1, dests_n + 1)]
    clients = [f"client-{i}" for i in range(1, clients_n + 1)]
    running = Running()
    # The directory outlives the stack: the processes stop (and the databases go) first.
    with tempfile.TemporaryDirectory(prefix="lr-idle-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        dbs = Databases(backend, stack, workdir, pg_url, own_databases=True)
        sink_dbs = Databases(sink_backend, stack, workdir, pg_url, own_databases=True)
        urls = {SOURCE_ID: dbs.new(SOURCE_ID)}
        urls |= {d: sink_dbs.new(d.replace("-", "_")) for d in dests}
        ports = {d: free_port() for d in dests}
        stack.callback(running.stop)
        for d in dests:
            cfg = write_site_config(workdir / f"{d}.toml", d, urls[d], listen_port=ports[d],
                                    sources=[SOURCE_ID], clients=clients)  # fmt: skip
            lr("init-db", "--config", str(cfg))
            running.servers[d] = (SINK, LrServer(cfg, workdir).start())
        for d in dests:
            running.servers[d][1].wait_listening(ports[d], timeout=args.settle_timeout)
            sub = Subscriber.start(f"{d}-subscriber", urls[d], clients, workdir)
            running.subscribers.append(sub)
        src_cfg = write_site_config(workdir / f"{SOURCE_ID}.toml", SOURCE_ID, urls[SOURCE_ID],
                                    destinations=[(d, ports[d]) for d in dests],
                                    clients=clients)  # fmt: skip
        lr("init-db", "--config", str(src_cfg))
        members = [f"m-{i}" for i in range(1, members_n + 1)] if members_n > 1 else None
        started = time.monotonic()
        for m in members or [""]:
            name = f"{SOURCE_ID}-{m}" if m else SOURCE_ID
            extra = ["--member-id", m] if m else []
            server = LrServer(src_cfg, workdir, args=extra, name=name).start()
            running.servers[name] = (SOURCE, server)
        wait_settled(src_cfg, running, dests, clients, members, args.settle_timeout)
        settle = time.monotonic() - started
        watch = None
        if backend == "postgresql":
            names = {
                sqlalchemy.make_url(u).database or "": s
                for s, u in urls.items()
                if u.startswith("postgresql")
            }
            roles = {db: (SOURCE if s == SOURCE_ID else SINK, s) for db, s in names.items()}
            watch = PgWatch(pg_url, roles)
            stack.callback(watch.close)
        cell = measure(running, args.seconds, watch)
    cell.backend, cell.destinations, cell.clients, cell.members = (
        backend, dests_n, clients_n, members_n,
    )  # fmt: skip
    cell.sink_backend = sink_backend
    cell.settled_after_s = round(settle, 2)
    cell.loadavg_after = loadavg()
    return cell


def backend_facts(backend: str) -> dict[str, Any]:
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
        return Databases(backend, stack, Path(tmp), pg_url).facts()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    facts = machine_facts()
    started = time.monotonic()
    cells: list[IdleCell] = []
    for backend in args.backends:
        for dests_n, clients_n in args.grid:
            for members_n in args.members:
                console.print(f"[dim]{backend} {dests_n}x{clients_n} members {members_n}[/]")
                try:
                    cells.append(run_cell(args, backend, dests_n, clients_n, members_n))
                except RuntimeError as exc:  # reported in its row; the other cells go on
                    why = " ".join(str(exc).split())
                    console.print(f"[red]{why[:500]}[/]")
                    failed = f"failed: {why[:300]}"
                    cells.append(IdleCell(backend, dests_n, clients_n, members_n, skipped=failed))
    report(console, cells)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    facts_by = {b: backend_facts(b) for b in args.backends}
    result = idle_result(settings(args), cells, facts, facts_by, time.monotonic() - started, at)
    write_json(args.json, result)
    console.print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
