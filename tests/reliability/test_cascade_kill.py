"""kill -9 of a relay: a branch's ``lr server`` SIGKILLed under traffic, its leaf switched.

The seed's set as four real ``lr server`` processes on one backend: s1 the root,
s2 (a branch with nothing below it) and s3 below it, s4 below s3. While s1
originates, s3's process is SIGKILLed; the operator switches s4 to s1 or s2 (the
seed chooses) with ``lr provider switch``; the new provider adopts s4 and
resumes it after its position. s3 comes back later (as a restarted process
would) and catches up from s1; s4 refuses it as its provider. Every listener
(s2, s3, s4: in-process subscribers on each node's database) gets every entry
the root committed once, in order (the reliability verifier), and no full sync
is asked for anywhere.

Knobs: ``LR_RELIABILITY_SEED`` (the kill point and the new provider),
``LR_RELIABILITY_TRIALS`` (default 1: a trial takes some 20 s).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_cascade import Cascade
from tests.integration.test_cascade_switch import switch
from tests.kit.procs import LrServer
from tests.kit.sites import SEED_TREE, Sites
from tests.kit.traffic import START, read_applied
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import reliability_seed, stop_server, trial_count

pytestmark = pytest.mark.slow

TREE = SEED_TREE.with_spares(s4=("s1", "s2"))


class Processes(Cascade):
    """The set's nodes as ``lr server`` processes (their listeners stay in this process)."""

    def __init__(self, sites: Sites) -> None:
        super().__init__(sites, TREE)
        self.servers: dict[str, LrServer] = {}

    def start(self, node: str, **kw: object) -> None:
        config = self.sites.node_config(self.tree, node, **kw)
        self.servers[node] = LrServer(config, self.sites.tmp_path).start()

    def wait_listening(self) -> None:
        for node, server in self.servers.items():
            server.wait_listening(self.sites.port(node), timeout=scaled(60))

    def more(self, entries: int) -> None:
        """Wait until the root's application committed ``entries`` more."""
        seen = self.source.committed
        wait_for(lambda: self.source.committed >= seen + entries, timeout=scaled(60))

    def close(self) -> None:
        for server in self.servers.values():
            stop_server(server)
        super().close()


def trial(c: Processes, kill_after: int, to: str) -> None:
    """Kill s3 once s4 applied ``kill_after`` entries, switch s4 to ``to``, restart s3."""
    for node in ("s4", "s3", "s2", "s1"):
        c.start(node)
    c.wait_listening()
    c.source.start()
    wait_for(lambda: c.report("s4").applied >= kill_after, timeout=scaled(60))
    c.servers["s3"].kill()  # SIGKILL: no cleanup at all
    c.more(50)
    out = switch(c.sites, "s4", to)
    assert (out["provider"], out["previous_provider"], out["adopted"]) == (to, "s3", True)
    c.more(50)
    c.start("s3")  # the relay comes back: s1's child still, s4's provider no more
    c.more(50)
    c.source.stop()
    for node in ("s2", "s3", "s4"):
        wait_for(lambda node=node: c.settled(node), timeout=scaled(90), what=node)
        report = c.report(node)
        report.assert_clean()  # nothing lost, repeated or out of order
        assert report.applied == report.expected
        assert START not in [a.kind for a in read_applied(c.sinks[node].engine, node)]
    for node in ("s1", "s2", "s3"):
        assert c.store(node).snapshots.list_snapshots() == []  # no full sync anywhere
    leaf = c.store("s4").cascade.cascade_node("policy")
    assert leaf is not None and (leaf.provider_id, leaf.epoch) == (to, 2)


def test_sigkill_of_a_relay_under_traffic_its_leaf_switched_loses_nothing(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    rng = random.Random(reliability_seed())
    for n in range(trial_count(default=1)):
        kill_after = rng.randint(30, 150)  # entries s4 applied when s3 is killed
        to = rng.choice(["s1", "s2"])
        print(f"trial {n}: kill s3 once s4 applied {kill_after}; switch s4 to {to}")
        workdir = tmp_path / f"t{n}"
        workdir.mkdir()
        sites = Sites(workdir, lambda name, n=n: db_url_factory(f"t{n}-{name}"))
        c = Processes(sites)
        try:
            trial(c, kill_after, to)
        finally:
            c.close()
            sites.close()
