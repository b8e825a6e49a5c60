"""Provider switches, real gRPC on loopback, on both backends.

The seed's set: s1 the root, s2 (a branch with nothing below it: ``branches``) and
s3 below it, s4 below s3. Its two cases: s3 lost (its server stopped) while s1
originates, s4 switched to s1; s1 lost, s3 switched to s2. The operator runs ``lr
provider switch`` at the node that moves: the new provider adopts it (the
``Cascade`` call) and resumes it after its position. Every listener gets every
entry once, in order (the reliability verifier), and no full sync is asked for,
the new provider still holding what the node lacks; a provider that trimmed past
the node serves it a full sync from its own copy instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from lr_client.snapshot import SnapshotProviderRunner
from lr_server.cli import cli
from tests.integration.test_cascade import RATE, REPORTS, Cascade, running
from tests.kit.sites import SEED_TREE, Sites
from tests.kit.traffic import START, read_applied, relay_snapshot_provider
from tests.kit.wait import scaled, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


@pytest.fixture
def cascades(sites: Sites) -> Iterator[list[Cascade]]:
    made: list[Cascade] = []
    yield made
    for c in made:
        c.close()


def switch(sites: Sites, node: str, to: str) -> dict[str, Any]:
    """``lr provider switch`` at ``node``; its JSON outcome (the command succeeded)."""
    config = str(sites.tmp_path / f"{node}.toml")
    result = CliRunner().invoke(
        cli, ["provider", "switch", "--config", config, "--client", "policy", "--to", to, "--json"]
    )
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def assert_complete(c: Cascade, *nodes: str) -> None:
    """Each node settles with every entry, once, in order (the reliability verifier)."""
    for node in nodes:
        wait_for(lambda node=node: c.settled(node), timeout=scaled(90))
        report = c.report(node)
        report.assert_clean()  # nothing lost, repeated or out of order
        assert report.applied == report.expected


def assert_adopted(c: Cascade, node: str, provider: str) -> None:
    """``node`` was switched once, to ``provider``, which counts it as its child."""
    moved = c.store(node).cascade.cascade_node("policy")
    assert moved is not None and (moved.provider_id, moved.epoch) == (provider, 2)
    adopted = {ch.child_id: ch for ch in c.store(provider).cascade.cascade_children("policy")}[node]
    assert (adopted.epoch, adopted.dropped) == (2, False)


def test_a_leaf_whose_branch_is_lost_is_switched_to_the_root_without_a_full_sync(
    sites: Sites, cascades: list[Cascade]
) -> None:
    c = Cascade(sites, SEED_TREE.with_spares(s4=("s1",)), rate=RATE, replication=REPORTS)
    cascades.append(c)
    for node in ("s4", "s3", "s2", "s1"):
        c.start(node)
    c.source.start()
    wait_for(lambda: c.report("s4").applied >= 100, timeout=scaled(60))
    sites.stop("s3")  # the branch is lost; s1 goes on originating
    seen = c.source.committed
    wait_for(lambda: c.source.committed >= seen + 100, timeout=scaled(60))
    assert c.report("s4").lost > 0  # s4 is behind: nobody ships to it

    out = switch(sites, "s4", "s1")
    assert (out["provider"], out["previous_provider"], out["adopted"]) == ("s1", "s3", True)

    seen = c.source.committed
    wait_for(lambda: c.source.committed >= seen + 100, timeout=scaled(60))
    c.source.stop()
    assert_complete(c, "s4", "s2")
    assert c.store("s1").snapshots.list_snapshots("s4") == []  # no full sync was asked for
    assert_adopted(c, "s4", "s1")


def test_when_the_root_is_lost_its_branch_is_switched_to_the_other_branch_without_a_full_sync(
    sites: Sites, cascades: list[Cascade]
) -> None:
    """The seed's first case. s3 (s4 below it) is away while s1 originates, so s2 holds
    entries s3 lacks; the traffic ends and s1 is lost (no new entries of that origin
    exist from then on). s3 is back, switched to s2: s3 and s4 get from s2 every entry
    they lacked, once, in order, without a full sync."""
    c = Cascade(sites, SEED_TREE.with_spares(s3=("s2",)), rate=RATE, replication=REPORTS)
    cascades.append(c)
    for node in ("s4", "s3", "s2", "s1"):
        c.start(node)
    c.source.start()
    wait_for(lambda: c.report("s4").applied >= 100, timeout=scaled(60))
    sites.stop("s3")  # s3 is away: s2 receives what s3 does not
    seen = c.source.committed
    wait_for(lambda: c.source.committed >= seen + 150, timeout=scaled(60))
    c.source.stop()
    wait_for(lambda: c.settled("s2"), timeout=scaled(90))
    s3_at = c.store("s3").recv.sink_progress("s1", "policy").last_position
    assert c.report("s3").lost > 0 and c.report("s4").lost > 0
    # s2 keeps what s3 lacks: the global watermark is at or below s3's position.
    assert c.store("s2").cascade.relay_resume_floor("policy", "s1") <= s3_at
    sites.stop("s1")  # the root is lost
    c.start("s3")  # s3 is back; its provider is gone

    out = switch(sites, "s3", "s2")
    assert (out["provider"], out["previous_provider"], out["adopted"]) == ("s2", "s1", True)

    assert_complete(c, "s2", "s3", "s4")
    assert c.store("s2").snapshots.list_snapshots() == []  # no full sync was asked for
    assert c.store("s3").snapshots.list_snapshots() == []
    for node in ("s3", "s4"):
        assert START not in [a.kind for a in read_applied(c.sinks[node].engine, node)]
    assert_adopted(c, "s3", "s2")


def test_a_node_switched_to_a_provider_that_trimmed_past_it_gets_a_full_sync(
    sites: Sites, cascades: list[Cascade]
) -> None:
    """s4 is away while s2 delivers and releases its copy past s4's position (as once s4
    no longer counted in the watermarks); s4 switched to s2 gets a full sync from s2's
    own copy, then the log entries after it, and goes on with new traffic."""
    c = Cascade(sites, SEED_TREE.with_spares(s4=("s2",)), rate=RATE, replication=REPORTS)
    cascades.append(c)
    for node in ("s4", "s3", "s1"):
        c.start(node)
    c.start("s2", snapshot="app")
    c.source.start()
    wait_for(lambda: c.report("s4").applied >= 100, timeout=scaled(60))
    sites.stop("s4")
    seen = c.source.committed
    wait_for(lambda: c.source.committed >= seen + 100, timeout=scaled(60))
    c.source.stop()
    wait_for(lambda: c.settled("s2"), timeout=scaled(90))
    s2 = c.store("s2")
    s4_at = c.store("s4").recv.sink_progress("s1", "policy").last_position
    s2.cascade.trim_relay("policy", "s1")  # nobody below s2: it releases all it delivered
    assert s2.cascade.relay_resume_floor("policy", "s1") > s4_at  # s2 no longer holds what s4 lacks

    out = switch(sites, "s4", "s2")
    assert (out["provider"], out["previous_provider"], out["adopted"]) == ("s2", "s3", True)
    runner = SnapshotProviderRunner(
        s2, "policy", relay_snapshot_provider(c.sinks["s2"].engine, "s1")
    )
    with running(runner):
        c.start("s4")
        c.source.start()
        seen = c.source.committed
        wait_for(lambda: c.source.committed >= seen + 100, timeout=scaled(60))
        c.source.stop()
        for node in ("s2", "s3", "s4"):
            wait_for(lambda node=node: c.settled(node, "s2"), timeout=scaled(90))
    (snap,) = s2.snapshots.list_snapshots("s4", "policy")
    assert snap.base_position is not None and snap.base_position > s4_at
    leaf = c.report("s4", snapshots_from="s2")
    leaf.assert_clean()
    assert sum(r.snapshots_completed for r in leaf.streams.values()) == 1
    assert [a.kind for a in read_applied(c.sinks["s4"].engine, "s4")].count(START) == 1
    assert c.store("s1").snapshots.list_snapshots() == []  # the root served no full sync
    for node in ("s2", "s3"):
        c.report(node).assert_clean()
