"""The nemesis: a seeded schedule of combined faults over a running deployment, then the verifier.

A trial deploys source ``a`` as two ``lr server`` members (``a-1``, ``a-2``) on
one database, sinks ``b`` and ``c`` (an ``lr server`` and a sink application
process each), the application's snapshot provider as a process, and the
source application (keyed or not) in this process. From the trial's seed it
draws the deployment's shape (lanes per destination, ``b`` delivering by key
partition or not) and a schedule of faults over a few seconds of traffic, which
may overlap:

* ``kill``: SIGKILL of any of those processes, restarted after a pause;
* ``pause``: SIGSTOP, then SIGCONT after up to twice the lease timeout (a
  member or subscriber that wakes after its lease expired);
* ``net``: cut, stall, reset or slow the link from ``a`` to ``b`` or ``c``
  (a :class:`~tests.kit.tcp_proxy.FaultProxy` in front of the sink);
* ``db-net`` (PostgreSQL): the same between member ``a-2`` and its database;
* ``db-crash`` (PostgreSQL): ``pg_ctl stop -m immediate`` of the cluster of
  ``a``, ``b`` or ``c`` (each site has its own, :mod:`tests.kit.pgcluster`),
  started again (WAL recovery) under traffic;
* ``full-sync``: an operator's full sync request to ``b`` or ``c``;
* ``weight``: a member's weight set to 0 (drained), 1 or 3 at run time.

Then every fault is healed, the traffic stops, the sinks drain, and the
verifier checks every listener: nothing lost, nothing twice, total order (and
per-key order at a sink delivering by partition), every completed snapshot
whole. A failure prints ``LR_NEMESIS_SEED=<seed>``, which replays the trial.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError

from lr_client.errors import TransientError
from lr_client.records import SnapshotStatus
from lr_client.store import open_store
from tests.kit.pgcluster import PgCluster
from tests.kit.procs import ROOT, LrServer, lr_env, track
from tests.kit.tcp_proxy import FaultProxy
from tests.kit.traffic import SourceApp, read_applied, read_sent, read_snapshots
from tests.kit.verifier import Report, verify
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import Deployment, SinkProc, stop_server

T = TypeVar("T")
PROVIDER_PROC = Path(__file__).with_name("provider_proc.py")
SINKS = ("b", "c")
LEASE = 2.0
PROCESSES = ("a-1", "a-2", "b", "c", "app-b", "app-c", "provider")
KINDS = ("kill", "pause", "net", "db-net", "db-crash", "full-sync", "weight")
PG_ONLY = {"db-net", "db-crash"}


def nemesis_seed() -> int:
    """``LR_NEMESIS_SEED`` or a fresh seed (printed: it replays the run)."""
    raw = os.environ.get("LR_NEMESIS_SEED", "").strip()
    seed = int(raw) if raw else random.SystemRandom().randrange(1, 2**31)
    print(f"\nLR_NEMESIS_SEED={seed}")
    return seed


def nemesis_trials(default: int = 0) -> int:
    """``LR_NEMESIS_TRIALS`` (0 when unset: the long mode does not run)."""
    raw = os.environ.get("LR_NEMESIS_TRIALS", "").strip()
    return int(raw) if raw else default


# -- the schedule -------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the traffic started
    kind: str
    target: str
    hold: float  # seconds before it is healed
    mode: str = ""  # net: cut/stall/reset/slow; weight: the weight


@dataclass(frozen=True)
class Plan:
    """One run, drawn from its seed: the deployment's shape and a schedule per trial.

    The trials of a run share its deployment (starting seven Python processes
    costs more than a trial): each trial starts the traffic, injects its
    schedule, heals, stops the traffic, waits for the sinks to drain and runs
    the verifier over everything the run committed so far.
    """

    seed: int
    backend: str
    lanes: int
    partitions: int  # sink b's subscriber: by key partition (N > 1) or not
    keyed: bool
    seconds: float
    schedules: tuple[tuple[Fault, ...], ...]

    def describe(self, trial: int | None = None) -> str:
        head = (
            f"LR_NEMESIS_SEED={self.seed} {self.backend}: lanes={self.lanes}"
            f" partitions(b)={self.partitions} keyed={self.keyed},"
            f" {len(self.schedules)} trial(s) of {self.seconds:.1f}s of traffic"
        )
        lines = [head]
        for n, faults in enumerate(self.schedules):
            if trial is None or n == trial:
                lines.append(f" trial {n}:")
                lines += [
                    f"  {f.at:5.2f}s {f.kind} {f.target} {f.mode} for {f.hold:.2f}s" for f in faults
                ]
        return "\n".join(lines)


def draw_faults(rng: random.Random, backend: str, seconds: float, count: int) -> tuple[Fault, ...]:
    """``count`` faults at random moments of ``seconds`` of traffic (they may overlap)."""
    kinds = [k for k in KINDS if backend == "postgresql" or k not in PG_ONLY]
    drawn: list[Fault] = []
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.0, seconds * 0.8)
        mode = ""
        if kind in ("kill", "pause"):
            target = rng.choice(PROCESSES)
            hold = rng.uniform(0.1, 1.5) if kind == "kill" else rng.uniform(0.3, 2 * LEASE)
        elif kind == "net":
            target = rng.choice(SINKS)
            mode = rng.choice(["cut", "stall", "reset", "slow"])
            hold = rng.uniform(0.3, 3.0)
        elif kind == "db-net":
            target = "a-2"
            mode = rng.choice(["cut", "stall", "reset"])
            hold = rng.uniform(0.3, 3.0)
        elif kind == "db-crash":
            target = rng.choice(["a", *SINKS])
            hold = rng.uniform(0.1, 1.5)
        elif kind == "full-sync":
            target = rng.choice(SINKS)
            hold = 0.0
        else:  # weight
            target = rng.choice(["a-1", "a-2"])
            mode = str(rng.choice([0, 1, 3]))
            hold = rng.uniform(0.5, 2.0)
        drawn.append(Fault(round(at, 3), kind, target, round(hold, 3), mode))
    return tuple(sorted(drawn, key=lambda f: f.at))


def draw_plan(
    seed: int, backend: str, trials: int = 2, seconds: float = 3.0, faults: int = 4
) -> Plan:
    """The run of ``seed`` on ``backend``: deterministic (a replay draws the same)."""
    rng = random.Random(f"nemesis/{seed}/{backend}")
    partitions = rng.choice([1, 4])
    lanes = rng.choice([1, 2])
    keyed = partitions > 1 or rng.random() < 0.5
    schedules = tuple(draw_faults(rng, backend, seconds, faults) for _ in range(trials))
    return Plan(seed, backend, lanes, partitions, keyed, seconds, schedules)


#: A database that is down, or a pooled connection that died with it (the pool drops it).
DB_DOWN = (TransientError, OperationalError, InterfaceError)


def as_operator(action: Callable[[], T], timeout: float = 60.0) -> T:
    """Run an operator's action (or the test's own read), again while the database is
    unreachable (a crash, a cut link: the operator retries), until ``timeout``."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        try:
            return action()
        except DB_DOWN:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# -- the databases ------------------------------------------------------------------------
class Databases:
    """A fresh database per site and trial: SQLite files, or one PostgreSQL cluster per site."""

    def __init__(self, backend: str, root: Path, clusters: Mapping[str, PgCluster]) -> None:
        self.backend = backend
        self.root = root
        self.clusters = clusters
        self.made: list[tuple[str, str]] = []

    def url(self, site: str) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.root / (site + '.db')}"
        name = f"n_{site}_{uuid.uuid4().hex[:8]}"
        self.made.append((site, name))
        return self.clusters[site].create_database(name)

    def drop(self) -> None:
        for site, name in self.made:
            try:
                self.clusters[site].drop_database(name)
            except Exception as exc:  # teardown: report, do not mask the trial's outcome
                print(f"database {name} not dropped: {exc}", file=sys.stderr)


def start_clusters() -> dict[str, PgCluster]:
    """One PostgreSQL cluster per site (a, b, c; d for the cascade's fourth node), running."""
    clusters = {s: PgCluster(f"nemesis-{s}") for s in ("a", *SINKS, "d")}
    for c in clusters.values():
        c.init()
        c.start()
    return clusters


# -- the deployment of one trial ----------------------------------------------------------
@dataclass
class Tally:
    """What the trials did and found, summed over a run."""

    trials: int = 0  # trials that passed
    failed: int = 0  # trials (of runs, in the long mode) that failed
    faults: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    entries: int = 0
    applied: int = 0
    snapshots: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def add(self, report: Report) -> None:
        self.entries += report.expected
        self.applied += report.applied
        self.snapshots += sum(r.snapshots_completed for r in report.streams.values())
        for k, v in report.counts().items():
            if k not in ("expected", "applied"):
                self.problems[k] += v

    def summary(self) -> str:
        return (
            f"{self.trials} trials passed, {self.failed} failed, in {self.seconds:.0f}s;"
            f" faults {dict(sorted(self.faults.items()))}"
            f" ({self.skipped} skipped: target busy); entries checked {self.entries},"
            f" log entries applied {self.applied}, snapshots completed {self.snapshots};"
            f" problems {dict(self.problems)}"
        )


class Trial:
    """The deployment of one plan, its fault injectors, and the final check."""

    def __init__(self, plan: Plan, tmp: Path, clusters: dict[str, PgCluster]) -> None:
        self.plan = plan
        self.tmp = tmp
        self.dbs = Databases(plan.backend, tmp, clusters)
        self.clusters = clusters
        tune: dict[str, dict[str, object]] = {
            "members": {"lease_timeout": LEASE, "heartbeat_interval": 0.25},
            "replication": {
                "stream_idle_timeout": 2.0,
                "snapshot_stall_timeout": 2.0,
                "streams_per_destination": plan.lanes,
                "batch_max_entries": 50,
            },
            "retry": {"initial_backoff": 0.05, "max_backoff": 0.5},
        }
        self.dep = Deployment(tmp, self.dbs.url, SINKS, snapshot="app", tune=tune, source_members=2)
        # a -> b and a -> c through proxies: the source's config names the proxies' ports.
        self.proxies = {s: FaultProxy("127.0.0.1", self.dep.ports[s]).start() for s in SINKS}
        text = self.dep.configs["a"].read_text()
        for s in SINKS:
            old, new = f"127.0.0.1:{self.dep.ports[s]}", f"127.0.0.1:{self.proxies[s].port}"
            assert old in text
            text = text.replace(old, new)
        self.dep.configs["a"].write_text(text)
        # Member a-2 reaches its database through a proxy (PostgreSQL).
        self.db_proxy: FaultProxy | None = None
        if plan.backend == "postgresql":
            db = make_url(self.dep.raw_urls["a"])
            self.db_proxy = FaultProxy(db.host or "127.0.0.1", db.port or 5432).start()
            proxied = db.set(port=self.db_proxy.port).render_as_string(hide_password=False)
            config = tmp / "a-2.toml"
            config.write_text(text.replace(self.dep.raw_urls["a"], proxied, 1))
            self.dep.servers["a#2"] = LrServer(config, args=["--member-id", "a-2"], name="a-2")
        app_b = self.dep.apps["b"]
        self.dep.apps["b"] = SinkProc(
            app_b.url, app_b.log_path, app_b.clients, partitions=plan.partitions
        )
        self.source = SourceApp(
            self.dep.raw_urls["a"],
            "a",
            list(SINKS),
            seed=plan.seed,
            rate=60,
            max_batch=3,
            keys=40,
            keyed=plan.keyed,
        )
        self.provider: subprocess.Popen[bytes] | None = None
        self.locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self.done: Counter[str] = Counter()
        self.skipped = 0
        self.errors: list[str] = []
        self.phases: dict[str, float] = {}

    # -- processes ----------------------------------------------------------------------
    def start_provider(self) -> None:
        log = self.tmp / "provider.log"
        with log.open("ab") as f:
            self.provider = subprocess.Popen(
                [sys.executable, str(PROVIDER_PROC), "--url", self.dep.raw_urls["a"]],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=lr_env(),
                cwd=ROOT,
            )
        track("snapshot provider", log, self.provider)

    def proc(self, name: str) -> subprocess.Popen[bytes] | None:
        if name == "provider":
            return self.provider
        if name.startswith("app-"):
            return self.dep.apps[name[4:]].proc
        key = {"a-1": "a", "a-2": "a#2"}.get(name, name)
        return self.dep.servers[key].proc

    def restart(self, name: str) -> None:
        if name == "provider":
            self.start_provider()
        elif name.startswith("app-"):
            self.dep.apps[name[4:]].start()
        else:
            self.dep.servers[{"a-1": "a", "a-2": "a#2"}.get(name, name)].start()

    # -- faults ---------------------------------------------------------------------------
    def inject(self, f: Fault, t0: float, stop: threading.Event) -> None:
        if stop.wait(max(0.0, t0 + f.at - time.monotonic())):
            return
        # One fault of a kind per target at a time (a paused process may be killed).
        lock = self.locks[f"{f.kind}:{f.target}"]
        if not lock.acquire(blocking=False):
            self.skipped += 1
            self.dep.events.append(f"skip {f} (target busy)")
            return
        try:
            self.dep.events.append(
                f"{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:5.2f}s"
                f" {f.kind} {f.target} {f.mode}"
            )
            self._apply(f)
            self.done[f.kind] += 1
        except Exception as exc:
            self.errors.append(f"{f}: {type(exc).__name__}: {exc}")
        finally:
            lock.release()

    def _apply(self, f: Fault) -> None:
        if f.kind == "kill":
            p = self.proc(f.target)
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(scaled(10))
            time.sleep(f.hold)
            self.restart(f.target)
        elif f.kind == "pause":
            p = self.proc(f.target)
            if p is None or p.poll() is not None:
                return
            p.send_signal(signal.SIGSTOP)
            try:
                time.sleep(f.hold)
            finally:
                p.send_signal(signal.SIGCONT)
        elif f.kind in ("net", "db-net"):
            proxy = self.proxies[f.target] if f.kind == "net" else self.db_proxy
            assert proxy is not None
            {"cut": proxy.cut, "stall": proxy.stall, "reset": proxy.reset_all}.get(
                f.mode, lambda: proxy.slow(20_000)
            )()
            try:
                time.sleep(f.hold)
            finally:
                proxy.restore()
        elif f.kind == "db-crash":
            cluster = self.clusters[f.target]
            cluster.crash()
            try:
                time.sleep(f.hold)
            finally:
                cluster.start()
        elif f.kind == "full-sync":
            api = self.source.apis["policy"]
            as_operator(lambda: api.request_snapshot_sync(f.target, reason="nemesis"))
        else:  # weight
            store = open_store(self.dep.engine("a"))
            as_operator(lambda: store.members.set_member_weight(f.target, int(f.mode)))
            time.sleep(f.hold)
            as_operator(lambda: store.members.set_member_weight(f.target, 1))

    # -- the run ------------------------------------------------------------------------
    def deploy(self) -> None:
        mark = time.monotonic()
        self.dep.start()
        self.start_provider()
        self.phases["deploy"] = time.monotonic() - mark

    def trial(self, n: int) -> Report:
        """Traffic, schedule ``n``'s faults, heal, drain; the verifier's report of the run."""
        self.done.clear()
        self.phases = {k: v for k, v in self.phases.items() if k == "deploy"} if n == 0 else {}
        mark = time.monotonic()
        floor = self.check().applied + 20
        self.source.start()
        wait_for(
            lambda: self.check().applied >= floor,
            scaled(60),
            0.1,
            what="traffic reaching the listeners",
            detail=self.dep.logs,
        )
        t0 = time.monotonic()
        self.phases["flowing"] = t0 - mark
        stop = threading.Event()
        threads = [
            threading.Thread(target=self.inject, args=(f, t0, stop), daemon=True)
            for f in self.plan.schedules[n]
        ]
        for t in threads:
            t.start()
        stop.wait(self.plan.seconds)
        for t in threads:
            t.join(scaled(60))
        assert not any(t.is_alive() for t in threads), "a fault did not heal"
        assert not self.errors, self.errors
        self.phases["faults"] = time.monotonic() - t0
        self.heal()
        self.source.stop()
        mark = time.monotonic()
        report = self.drained(n)
        self.phases["drain"] = time.monotonic() - mark
        return report

    def heal(self) -> None:
        """Every process running, every link and database up (a fault's heal is its own;
        this catches a process that exited by itself, which would be a finding)."""
        for name in PROCESSES:
            p = self.proc(name)
            if p is not None and p.poll() is not None:
                self.errors.append(f"{name} exited by itself with {p.returncode}")
                self.restart(name)
        assert not self.errors, "\n".join(self.errors) + "\n" + self.dep.logs()

    def check(self) -> Report:
        """The verifier's report of everything the run committed (read again if a pooled
        connection of this process died with a crashed database)."""
        return as_operator(self._check)

    def _check(self) -> Report:
        applied = []
        for s in SINKS:
            # Per-key order only where that is the promise: keyed entries on several lanes,
            # or delivered by partition; total order otherwise.
            by_partition = s == "b" and self.plan.partitions > 1
            keyed = self.plan.keyed and (self.plan.lanes > 1 or by_partition)
            applied += read_applied(self.dep.engine(s), s, keyed=keyed)
        return verify(
            read_sent(self.dep.engine("a"), "a"),
            applied,
            snapshots=read_snapshots(self.dep.engine("a"), "a"),
            rolled_back=self.source.rolled_back,
            destinations=SINKS,
        )

    def drained(self, n: int) -> Report:
        last: list[Report] = []

        def done() -> Report | None:
            report = self.check()
            last[:] = [report]
            open_snapshots = as_operator(lambda: _open_snapshots(self))
            if report.lost or report.snapshot_problems or open_snapshots:
                return None
            return None if as_operator(self.dep.received_backlog) else report

        wait_for(
            done,
            scaled(120),
            0.25,
            what="every entry delivered and the receive queues empty",
            detail=lambda: (
                "\n".join(
                    [last[0].summary() if last else "", self.plan.describe(n), *self.dep.events]
                )
                + "\n"
                + self.dep.logs()
            ),
        )
        return self.check()

    def close(self) -> None:
        if self.provider is not None and self.provider.poll() is None:
            self.provider.terminate()
            try:
                self.provider.wait(scaled(10))
            except subprocess.TimeoutExpired:
                self.provider.kill()
        for name in PROCESSES:  # nothing left stopped
            p = self.proc(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
        for c in self.clusters.values():
            if not c.running():
                c.start()
        self.source.close()
        self.dep.close()
        for proxy in [*self.proxies.values(), self.db_proxy]:
            if proxy is not None:
                proxy.stop()
        self.dbs.drop()


def _open_snapshots(trial: Trial) -> int:
    """Snapshots of the source neither completed nor cancelled (the drain waits for them)."""
    store = open_store(trial.dep.engine("a"))
    return sum(1 for s in store.snapshots.list_snapshots() if SnapshotStatus(s.status).is_open)


def run_plan(plan: Plan, tmp: Path, clusters: dict[str, PgCluster], tally: Tally) -> Report:
    """Deploy, run every trial of ``plan`` (faults, heal, drain, verify); the last report.

    Adds the figures to ``tally``; raises with the seed and the schedule at the first
    trial whose report is not clean."""
    started = time.monotonic()
    run = Trial(plan, tmp, clusters)
    report: Report | None = None
    n = 0
    try:
        run.deploy()
        for n in range(len(plan.schedules)):
            begun = time.monotonic()
            report = run.trial(n)
            phases = ", ".join(f"{k} {v:.1f}s" for k, v in run.phases.items())
            print(
                f"LR_NEMESIS_SEED={plan.seed} {plan.backend} trial {n}: faults {dict(run.done)},"
                f" {report.counts()} in {time.monotonic() - begun:.1f}s ({phases})",
                flush=True,
            )
            tally.trials += 1
            tally.faults.update(run.done)
            if not report.clean:
                tally.add(report)  # its problems count in the run's figures
                raise AssertionError(
                    f"LR_NEMESIS_SEED={plan.seed} (backend {plan.backend}) trial {n} failed:\n"
                    f"{report.summary()}\n{plan.describe()}\n" + "\n".join(run.dep.events)
                )
        assert report is not None
        tally.skipped += run.skipped
        tally.add(report)
        return report
    except BaseException:
        print(f"LR_NEMESIS_SEED={plan.seed} failed in trial {n}:\n{plan.describe()}")
        print("\n".join(run.dep.events))
        raise
    finally:
        run.close()
        tally.seconds += time.monotonic() - started


def each_run(seed: int, count: int) -> Callable[[int], int]:
    """The seed of run ``n`` of ``count`` runs started from ``seed``."""
    rng = random.Random(seed)
    seeds = [rng.randrange(1, 2**31) for _ in range(count)]
    return lambda n: seeds[n]


__all__ = [
    "KINDS",
    "Fault",
    "Plan",
    "Tally",
    "Trial",
    "draw_plan",
    "each_run",
    "nemesis_seed",
    "nemesis_trials",
    "run_plan",
    "start_clusters",
    "stop_server",
]
