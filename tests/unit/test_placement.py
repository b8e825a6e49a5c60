"""Weighted rendezvous placement: balance, minimal movement, draining, stability."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lr_server.cluster.placement import (
    TRIM_UNIT,
    owner,
    parse_stream_unit,
    place,
    stream_unit,
    uniform,
)

UNITS = [stream_unit(f"d{i % 8}", f"c{i}") for i in range(99)] + [TRIM_UNIT]
member_ids = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-:."), min_size=1, max_size=16
)
members = st.lists(member_ids, min_size=1, max_size=5, unique=True)


def counts(placed: dict[str, str | None], ids: list[str]) -> dict[str, int]:
    return {m: sum(1 for o in placed.values() if o == m) for m in ids}


@settings(max_examples=200, deadline=None)
@given(members)
def test_100_units_are_spread_within_a_bound_over_1_to_5_members(ids: list[str]) -> None:
    placed = place(UNITS, {m: 1 for m in ids})
    assert set(placed.values()) <= set(ids)
    fair = len(UNITS) / len(ids)
    for m, n in counts(placed, ids).items():
        assert abs(n - fair) <= 25, (m, n, fair)  # about five standard deviations


@settings(max_examples=200, deadline=None)
@given(members, member_ids)
def test_a_member_joining_takes_units_only_for_itself(ids: list[str], new: str) -> None:
    if new in ids:
        return
    before = place(UNITS, {m: 1 for m in ids})
    after = place(UNITS, {m: 1 for m in [*ids, new]})
    moved = [u for u in UNITS if before[u] != after[u]]
    assert all(after[u] == new for u in moved)


@settings(max_examples=200, deadline=None)
@given(st.lists(member_ids, min_size=2, max_size=5, unique=True), st.data())
def test_a_member_leaving_gives_up_only_its_own_units(ids: list[str], data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(ids))
    before = place(UNITS, {m: 1 for m in ids})
    after = place(UNITS, {m: 1 for m in ids if m != gone})
    moved = [u for u in UNITS if before[u] != after[u]]
    assert moved == [u for u in UNITS if before[u] == gone]


@settings(max_examples=200, deadline=None)
@given(st.lists(member_ids, min_size=2, max_size=5, unique=True), st.data())
def test_weight_0_drains_a_member_and_moves_nothing_else(
    ids: list[str], data: st.DataObject
) -> None:
    drained = data.draw(st.sampled_from(ids))
    before = place(UNITS, {m: 1 for m in ids})
    after = place(UNITS, {m: (0 if m == drained else 1) for m in ids})
    assert drained not in after.values()
    assert all(after[u] == before[u] for u in UNITS if before[u] != drained)


@settings(max_examples=100, deadline=None)
@given(st.lists(member_ids, min_size=2, max_size=5, unique=True), st.data())
def test_a_weight_change_moves_units_only_to_or_from_that_member(
    ids: list[str], data: st.DataObject
) -> None:
    changed = data.draw(st.sampled_from(ids))
    weight = data.draw(st.integers(2, 5))
    before = place(UNITS, {m: 1 for m in ids})
    after = place(UNITS, {m: (weight if m == changed else 1) for m in ids})
    for u in UNITS:
        if before[u] != after[u]:
            assert after[u] == changed  # a heavier member only gains


def test_weights_split_the_units_in_proportion() -> None:
    units = [stream_unit("d", f"c{i}") for i in range(3000)]
    n = counts(place(units, {"a": 1, "b": 2}), ["a", "b"])
    assert 900 <= n["a"] <= 1100 and 1900 <= n["b"] <= 2100  # 1000 / 2000 expected


def test_no_member_of_positive_weight_owns_nothing() -> None:
    assert owner(TRIM_UNIT, {}) is None
    assert owner(TRIM_UNIT, {"a": 0, "b": 0}) is None


def test_the_hash_is_stable_across_processes_and_releases() -> None:
    # blake2b of b"m1\x00trim" (8 bytes) in (0, 1): the same on every member, run and release.
    assert uniform("m1", "trim") == 0.6025565401724994
    assert 0.0 < uniform("a", "b") < 1.0


def test_stream_units_name_their_stream() -> None:
    assert parse_stream_unit(stream_unit("site-b", "policy")) == ("site-b", "policy")
    assert parse_stream_unit(TRIM_UNIT) is None
