"""The reliability verifier detects each kind of fault on synthetic inputs."""

from __future__ import annotations

import pytest

from tests.kit.verifier import (
    END,
    SNAPSHOT,
    START,
    AppliedEntry,
    SentEntry,
    SnapshotInfo,
    verify,
)


def sent(n: int, dests: tuple[str, ...] = ("b",), client: str = "policy") -> list[SentEntry]:
    return [SentEntry("a", client, p, f"id{p}", dests) for p in range(1, n + 1)]


def applied(
    positions: list[int], sink: str = "b", client: str = "policy", start: int = 1
) -> list[AppliedEntry]:
    return [
        AppliedEntry(sink, "a", client, p, f"id{p}", order=start + i)
        for i, p in enumerate(positions)
    ]


def test_clean_run_reports_nothing() -> None:
    report = verify(sent(5, ("b", "c")), applied([1, 2, 3, 4, 5]) + applied([1, 2, 3, 4, 5], "c"))
    assert report.clean
    assert report.counts() == {
        "expected": 10,
        "applied": 10,
        "lost": 0,
        "duplicated": 0,
        "out_of_order": 0,
        "unexpected": 0,
        "corrupt": 0,
        "snapshot_problems": 0,
        "rolled_back_delivered": 0,
    }
    report.assert_clean()


def test_lost_entries_are_reported_per_destination() -> None:
    report = verify(sent(5, ("b", "c")), applied([1, 2, 3, 4, 5]) + applied([1, 2, 4], "c"))
    assert report.lost == 2
    assert report.streams[("a", "c", "policy")].lost == [3, 5]
    assert report.streams[("a", "b", "policy")].clean
    with pytest.raises(AssertionError, match=r"lost=2 \[3, 5\]"):
        report.assert_clean()


def test_duplicates_are_reported() -> None:
    report = verify(sent(4), applied([1, 2, 3, 2, 4]))
    assert report.duplicated == 1
    assert report.streams[("a", "b", "policy")].duplicated == [2]
    assert report.out_of_order == 0  # a repeat is a duplicate, not a reordering
    assert report.lost == 0


def test_reordering_is_reported() -> None:
    report = verify(sent(4), applied([1, 3, 2, 4]))
    assert report.out_of_order == 1
    assert report.streams[("a", "b", "policy")].out_of_order == [(3, 2)]
    assert report.lost == report.duplicated == 0


def test_entries_never_committed_and_wrong_payloads_are_reported() -> None:
    rows = applied([1, 2, 3])
    rows.append(AppliedEntry("b", "a", "policy", 9, "id9", order=10))  # never committed
    rows[1] = AppliedEntry("b", "a", "policy", 2, "other", order=2)  # wrong payload at 2
    report = verify(sent(3), rows)
    assert report.unexpected == 1 and report.corrupt == 1
    assert report.streams[("a", "b", "policy")].corrupt == [2]


def test_an_entry_for_another_destination_is_unexpected() -> None:
    report = verify(sent(2, ("c",)), applied([1, 2], "c") + applied([2], "b"))
    assert report.streams[("a", "b", "policy")].unexpected == [2]


def test_rolled_back_payloads_must_not_arrive() -> None:
    rows = [*applied([1]), AppliedEntry("b", "a", "policy", 2, "rb-1", order=5)]
    report = verify(sent(1), rows, rolled_back=["rb-1", "rb-2"])
    assert report.rolled_back_delivered == ["rb-1"]
    assert not report.clean


def test_streams_are_separate_per_client() -> None:
    rows = applied([1, 2]) + applied([2, 1], client="inventory", start=10)
    report = verify(sent(2) + sent(2, client="inventory"), rows)
    assert report.streams[("a", "b", "policy")].clean
    assert report.streams[("a", "b", "inventory")].out_of_order == [(2, 1)]


def test_destination_filter() -> None:
    report = verify(sent(3, ("b", "c")), applied([1, 2, 3]), destinations=["b"])
    assert report.clean and set(report.streams) == {("a", "b", "policy")}


def snapshot_rows(
    sid: str, count: int, start: int, ordinals: list[int] | None = None
) -> list[AppliedEntry]:
    rows = [AppliedEntry("b", "a", "policy", 0, "", START, sid, start)]
    for i, n in enumerate(ordinals if ordinals is not None else list(range(1, count + 1))):
        rows.append(AppliedEntry("b", "a", "policy", n, f"s{n}", SNAPSHOT, sid, start + 1 + i))
    rows.append(AppliedEntry("b", "a", "policy", 0, "", END, sid, start + 100))
    return rows


SNAP = SnapshotInfo("s1", "a", "b", "policy", base_position=6, entry_count=3)


def test_a_completed_snapshot_covers_entries_up_to_its_base() -> None:
    # 1..3 as log entries, then a snapshot with base 6, then 7..10.
    rows = applied([1, 2, 3]) + snapshot_rows("s1", 3, 10) + applied([7, 8, 9, 10], start=200)
    report = verify(sent(10), rows, snapshots=[SNAP])
    assert report.clean, report.summary()
    stream = report.streams[("a", "b", "policy")]
    assert stream.covered == 6 and stream.snapshots_completed == 1 and stream.snapshot_entries == 3


def test_entries_after_the_base_are_still_required() -> None:
    rows = snapshot_rows("s1", 3, 10) + applied([7, 9, 10], start=200)
    report = verify(sent(10), rows, snapshots=[SNAP])
    assert report.streams[("a", "b", "policy")].lost == [8]


def test_snapshot_entries_lost_duplicated_or_reordered() -> None:
    lost = verify(sent(6), snapshot_rows("s1", 3, 10, [1, 3]), snapshots=[SNAP])
    assert lost.snapshot_problems == 1 and "1 of 3 entries lost [2]" in lost.summary()
    dup = verify(sent(6), snapshot_rows("s1", 3, 10, [1, 2, 2, 3]), snapshots=[SNAP])
    assert "applied twice [2]" in dup.summary()
    order = verify(sent(6), snapshot_rows("s1", 3, 10, [1, 3, 2]), snapshots=[SNAP])
    assert "out of order" in order.summary()


def test_log_entries_must_not_interleave_with_a_snapshot_or_precede_its_base() -> None:
    inside = snapshot_rows("s1", 3, 10)
    inside.append(AppliedEntry("b", "a", "policy", 7, "id7", order=50))  # between start and end
    report = verify(sent(7), inside, snapshots=[SNAP])
    assert report.out_of_order == 1
    stale = snapshot_rows("s1", 3, 10) + applied([5, 7], start=200)  # 5 <= base 6
    report = verify(sent(7), stale, snapshots=[SNAP])
    assert (6, 5) in report.streams[("a", "b", "policy")].out_of_order


def test_an_unfinished_snapshot_covers_nothing() -> None:
    rows = snapshot_rows("s1", 3, 10)[:-1]  # no end: superseded or still running
    report = verify(sent(6), rows, snapshots=[SNAP])
    assert report.lost == 6


def test_a_snapshot_the_source_does_not_know_is_a_problem() -> None:
    report = verify(sent(0), snapshot_rows("zz", 1, 10))
    assert "unknown at the source" in report.summary()


def test_entries_after_the_base_are_replayed_after_the_snapshot() -> None:
    # 1..8 as log entries, a snapshot with base 6 fixed while 7 and 8 were in flight,
    # then 7..10 again: the replay of 7 and 8 is expected, not a duplicate.
    rows = (
        applied(list(range(1, 9))) + snapshot_rows("s1", 3, 10) + applied([7, 8, 9, 10], start=200)
    )
    report = verify(sent(10), rows, snapshots=[SNAP])
    assert report.clean, report.summary()


def test_entries_after_the_base_applied_only_before_the_snapshot_are_lost() -> None:
    # The snapshot (state as of base 6, or a little later) overwrote what 7 and 8 did,
    # and they never came again: their effect is lost.
    rows = applied(list(range(1, 9))) + snapshot_rows("s1", 3, 10) + applied([9, 10], start=200)
    report = verify(sent(10), rows, snapshots=[SNAP])
    assert report.streams[("a", "b", "policy")].lost == [7, 8]


def test_duplicates_within_an_epoch_after_a_snapshot() -> None:
    rows = snapshot_rows("s1", 3, 10) + applied([7, 8, 8, 9], start=200)
    report = verify(sent(9), rows, snapshots=[SNAP])
    assert report.streams[("a", "b", "policy")].duplicated == [8]


def keyed_applied(rows: list[tuple[int, str]]) -> list[AppliedEntry]:
    """(position, key) in apply order; key "" for an entry without one."""
    return [
        AppliedEntry("b", "a", "policy", p, f"id{p}", order=i + 1, key=k)
        for i, (p, k) in enumerate(rows)
    ]


def test_keyed_entries_need_order_per_key_and_around_unkeyed_ones() -> None:
    # Keys interleave freely; each key in order; "" (no key) orders everything around it.
    fine = [(2, "y"), (1, "x"), (4, "y"), (3, "x"), (5, ""), (7, "x"), (6, "y")]
    assert verify(sent(7), keyed_applied(fine)).clean
    swapped = [(3, "x"), (1, "x"), (2, "y")]  # key x out of its order
    report = verify(sent(3), keyed_applied(swapped))
    assert report.streams[("a", "b", "policy")].out_of_order == [(3, 1)]
    early = [(1, "x"), (3, "y"), (2, "")]  # an unkeyed entry after a later keyed one
    assert verify(sent(3), keyed_applied(early)).streams[("a", "b", "policy")].out_of_order == [
        (3, 2)
    ]
    late = [(1, "x"), (3, ""), (2, "y")]  # a keyed entry overtaken by an unkeyed one
    assert verify(sent(3), keyed_applied(late)).streams[("a", "b", "policy")].out_of_order == [
        (3, 2)
    ]
