"""Provider switches under steady traffic, real gRPC on loopback, on both backends.

The seed's set: s1 the root, s2 and s3 below it, s4 below s3. s3 is lost (its
server stopped) while s1 originates; the operator runs ``lr provider switch`` at
s4: the new provider adopts it (the ``Cascade`` call) and resumes it after its
position. Every listener gets every entry once, in order (the reliability
verifier), and no full sync is asked for, the new provider still holding what s4
lacks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from lr_server.cli import cli
from tests.integration.test_cascade import Cascade
from tests.kit.sites import SEED_TREE, Sites
from tests.kit.wait import scaled, wait_for


@pytest.fixture
def cascades(sites: Sites) -> Iterator[list[Cascade]]:
    made: list[Cascade] = []
    yield made
    for c in made:
        c.close()


def test_a_leaf_whose_branch_is_lost_is_switched_to_the_root_without_a_full_sync(
    sites: Sites, cascades: list[Cascade]
) -> None:
    c = Cascade(sites, SEED_TREE.with_spares(s4=("s1",)))
    cascades.append(c)
    for node in ("s4", "s3", "s2", "s1"):
        c.start(node)
    c.source.start()
    wait_for(lambda: c.report("s4").applied >= 100, timeout=scaled(60))
    sites.stop("s3")  # the branch is lost; s1 goes on originating
    seen = c.source.committed
    wait_for(lambda: c.source.committed >= seen + 100, timeout=scaled(60))
    assert c.report("s4").lost > 0  # s4 is behind: nobody ships to it

    result = CliRunner().invoke(
        cli,
        [
            "provider",
            "switch",
            "--config",
            str(sites.tmp_path / "s4.toml"),
            "--client",
            "policy",
            "--to",
            "s1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["provider"], out["previous_provider"], out["adopted"]) == ("s1", "s3", True)

    seen = c.source.committed
    wait_for(lambda: c.source.committed >= seen + 100, timeout=scaled(60))
    c.source.stop()
    for node in ("s4", "s2"):
        wait_for(lambda node=node: c.settled(node), timeout=scaled(90))
        report = c.report(node)
        report.assert_clean()  # nothing lost, repeated or out of order
        assert report.applied == report.expected
    assert c.store("s1").list_snapshots("s4") == []  # no full sync was asked for
    node = c.store("s4").cascade_node("policy")
    assert node is not None and (node.provider_id, node.epoch) == ("s1", 2)
    adopted = {ch.child_id: ch for ch in c.store("s1").cascade_children("policy")}["s4"]
    assert (adopted.epoch, adopted.dropped) == (2, False)
