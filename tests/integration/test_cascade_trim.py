"""Watermarks and trim of a running set under traffic, real gRPC on loopback, on both
backends: every node reports to its provider (the kit gives it the provider's
address), the global watermark rises at the root, the root trims its send queue (also
the entries of nodes it does not ship to) and the branch releases its relay copy, and
every listener still gets every entry once, in order.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.test_cascade import RATE, REPORTS, Cascade
from tests.kit.sites import CHAIN, Sites
from tests.kit.wait import scaled, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


#: Trim and rotate often, so that released entries go while the test watches.
FAST_TRIM = (
    "[retention]\ntrim_interval = 0.1\nrotation_period = 0.2\n[receiver]\nrotation_period = 0.2"
)


@pytest.fixture
def cascades(sites: Sites) -> Iterator[list[Cascade]]:
    made: list[Cascade] = []
    yield made
    for c in made:
        c.close()


def test_under_traffic_the_global_watermark_rises_and_the_root_and_the_branch_trim(
    sites: Sites, cascades: list[Cascade]
) -> None:
    """c1 -> c2 -> c3 under steady traffic: c3 reports to c2, c2 to c1; the root's global
    watermark rises, c2 stores it, the root's oldest entry and c2's relay floor pass a
    watermark seen earlier;
    nothing is lost, repeated or out of order at c2 and c3."""
    c = Cascade(sites, CHAIN, rate=RATE, replication=REPORTS, extra=FAST_TRIM)
    cascades.append(c)
    for node in ("c3", "c2", "c1"):
        c.start(node)
    c.source.start()

    def global_wm(node: str) -> int:
        row = c.store(node).cascade.cascade_node("policy")
        assert row is not None
        return row.global_watermark

    wait_for(lambda: global_wm("c1") > 0, timeout=scaled(60))
    first = global_wm("c1")
    wait_for(lambda: global_wm("c1") > first + 50, timeout=scaled(60))  # it rises
    wait_for(lambda: global_wm("c2") >= first, timeout=scaled(60))  # and travels down

    def root_trimmed() -> bool:
        oldest = c.store("c1").shipping.oldest_position("policy")
        return oldest is not None and oldest > first

    wait_for(root_trimmed, timeout=scaled(60))  # the root released what all nodes have
    wait_for(
        lambda: c.store("c2").cascade.relay_resume_floor("policy", "c1") >= first,
        timeout=scaled(60),
    )  # the branch released its relay copy too
    children = {ch.child_id: ch for ch in c.store("c1").cascade.cascade_children("policy")}
    assert children["c2"].local_watermark >= first and not children["c2"].dropped
    children = {ch.child_id: ch for ch in c.store("c2").cascade.cascade_children("policy")}
    assert children["c3"].local_watermark >= first and not children["c3"].dropped

    c.source.stop()
    for node in ("c2", "c3"):
        wait_for(lambda node=node: c.settled(node), timeout=scaled(90))
        report = c.report(node)
        report.assert_clean()  # nothing lost, repeated or out of order
        assert report.applied == report.expected
    assert c.store("c2").snapshots.list_snapshots("c3") == []  # no full sync was needed
