"""CascadeReports: children's reports, the global watermark and provider switches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import pytest

from lr_client.errors import InvalidInputError, InvalidNameError
from lr_client.store.contract import QueueStore

C = "policy"


def _child(store: QueueStore, child: str = "s4") -> tuple[int, int, int, float, bool]:
    (row,) = [c for c in store.cascade.cascade_children(C) if c.child_id == child]
    return row.epoch, row.local_watermark, row.acked_position, row.reported_at, row.dropped


def test_a_report_adopts_the_child_then_updates_it(store: QueueStore) -> None:
    store.cascade.apply_cascade_config(C, "s1", "branch", "s1", ["s4"])  # seeded: never reported
    assert store.cascade_reports.record_cascade_report(C, "s4", 1, 5, 6, reported_at=100.0)
    assert _child(store) == (1, 5, 6, 100.0, False)
    assert store.cascade_reports.record_cascade_report(C, "s4", 1, 7, 9, reported_at=101.0)
    assert _child(store) == (1, 7, 9, 101.0, False)
    # A node that was never seeded (switched here) is adopted by its first report.
    assert store.cascade_reports.record_cascade_report(C, "s5", 3, 2, 2, reported_at=102.0)
    assert _child(store, "s5") == (3, 2, 2, 102.0, False)


def _at_once(calls: list[Callable[[], bool]]) -> tuple[list[bool], list[BaseException]]:
    """Run ``calls`` on threads released together; their results and errors."""
    barrier = threading.Barrier(len(calls), timeout=60)
    got: list[bool] = []
    errors: list[BaseException] = []

    def run(call: Callable[[], bool]) -> None:
        barrier.wait()
        try:
            got.append(call())
        except BaseException as exc:  # collected and asserted by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return got, errors


def test_two_first_reports_of_a_child_at_once_both_succeed(store: QueueStore) -> None:
    """A new child reported twice at the same moment (``lr provider switch``'s report and
    the server's periodic one): both are recorded, no key conflict; the row holds one."""
    store.cascade.apply_cascade_config(C, "s1", "branch", "s1", [])
    for round_ in range(20):
        child = f"n{round_}"
        got, errors = _at_once(
            [
                partial(store.cascade_reports.record_cascade_report, C, child, 1, w, w)
                for w in (5, 6)
            ]
        )
        assert errors == [], f"round {round_}: {errors[0]!r}"
        assert got == [True, True]
        epoch, watermark, acked, _, dropped = _child(store, child)
        assert (epoch, dropped) == (1, False) and watermark == acked and watermark in (5, 6)


def test_the_same_epoch_keeps_a_drop_and_a_newer_one_adopts_again(store: QueueStore) -> None:
    store.cascade.apply_cascade_config(C, "s1", "branch", "s1", ["s4"])
    assert store.cascade_reports.record_cascade_report(C, "s4", 1, 5, 6, reported_at=100.0)
    assert store.cascade.mark_child_dropped(C, "s4")
    assert store.cascade_reports.record_cascade_report(C, "s4", 1, 8, 8, reported_at=101.0)
    assert _child(store) == (1, 8, 8, 101.0, True)  # a late report of the old epoch
    assert store.cascade_reports.record_cascade_report(C, "s4", 2, 9, 9, reported_at=102.0)
    assert _child(store) == (2, 9, 9, 102.0, False)


def test_a_report_of_an_older_epoch_is_refused_and_changes_nothing(store: QueueStore) -> None:
    store.cascade.apply_cascade_config(C, "s1", "branch", "s1", ["s4"])
    assert store.cascade_reports.record_cascade_report(C, "s4", 3, 5, 6, reported_at=100.0)
    assert not store.cascade_reports.record_cascade_report(C, "s4", 2, 50, 60, reported_at=200.0)
    assert _child(store) == (3, 5, 6, 100.0, False)


def test_a_bad_report_is_a_typed_error_and_changes_nothing(store: QueueStore) -> None:
    store.cascade.apply_cascade_config(C, "s1", "branch", "s1", ["s4"])
    assert store.cascade_reports.record_cascade_report(C, "s4", 1, 5, 6, reported_at=100.0)
    with pytest.raises(InvalidNameError):
        store.cascade_reports.record_cascade_report(C, "s4; drop table x", 1, 5, 6)
    with pytest.raises(InvalidNameError):
        store.cascade_reports.record_cascade_report("", "s4", 1, 5, 6)
    for bad in ((-1, 5, 6), (1, -5, 6), (1, 5, -6)):
        with pytest.raises(InvalidInputError):
            store.cascade_reports.record_cascade_report(C, "s4", *bad)
    assert _child(store) == (1, 5, 6, 100.0, False)
    assert [c.child_id for c in store.cascade.cascade_children(C)] == ["s4"]


def test_the_global_watermark_is_stored_for_a_cascaded_client(store: QueueStore) -> None:
    assert not store.cascade_reports.set_global_watermark(C, 9)  # not cascaded here
    store.cascade.apply_cascade_config(C, "s1", "branch", "s1", [])
    assert store.cascade_reports.set_global_watermark(C, 9)
    node = store.cascade.cascade_node(C)
    assert node is not None and node.global_watermark == 9
    with pytest.raises(InvalidInputError):
        store.cascade_reports.set_global_watermark(C, -1)
    node = store.cascade.cascade_node(C)
    assert node is not None and node.global_watermark == 9


def test_a_switch_raises_the_epoch_and_survives_the_same_config(store: QueueStore) -> None:
    assert store.cascade_reports.switch_cascade_provider(C, "s2") is None  # not cascaded here
    before = store.cascade.apply_cascade_config(C, "s1", "branch", "s3", ["s5"])
    epoch = store.cascade_reports.switch_cascade_provider(C, "s2")
    assert epoch == before.epoch + 1
    node = store.cascade.cascade_node(C)
    assert node is not None
    assert (node.provider_id, node.epoch, node.config_provider) == ("s2", epoch, "s3")
    # The server applies the unchanged configuration at its next start: the switch stays.
    again = store.cascade.apply_cascade_config(C, "s1", "branch", "s3", ["s5"])
    assert (again.provider_id, again.epoch) == ("s2", epoch)


def test_a_bad_switch_is_a_typed_error_and_changes_nothing(store: QueueStore) -> None:
    root = store.cascade.apply_cascade_config(C, "s1", "root", "", ["s2"])
    with pytest.raises(InvalidInputError):
        store.cascade_reports.switch_cascade_provider(C, "s2")  # the root has no provider
    assert store.cascade.cascade_node(C) == root
    store.cascade.apply_cascade_config("orders", "s1", "leaf", "s1", [])
    with pytest.raises(InvalidNameError):
        store.cascade_reports.switch_cascade_provider("orders", "bad name!")
    node = store.cascade.cascade_node("orders")
    assert node is not None and (node.provider_id, node.epoch) == ("s1", 1)
