"""Shared snapshots: one snapshot of a client, written once, read by every destination in it.

The join rule, each destination's own status and shipping progress, and the
release of the entries exactly when the last destination is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from lr_client.records import SnapshotStatus
from lr_client.store.contract import QueueStore
from lr_client.store.schema import tables as s
from tests.contract.calls import append

DESTS = ["b", "c", "d"]


def _write(store: QueueStore, sid: str, payloads: list[bytes]) -> None:
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, payloads)


def _stored(store: QueueStore, sid: str) -> int:
    """Rows of the snapshot in ``lrq_send_snapsync`` (every partition), end marker included."""
    t = s.send_snapsync
    with store.read() as conn:
        return int(conn.execute(select(func.count()).where(t.c.snapshot_id == sid)).scalar_one())


def _ready(store: QueueStore, dests: list[str], payloads: list[bytes]) -> str:
    """A READY snapshot of ``policy`` every one of ``dests`` joined while it was requested."""
    store.sites.register_sites(dests)
    ids = {store.snapshots.request_snapshot(None, d, "policy") for d in dests}
    assert len(ids) == 1
    (sid,) = ids
    assert store.snapshots.start_snapshot(sid) is not None
    _write(store, sid, payloads)
    assert store.snapshot_entries.finish_snapshot(sid) == len(payloads)
    return sid


def _status(store: QueueStore, sid: str, dest: str | None = None) -> SnapshotStatus:
    view = store.snapshots.get_snapshot(sid, dest)
    assert view is not None
    return view.status


def test_destinations_asking_before_the_start_join_one_snapshot(store: QueueStore) -> None:
    store.sites.register_sites(DESTS)
    sids = [store.snapshots.request_snapshot(None, d, "policy", f"new {d}") for d in DESTS]
    assert len(set(sids)) == 1
    sid = sids[0]
    snap = store.snapshots.get_snapshot(sid)
    assert snap is not None and snap.destinations == tuple(DESTS)
    views = store.snapshots.list_snapshots(client_name="policy")
    assert sorted(v.destination for v in views) == DESTS
    assert {v.snapshot_id for v in views} == {sid}
    assert [store.snapshots.get_snapshot(sid, d).reason for d in DESTS] == [
        f"new {d}" for d in DESTS
    ]  # type: ignore[union-attr]
    started = store.snapshots.start_snapshot(sid)
    assert started is not None and started.status is SnapshotStatus.RUNNING
    assert {_status(store, sid, d) for d in DESTS} == {SnapshotStatus.RUNNING}
    _write(store, sid, [b"x", b"y"])
    store.snapshot_entries.finish_snapshot(sid)
    assert {_status(store, sid, d) for d in DESTS} == {SnapshotStatus.READY}
    assert _stored(store, sid) == 3  # written once: two entries and the end marker
    for d in DESTS:
        opened = store.snapshots.open_snapshots(d, ["policy"])
        assert opened["policy"].snapshot_id == sid and opened["policy"].destination == d


def test_each_destination_reads_every_entry_at_its_own_pace(store: QueueStore) -> None:
    sid = _ready(store, DESTS, [b"%d" % i for i in range(5)])
    # Interleaved reads from different places: each gets its own next entries.
    b1 = store.snapshot_entries.read_snapshot_entries(sid, 0, 2)
    c1 = store.snapshot_entries.read_snapshot_entries(sid, 0, 3)
    b2 = store.snapshot_entries.read_snapshot_entries(sid, 2, 10)
    d1 = store.snapshot_entries.read_snapshot_entries(sid, 0, 10)
    c2 = store.snapshot_entries.read_snapshot_entries(sid, 3, 10)
    want = [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert [e.payload for e in b1 + b2] == want
    assert [e.payload for e in c1 + c2] == want
    assert [e.payload for e in d1] == want
    assert store.snapshots.update_snapshot(
        sid, expect=[SnapshotStatus.READY], destination="c", shipped_position=3
    )
    c_view, b_view = store.snapshots.get_snapshot(sid, "c"), store.snapshots.get_snapshot(sid, "b")
    assert c_view is not None and c_view.shipped_position == 3
    assert b_view is not None and b_view.shipped_position == 0


def test_entries_are_released_when_the_last_destination_is_done(store: QueueStore) -> None:
    sid = _ready(store, DESTS, [b"a", b"b"])
    assert store.snapshots.complete_snapshot(sid, "b")
    assert _status(store, sid, "b") is SnapshotStatus.COMPLETED
    assert _status(store, sid) is SnapshotStatus.READY
    store.retention.trim()
    assert _stored(store, sid) == 3  # c and d still need them
    assert store.snapshots.cancel_snapshot(sid, "c leaves", destination="c")
    store.retention.trim()
    assert _stored(store, sid) == 3  # d still needs them
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)] == [
        b"a",
        b"b",
        b"2",
    ]
    assert store.snapshots.complete_snapshot(sid, "d")
    assert _stored(store, sid) == 0  # the last one is done: released at once
    snap = store.snapshots.get_snapshot(sid)
    assert snap is not None and snap.status is SnapshotStatus.COMPLETED
    assert snap.destinations == ()
    assert [_status(store, sid, d) for d in DESTS] == [
        SnapshotStatus.COMPLETED,
        SnapshotStatus.CANCELLED,
        SnapshotStatus.COMPLETED,
    ]
    assert not store.snapshots.complete_snapshot(sid, "d")  # once


def test_cancelling_one_destination_leaves_the_others_running(store: QueueStore) -> None:
    store.sites.register_sites(DESTS)
    sid = {store.snapshots.request_snapshot(None, d, "policy") for d in DESTS}.pop()
    store.snapshots.start_snapshot(sid)
    _write(store, sid, [b"a"])
    assert store.snapshots.cancel_snapshot(sid, "operator", destination="b")
    assert not store.snapshots.cancel_snapshot(sid, "operator", destination="b")  # once
    view = store.snapshots.get_snapshot(sid, "b")
    assert view is not None and (view.status, view.reason) == (SnapshotStatus.CANCELLED, "operator")
    assert _status(store, sid) is SnapshotStatus.RUNNING
    _write(store, sid, [b"a", b"b"])  # the provider goes on for c and d
    assert store.snapshot_entries.finish_snapshot(sid) == 2
    snap = store.snapshots.get_snapshot(sid)
    assert snap is not None and snap.destinations == ("c", "d")
    assert store.snapshots.open_snapshots("b", ["policy"]) == {}
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)] == [
        b"a",
        b"b",
        b"2",
    ]


def test_the_last_destination_leaving_cancels_it_and_releases_its_entries(
    store: QueueStore,
) -> None:
    store.sites.register_sites(["b", "c"])
    sid = {store.snapshots.request_snapshot(None, d, "policy") for d in ("b", "c")}.pop()
    store.snapshots.start_snapshot(sid)
    _write(store, sid, [b"a", b"b"])
    store.snapshots.cancel_snapshot(sid, "b leaves", destination="b")
    assert _stored(store, sid) == 2
    store.snapshots.cancel_snapshot(sid, "c leaves", destination="c")
    snap = store.snapshots.get_snapshot(sid)
    assert snap is not None and (snap.status, snap.reason) == (SnapshotStatus.CANCELLED, "c leaves")
    assert _stored(store, sid) == 0
    assert store.snapshots.start_snapshot(sid) is None


def test_asking_again_leaves_the_shared_one_to_the_others(store: QueueStore) -> None:
    sid = _ready(store, DESTS, [b"a"])
    again = store.snapshots.request_snapshot(None, "c", "policy", "restore")
    assert again != sid  # c never rejoins one it left: superseded
    view = store.snapshots.get_snapshot(sid, "c")
    assert view is not None and view.status is SnapshotStatus.CANCELLED
    assert again in view.reason
    assert {_status(store, sid, d) for d in ("b", "d")} == {SnapshotStatus.READY}
    assert _stored(store, sid) == 2
    assert _status(store, again, "c") is SnapshotStatus.REQUESTED


def test_asking_again_before_the_start_never_rejoins_the_one_it_leaves(
    store: QueueStore,
) -> None:
    """A REQUESTED snapshot is joinable, but not by the destination leaving it; the
    destination's snapshot of another client stays as it was."""
    store.sites.register_sites(["b", "c"])
    others = store.snapshots.request_snapshot(None, "b", "orders")
    first = store.snapshots.request_snapshot(None, "b", "policy")
    shared = store.snapshots.request_snapshot(None, "c", "policy")
    assert shared == first
    again = store.snapshots.request_snapshot(None, "b", "policy", "restore")
    assert again not in (first, others)
    view = store.snapshots.get_snapshot(first, "b")
    assert view is not None and view.status is SnapshotStatus.CANCELLED and again in view.reason
    assert _status(store, first, "c") is SnapshotStatus.REQUESTED
    assert _status(store, again, "b") is SnapshotStatus.REQUESTED
    assert _status(store, others, "b") is SnapshotStatus.REQUESTED


def test_cancelling_the_snapshot_ends_it_for_every_destination(store: QueueStore) -> None:
    sid = _ready(store, DESTS, [b"a"])
    assert store.snapshots.cancel_snapshot(sid, "operator")
    assert {_status(store, sid, d) for d in DESTS} == {SnapshotStatus.CANCELLED}
    assert _stored(store, sid) == 0


def test_a_stalled_worker_fails_the_snapshot_for_every_destination(store: QueueStore) -> None:
    store.sites.register_sites(DESTS)
    sid = {store.snapshots.request_snapshot(None, d, "policy") for d in DESTS}.pop()
    store.snapshots.start_snapshot(sid)
    _write(store, sid, [b"a"])
    snap = store.snapshots.get_snapshot(sid)
    assert snap is not None
    assert store.snapshots.fail_stalled_snapshot(sid, snap.updated_at + 1, "silent")
    assert {_status(store, sid, d) for d in DESTS} == {SnapshotStatus.FAILED}
    assert {store.snapshots.get_snapshot(sid, d).reason for d in DESTS} == {"silent"}  # type: ignore[union-attr]
    assert _stored(store, sid) == 0


def test_a_running_snapshot_is_joined_by_a_destination_whose_cursor_is_at_most_its_base(
    store: QueueStore,
) -> None:
    """The join rule: the destination's log after the base is still held for it."""
    append(store, "policy", *[(b"%d" % i, ["b", "c", "d", "e"]) for i in range(4)])
    store.shipping.set_cursor("c", "policy", 2)  # behind the base: its log from 3 on is held
    store.shipping.set_cursor("e", "policy", 4)  # past the base: its log after it may be trimmed
    first = store.snapshots.request_snapshot(None, "b", "policy")
    started = store.snapshots.start_snapshot(first)
    assert started is not None and started.base_position == 4
    append(store, "policy", (b"after", ["b", "c", "d", "e"]))
    store.shipping.set_cursor("e", "policy", 5)
    assert store.snapshots.request_snapshot(None, "c", "policy") == first
    joined = store.snapshots.get_snapshot(first, "c")
    assert joined is not None and joined.status is SnapshotStatus.RUNNING
    assert joined.base_position == 4
    # No cursor (a new destination: nothing was routed to it) gets the next one.
    nxt = store.snapshots.request_snapshot(None, "d", "policy")
    assert nxt != first and _status(store, nxt, "d") is SnapshotStatus.REQUESTED
    # A cursor past the base: the next one too, which it shares with d.
    assert store.snapshots.request_snapshot(None, "e", "policy") == nxt
    snap = store.snapshots.get_snapshot(nxt)
    assert snap is not None and snap.destinations == ("d", "e")
    # The joined base holds the log for c, whatever its cursor does.
    store.shipping.set_cursor("c", "policy", 5)
    store.retention.trim()
    assert [e.position for e in store.shipping.read_log_entries("c", "policy", 4, 10)] == [5]


def test_a_dropped_destination_does_not_join_a_started_snapshot(store: QueueStore) -> None:
    append(store, "policy", (b"x", ["b", "c"]))
    first = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(first)
    assert store.retention.drop_stream("c", "policy", "fell behind") is not None
    assert store.snapshots.request_snapshot(None, "c", "policy") != first


def test_a_ready_snapshot_is_joined_and_its_entries_kept_for_the_joiner(
    store: QueueStore,
) -> None:
    sid = _ready(store, ["b"], [b"a"])
    store.shipping.set_cursor("c", "policy", 0)
    assert store.snapshots.request_snapshot(None, "c", "policy") == sid
    assert _status(store, sid, "c") is SnapshotStatus.READY
    store.snapshots.complete_snapshot(sid, "b")
    store.retention.trim()
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)] == [
        b"a",
        b"1",
    ]
    store.snapshots.complete_snapshot(sid, "c")
    assert _stored(store, sid) == 0


def test_leaving_in_the_callers_transaction_releases_at_the_next_trim(
    store: QueueStore, app_transaction: Callable[[], AbstractContextManager[Connection]]
) -> None:
    sid = _ready(store, ["b"], [b"a"])
    conn: Connection
    with app_transaction() as conn:
        again = store.snapshots.request_snapshot(conn, "b", "policy")
    assert again != sid
    assert _status(store, sid) is SnapshotStatus.CANCELLED
    store.retention.trim()
    assert _stored(store, sid) == 0


def test_a_destination_update_names_only_its_own_columns(store: QueueStore) -> None:
    sid = _ready(store, ["b"], [b"a"])
    with pytest.raises(ValueError, match="base_position"):
        store.snapshots.update_snapshot(sid, destination="b", base_position=0)
    assert store.snapshots.get_snapshot(sid, "b").base_position is not None  # type: ignore[union-attr]


def test_destinations_asking_at_once_share_one_snapshot(store: QueueStore) -> None:
    """Concurrent requests of one client (PostgreSQL: one at a time, by an advisory lock)."""
    dests = [f"s{i}" for i in range(5)]
    store.sites.register_sites(dests)
    barrier = threading.Barrier(len(dests))
    got: list[str] = []
    errors: list[BaseException] = []

    def ask(dest: str) -> None:
        barrier.wait()
        try:
            got.append(store.snapshots.request_snapshot(None, dest, "policy"))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(d,)) for d in dests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(got) == len(dests) and len(set(got)) == 1
    snap = store.snapshots.get_snapshot(got[0])
    assert snap is not None and sorted(snap.destinations) == dests


def test_a_destination_dropped_mid_snapshot_leaves_the_others_their_copy(
    store: QueueStore,
) -> None:
    """Dropped for falling behind, c asks anew: it gets the next snapshot; b and d finish."""
    append(store, "policy", (b"x", DESTS))
    sid = _ready(store, DESTS, [b"a", b"b"])
    assert store.retention.drop_stream("c", "policy", "fell behind") is not None
    nxt = store.snapshots.request_snapshot(None, "c", "policy", "dropped for falling behind")
    assert nxt != sid
    assert _status(store, sid, "c") is SnapshotStatus.CANCELLED
    assert {_status(store, sid, d) for d in ("b", "d")} == {SnapshotStatus.READY}
    store.retention.trim()
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)] == [
        b"a",
        b"b",
        b"2",
    ]
    store.snapshots.complete_snapshot(sid, "b")
    assert _stored(store, sid) == 3
    store.snapshots.complete_snapshot(sid, "d")
    assert _stored(store, sid) == 0
    assert _status(store, nxt, "c") is SnapshotStatus.REQUESTED
