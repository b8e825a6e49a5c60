"""The nemesis over a cascaded client: relays killed, paused, their databases crashed, the
leaf switched between providers, then the verifier at every node.

The seed's set (:data:`tests.kit.sites.SEED_TREE`; ``s4`` may switch to
``s1`` or ``s2`` and back to ``s3``) as four ``lr server`` processes: ``s1``
the root (the source application, in this process), ``s2`` a
branch with nothing below it, ``s3`` a relay with the leaf ``s4`` below it; a
sink application (in this process) at each node. From the run's seed each
trial draws, over a few seconds of the root's traffic:

* ``kill``: SIGKILL of ``s2``, ``s3`` or ``s4``, restarted after a pause;
* ``pause``: SIGSTOP of ``s3`` or ``s4``, SIGCONT after up to 4 s;
* ``switch``: ``lr provider switch`` of ``s4`` to another of ``s1``, ``s2``,
  ``s3`` (the relay it leaves may be dead or paused);
* ``db-crash`` (PostgreSQL): ``pg_ctl stop -m immediate`` of the cluster of
  ``s1``, ``s3`` or ``s4``, started again under traffic.

Each trial heals, stops the traffic and waits until every node's listener
has every entry the root committed, once and in order.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from click.testing import CliRunner

from lr_server.cli import cli
from tests.kit.pgcluster import PgCluster
from tests.kit.sites import Sites
from tests.kit.verifier import Report
from tests.kit.wait import scaled, wait_for
from tests.reliability.nemesis import Databases, Fault, Plan, Tally, as_operator
from tests.reliability.test_cascade_kill import Processes

NODES = ("s2", "s3", "s4")
PROVIDERS = ("s1", "s2", "s3")
#: The PostgreSQL cluster of each node (the nemesis's clusters are named for its sites).
CLUSTER_OF = {"s1": "a", "s2": "b", "s3": "c", "s4": "d"}
CASCADE_KINDS = ("kill", "pause", "switch", "db-crash")


def draw_cascade_plan(
    seed: int, backend: str, trials: int = 1, seconds: float = 3.0, faults: int = 4
) -> Plan:
    """The run of ``seed`` over the cascade on ``backend`` (deterministic)."""
    rng = random.Random(f"nemesis-cascade/{seed}/{backend}")
    kinds = [k for k in CASCADE_KINDS if backend == "postgresql" or k != "db-crash"]
    schedules = []
    for _ in range(trials):
        drawn = []
        for _ in range(faults):
            kind = rng.choice(kinds)
            at = rng.uniform(0.0, seconds * 0.8)
            mode = ""
            if kind == "kill":
                target, hold = rng.choice(NODES), rng.uniform(0.1, 1.5)
            elif kind == "pause":
                target, hold = rng.choice(["s3", "s4"]), rng.uniform(0.3, 4.0)
            elif kind == "switch":
                target, hold = "s4", 0.0
                mode = rng.choice(PROVIDERS)
            else:
                target, hold = rng.choice(["s1", "s3", "s4"]), rng.uniform(0.1, 1.5)
            drawn.append(Fault(round(at, 3), kind, target, round(hold, 3), mode))
        schedules.append(tuple(sorted(drawn, key=lambda f: f.at)))
    return Plan(seed, backend, 1, 1, False, seconds, tuple(schedules))


class CascadeRun:
    """The set as processes (:class:`Processes`), its fault injectors and its checks."""

    def __init__(self, plan: Plan, tmp: Path, clusters: dict[str, PgCluster]) -> None:
        self.plan = plan
        self.clusters = clusters
        by_node = {n: clusters[c] for n, c in CLUSTER_OF.items() if c in clusters}
        self.dbs = Databases(plan.backend, tmp, by_node)
        self.sites = Sites(tmp, self.dbs.url)
        self.c = Processes(self.sites)
        self.c.source.rate = 60
        self.locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self.done: Counter[str] = Counter()
        self.skipped = 0
        self.errors: list[str] = []
        self.events: list[str] = []
        self.phases: dict[str, float] = {}
        self.provider = "s3"  # s4's, as the last switch left it

    def deploy(self) -> None:
        mark = time.monotonic()
        for node in ("s4", "s3", "s2", "s1"):
            self.c.start(node)
        self.c.wait_listening()
        self.phases["deploy"] = time.monotonic() - mark

    def inject(self, f: Fault, t0: float, stop: threading.Event) -> None:
        if stop.wait(max(0.0, t0 + f.at - time.monotonic())):
            return
        lock = self.locks[f"{f.kind}:{f.target}"]  # a paused process may be killed
        if not lock.acquire(blocking=False):
            self.skipped += 1
            self.events.append(f"skip {f} (target busy)")
            return
        try:
            self.events.append(
                f"{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:5.2f}s"
                f" {f.kind} {f.target} {f.mode}"
            )
            if self._apply(f):
                self.done[f.kind] += 1
        except Exception as exc:
            self.errors.append(f"{f}: {type(exc).__name__}: {exc}")
        finally:
            lock.release()

    def _apply(self, f: Fault) -> bool:
        server = self.c.servers.get(f.target)
        if f.kind == "kill":
            assert server is not None
            server.kill()
            time.sleep(f.hold)
            self.c.start(f.target)
        elif f.kind == "pause":
            assert server is not None and server.proc is not None
            if server.proc.poll() is not None:
                return False
            server.signal(signal.SIGSTOP)
            try:
                time.sleep(f.hold)
            finally:
                server.signal(signal.SIGCONT)
        elif f.kind == "switch":
            if f.mode == self.provider:
                return False  # already there: not a switch
            self.switch(f.mode)
        else:
            cluster = self.clusters[CLUSTER_OF[f.target]]
            cluster.crash()
            try:
                time.sleep(f.hold)
            finally:
                cluster.start()
        return True

    def switch(self, to: str, timeout: float = 60.0) -> None:
        """``lr provider switch`` of ``s4`` to ``to``, again while its database is down."""
        config = str(self.sites.tmp_path / "s4.toml")
        args = ["provider", "switch", "--config", config, "--client", "policy", "--to", to]
        deadline = time.monotonic() + scaled(timeout)
        while True:
            result = CliRunner().invoke(cli, [*args, "--json"])
            if result.exit_code == 0:
                assert json.loads(result.output)["provider"] == to, result.output
                break
            node = as_operator(lambda: self.c.store("s4").cascade.cascade_node("policy"))
            if node is not None and node.provider_id == to:
                break  # it did switch: the answer was lost
            assert time.monotonic() < deadline, result.output
            time.sleep(0.2)
        self.provider = to

    def trial(self, n: int) -> Report:
        self.done.clear()
        self.phases = {k: v for k, v in self.phases.items() if k == "deploy"} if n == 0 else {}
        mark = time.monotonic()
        floor = {node: self.report(node).applied + 10 for node in NODES}
        self.c.source.start()
        for node in NODES:
            wait_for(
                lambda node=node: self.report(node).applied >= floor[node],
                scaled(60),
                0.1,
                what=f"traffic reaching {node}",
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
        for node, server in self.c.servers.items():
            if server.proc is not None and server.proc.poll() is not None:
                raise AssertionError(f"{node} exited by itself\n{server.log()}")
        self.c.source.stop()
        mark = time.monotonic()
        for node in NODES:
            wait_for(
                lambda node=node: self.settled(node),
                scaled(120),
                0.25,
                what=f"{node} settled",
                detail=lambda node=node: "\n".join(
                    [self.report(node).summary(), self.plan.describe(n), *self.events]
                ),
            )
        self.phases["drain"] = time.monotonic() - mark
        return self.check()

    def report(self, node: str) -> Report:
        """The verifier's report of ``node`` (read again if a pooled connection of this
        process died with a crashed database)."""
        return as_operator(lambda: self.c.report(node))

    def settled(self, node: str) -> bool:
        report = self.report(node)
        return report.lost == 0 and report.expected > 0

    def check(self) -> Report:
        reports = [self.report(node) for node in NODES]
        merged = dict(reports[0].streams)
        for r in reports[1:]:
            merged.update(r.streams)
        return Report(merged, sorted({x for r in reports for x in r.rolled_back_delivered}))

    def close(self) -> None:
        for server in self.c.servers.values():
            if server.proc is not None and server.proc.poll() is None:
                server.signal(signal.SIGCONT)
        for cluster in self.clusters.values():
            if not cluster.running():
                cluster.start()
        try:
            self.c.close()
        finally:
            self.sites.close()
            self.dbs.drop()


def run_cascade_plan(plan: Plan, tmp: Path, clusters: dict[str, PgCluster], tally: Tally) -> Report:
    """Deploy the set, run every trial of ``plan``, verify after each; the last report."""
    started = time.monotonic()
    run = CascadeRun(plan, tmp, clusters)
    report: Report | None = None
    n = 0
    try:
        run.deploy()
        for n in range(len(plan.schedules)):
            begun = time.monotonic()
            report = run.trial(n)
            phases = ", ".join(f"{k} {v:.1f}s" for k, v in run.phases.items())
            print(
                f"LR_NEMESIS_SEED={plan.seed} cascade {plan.backend} trial {n}:"
                f" faults {dict(run.done)}, {report.counts()}"
                f" in {time.monotonic() - begun:.1f}s ({phases})",
                flush=True,
            )
            tally.trials += 1
            tally.faults.update({f"cascade-{k}": v for k, v in run.done.items()})
            if not report.clean:
                tally.add(report)  # its problems count in the run's figures
                raise AssertionError(
                    f"LR_NEMESIS_SEED={plan.seed} (cascade, {plan.backend}) trial {n}:\n"
                    f"{report.summary()}\n{plan.describe()}\n" + "\n".join(run.events)
                )
        assert report is not None
        tally.skipped += run.skipped
        tally.add(report)
        return report
    except BaseException:
        print(f"LR_NEMESIS_SEED={plan.seed} (cascade) failed in trial {n}:\n{plan.describe()}")
        print("\n".join(run.events))
        raise
    finally:
        run.close()
        tally.seconds += time.monotonic() - started
