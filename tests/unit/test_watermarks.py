"""Watermarks of a cascaded client: the pure rules, and a model of a whole set.

The property: over random trees, random progress, reports that arrive late
and out of order, provider switches and retention drops, the highest position
any node has trimmed never exceeds the delivered position of any live node of
the set (one not cut off by a drop): trimming never deletes what a node, below
or anywhere it could be switched to, still needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lr_server.cascade.watermarks import (
    DEFAULT_GRACE,
    ChildReport,
    counts,
    global_watermark,
    local_watermark,
    relay_floor,
    root_trim_bound,
)


# -- the rules, one by one ----------------------------------------------------------------
def test_local_watermark_is_the_minimum_of_own_delivery_and_children() -> None:
    kids = [
        ChildReport("S4", local_watermark=7, acked_position=9, reported_at=100.0),
        ChildReport("S5", local_watermark=12, acked_position=12, reported_at=100.0),
    ]
    assert local_watermark(10, kids, now=101.0) == 7
    assert local_watermark(5, kids, now=101.0) == 5
    assert local_watermark(10, [], now=101.0) == 10


def test_a_child_that_never_reported_holds_everything() -> None:
    seeded = ChildReport("S4")  # from the config, no report yet
    assert local_watermark(50, [seeded], now=1.0) == 0
    assert global_watermark(50, [seeded], now=1.0) == 0
    assert relay_floor(40, 50, [seeded], now=1.0) == 0


def test_a_dead_dropped_leaf_does_not_pin_the_root() -> None:
    dead = ChildReport("S4", local_watermark=3, reported_at=0.0, dropped=True)
    alive = ChildReport("S2", local_watermark=90, reported_at=1000.0)
    assert global_watermark(100, [dead, alive], now=1000.0) == 90
    assert root_trim_bound(global_watermark(100, [dead, alive], now=1000.0)) == 90
    # Never reported and dropped: it leaves at once too.
    assert global_watermark(100, [ChildReport("S4", dropped=True), alive], now=1000.0) == 90
    # Not dropped, it pins (retention is what drops it).
    assert global_watermark(100, [replace(dead, dropped=False), alive], now=1000.0) == 3


def test_a_child_that_just_switched_away_counts_for_the_grace() -> None:
    left = ChildReport("S4", local_watermark=3, reported_at=100.0, dropped=True)
    assert counts(left, now=100.0 + DEFAULT_GRACE - 1)
    assert global_watermark(100, [left], now=100.0 + DEFAULT_GRACE - 1) == 3
    assert not counts(left, now=100.0 + DEFAULT_GRACE)
    assert global_watermark(100, [left], now=100.0 + DEFAULT_GRACE) == 100
    assert global_watermark(100, [left], now=105.0, grace=5.0) == 100


def test_relay_floor_keeps_what_the_set_and_the_children_need() -> None:
    kid = ChildReport("S4", local_watermark=30, acked_position=35, reported_at=10.0)
    assert relay_floor(20, 50, [kid], now=11.0) == 20  # the global watermark
    assert relay_floor(60, 50, [kid], now=11.0) == 30  # the child's own watermark
    assert relay_floor(60, 25, [kid], now=11.0) == 25  # own delivery
    assert relay_floor(60, 50, [], now=11.0) == 50


def test_root_trim_bound_is_also_bounded_by_the_destinations() -> None:
    assert root_trim_bound(40) == 40
    assert root_trim_bound(40, 30) == 30
    assert root_trim_bound(40, 55) == 40


# -- the model of a set -------------------------------------------------------------------
@dataclass
class Message:
    sent_at: int
    kind: str  # "report" (child -> provider) or "reply" (provider -> child)
    sender: int
    to: int
    epoch: int = 0
    local_wm: int = 0
    applied: int = 0
    global_wm: int = 0


@dataclass
class SetModel:
    providers: dict[int, int]  # node -> provider (root 0 absent)
    max_delay: int
    grace: float
    clock: int = 0
    head: int = 0
    applied: dict[int, int] = field(default_factory=dict)
    epoch: dict[int, int] = field(default_factory=dict)
    rows: dict[int, dict[int, ChildReport]] = field(default_factory=dict)
    stored_gw: dict[int, int] = field(default_factory=dict)
    trimmed: dict[int, int] = field(default_factory=dict)
    inflight: list[Message] = field(default_factory=list)
    cut: set[int] = field(default_factory=set)  # dropped by retention, and the nodes below

    def __post_init__(self) -> None:
        nodes = [0, *self.providers]
        self.applied = dict.fromkeys(nodes, 0)
        self.epoch = dict.fromkeys(nodes, 0)
        self.rows = {n: {} for n in nodes}
        self.stored_gw = dict.fromkeys(nodes, 0)
        self.trimmed = dict.fromkeys(nodes, 0)
        for child, provider in self.providers.items():
            self.rows[provider][child] = ChildReport(str(child))  # seeded from the config

    # what each node computes from what it knows
    def local_wm(self, n: int) -> int:
        return local_watermark(self.applied[n], self.rows[n].values(), self.clock, self.grace)

    def bound(self, n: int) -> int:
        if n == 0:
            return root_trim_bound(
                global_watermark(self.head, self.rows[0].values(), self.clock, self.grace)
            )
        return relay_floor(
            self.stored_gw[n], self.applied[n], self.rows[n].values(), self.clock, self.grace
        )

    def below(self, n: int) -> set[int]:
        found = {n}
        grew = True
        while grew:
            more = {c for c, p in self.providers.items() if p in found} - found
            grew = bool(more)
            found |= more
        return found

    def live(self) -> list[int]:
        return [n for n in self.applied if n not in self.cut]

    # events
    def trim_everywhere(self) -> None:
        for n in self.live():
            self.trimmed[n] = max(self.trimmed[n], self.bound(n))

    def deliver(self, msg: Message) -> None:
        self.inflight.remove(msg)
        if msg.kind == "reply":
            self.stored_gw[msg.to] = msg.global_wm
            return
        row = self.rows[msg.to].get(msg.sender)
        if row is not None and msg.epoch < row.epoch:
            return  # an older epoch: refused
        dropped = row.dropped if row is not None and row.epoch == msg.epoch else False
        self.rows[msg.to][msg.sender] = ChildReport(
            str(msg.sender), msg.epoch, msg.local_wm, msg.applied, float(self.clock), dropped
        )
        gw = (
            global_watermark(self.head, self.rows[0].values(), self.clock, self.grace)
            if msg.to == 0
            else self.stored_gw[msg.to]
        )
        self.inflight.append(Message(self.clock, "reply", msg.to, msg.sender, global_wm=gw))

    def tick(self) -> None:
        self.clock += 1
        for msg in [m for m in self.inflight if m.sent_at <= self.clock - self.max_delay]:
            self.deliver(msg)
        for n in self.live():
            if n != 0:
                self.inflight.append(
                    Message(
                        self.clock,
                        "report",
                        n,
                        self.providers[n],
                        self.epoch[n],
                        self.local_wm(n),
                        self.applied[n],
                    )
                )

    def originate(self, entries: int) -> None:
        self.head += entries
        self.applied[0] = self.head  # the root has everything it originated

    def advance(self, n: int, fraction: float) -> None:
        top = self.head if n == 0 else self.applied[self.providers[n]]
        self.applied[n] = max(self.applied[n], int(top * fraction))

    def switch(self, n: int, to: int) -> None:
        """``lr provider switch``: the new provider adopts first, then the old one is refused."""
        assert self.trimmed[to] <= self.applied[n], "the new provider trimmed what the node needs"
        old = self.providers[n]
        self.epoch[n] += 1
        self.rows[to][n] = ChildReport(
            str(n), self.epoch[n], self.local_wm(n), self.applied[n], float(self.clock)
        )
        self.providers[n] = to
        if n in self.rows[old]:
            self.rows[old][n] = replace(self.rows[old][n], dropped=True)

    def drop(self, n: int) -> None:
        provider = self.providers[n]
        self.rows[provider][n] = replace(self.rows[provider][n], dropped=True)
        self.cut |= self.below(n)

    def check(self) -> None:
        live = self.live()
        for n in live:
            for m in live:
                assert self.trimmed[n] <= self.applied[m], (
                    f"node {n} trimmed through {self.trimmed[n]} but live node {m} "
                    f"has delivered only {self.applied[m]}"
                )


@st.composite
def sets(draw: st.DrawFn) -> SetModel:
    size = draw(st.integers(2, 7))
    providers = {i: draw(st.integers(0, i - 1)) for i in range(1, size)}
    max_delay = draw(st.integers(1, 3))
    depth = size  # a chain is the deepest tree
    grace = float((depth + 1) * (2 * max_delay + 2))
    return SetModel(providers, max_delay, grace)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=sets(), data=st.data())
def test_trimming_never_deletes_what_a_live_node_needs(
    model: SetModel, data: st.DataObject
) -> None:
    for _ in range(data.draw(st.integers(10, 120), label="steps")):
        live = model.live()
        event = data.draw(
            st.sampled_from(["head", "advance", "deliver", "tick", "tick", "switch", "drop"])
        )
        if event == "head":
            model.originate(data.draw(st.integers(1, 20)))
        elif event == "advance":
            model.advance(data.draw(st.sampled_from(live)), data.draw(st.floats(0, 1)))
        elif event == "deliver" and model.inflight:
            model.deliver(data.draw(st.sampled_from(model.inflight)))
        elif event == "tick":
            model.tick()
        elif event == "switch":
            movable = [n for n in live if n != 0]
            if movable:
                n = data.draw(st.sampled_from(movable))
                targets = [t for t in live if t not in model.below(n) and t != model.providers[n]]
                if targets:
                    model.switch(n, data.draw(st.sampled_from(targets)))
        elif event == "drop" and data.draw(st.integers(0, 3)) == 0:
            droppable = [n for n in live if n != 0]
            if droppable:
                model.drop(data.draw(st.sampled_from(droppable)))
        model.trim_everywhere()
        model.check()


def test_the_model_finds_the_switch_race_without_the_grace() -> None:
    """Without the grace the race is real, and the model (so the property) sees it."""
    model = SetModel({1: 0, 2: 0, 3: 2}, max_delay=1, grace=0.0)
    model.originate(100)
    for n in (1, 2, 3):
        model.advance(n, 1.0)
    model.applied[3] = 50  # node 3 is behind
    model.tick()  # 1 reports 100 to the root (1 has no child yet), 2 reports 0, 3 reports 50
    model.switch(3, to=1)  # 1 adopts 3; 2 is refused and lets 3 go at once (no grace)
    model.tick()  # the first reports arrive; 2 now reports 100 (without 3)
    for msg in [m for m in model.inflight if m.kind == "report" and m.sender == 2]:
        model.deliver(msg)
    # The root holds 1's report from before the adoption and 2's from after the refusal.
    model.trim_everywhere()
    assert model.trimmed[0] == 100
    with pytest.raises(AssertionError, match="live node 3"):
        model.check()
