"""Snapshots: the source's snapshot requests and the entries of a full sync."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy.engine import Connection

from lr_client.errors import InvalidNameError, SnapshotError
from lr_client.records import OPEN_SNAPSHOT_STATUSES, ReplicationType, SnapshotStatus
from lr_client.store.contract import QueueStore
from lr_client.store.snapshots.entries import _MAX_MARKS
from tests.contract.calls import (
    across_outage,
    append,
    log,
    pass_entries,
    refused_for_no_schema,
)
from tests.contract.outage import Outage
from tests.kit.statements import recorded

OPEN = OPEN_SNAPSHOT_STATUSES


def _status(store: QueueStore, sid: str) -> SnapshotStatus:
    req = store.snapshots.get_snapshot(sid)
    assert req is not None
    return req.status


def _request_later(store: QueueStore, after: str, destination: str, client: str) -> str:
    """A request created strictly after ``after`` (the listing is newest first)."""
    req = store.snapshots.get_snapshot(after)
    assert req is not None
    while time.time() <= req.created_at:
        pass
    return store.snapshots.request_snapshot(None, destination, client)


def _write(store: QueueStore, sid: str, part: int, payloads: list[bytes]) -> int:
    with store.write() as conn:
        return store.snapshot_entries.write_snapshot_entries(conn, sid, part, payloads)


def test_a_request_is_recorded(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy", "new destination")
    req = store.snapshots.get_snapshot(sid)
    assert req is not None
    assert (req.snapshot_id, req.destination, req.client_name) == (sid, "b", "policy")
    assert (req.status, req.reason, req.base_position) == (
        SnapshotStatus.REQUESTED,
        "new destination",
        None,
    )
    assert store.snapshots.get_snapshot("no-such-snapshot") is None


def test_a_request_in_the_callers_transaction_commits_with_it(
    store: QueueStore, app_transaction: Callable[[], AbstractContextManager[Connection]]
) -> None:
    with pytest.raises(RuntimeError), app_transaction() as conn:
        gone = store.snapshots.request_snapshot(conn, "b", "policy")
        raise RuntimeError("the application failed")
    assert store.snapshots.get_snapshot(gone) is None
    with app_transaction() as conn:
        kept = store.snapshots.request_snapshot(conn, "b", "policy")
    assert [r.snapshot_id for r in store.snapshots.list_snapshots()] == [kept]


@pytest.mark.parametrize(
    ("destination", "client", "says"),
    [
        ("B", "policy", "invalid site id 'B'"),
        ("b", "bad name", "invalid client name 'bad name'"),
        ("", "p", "invalid site id ''"),
    ],
)
def test_a_bad_name_requests_nothing(
    store: QueueStore, destination: str, client: str, says: str
) -> None:
    with pytest.raises(InvalidNameError, match=f"^{re.escape(says)}:"):
        store.snapshots.request_snapshot(None, destination, client)
    assert store.snapshots.list_snapshots() == []


def test_a_request_without_a_reason_has_an_empty_one(store: QueueStore) -> None:
    req = store.snapshots.get_snapshot(store.snapshots.request_snapshot(None, "b", "policy"))
    assert req is not None and req.reason == ""


def test_snapshot_lifecycle_is_idempotent(store: QueueStore) -> None:
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    req = store.snapshots.start_snapshot(sid)
    assert req is not None and req.status is SnapshotStatus.RUNNING
    assert store.snapshots.start_snapshot(sid) is None
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])
        store.snapshot_entries.write_snapshot_entries(conn, sid, 1, [b"c"])
    _write(store, sid, 0, [b"a", b"b"])  # a retried part replaces itself
    assert store.snapshot_entries.count_snapshot_entries(sid) == 3
    assert store.snapshot_entries.read_snapshot_entries(sid, 0, 10) == []  # not ready yet
    assert store.snapshot_entries.finish_snapshot(sid) == 3
    entries = store.snapshot_entries.read_snapshot_entries(sid, 0, 10)
    assert [e.payload for e in entries[:-1]] == [b"a", b"b", b"c"]
    assert entries[-1].type is ReplicationType.LAST_FULL_SYNC_ENTRY
    assert [e.position for e in entries] == [1, 2, 3, 4]
    assert {(e.snapshot_id, e.client_name) for e in entries} == {(sid, "policy")}
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 2, 10)] == [
        b"c",
        b"3",
    ]
    ready = store.snapshots.get_snapshot(sid)
    assert ready is not None and ready.status is SnapshotStatus.READY
    assert (ready.entry_count, ready.rows_written) == (3, 3)


def test_start_fixes_the_base_at_the_head(store: QueueStore) -> None:
    p = append(store, "policy", (b"1", ["b"]), (b"2", ["c"]))
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    req = store.snapshots.start_snapshot(sid)
    assert req is not None and req.base_position == p[-1]
    append(store, "policy", (b"3", ["b"]))
    again = store.snapshots.get_snapshot(sid)
    assert again is not None and again.base_position == p[-1]


def test_a_part_rewritten_from_a_sequence_replaces_only_that_range(
    store: QueueStore,
) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    _write(store, sid, 0, [b"a", b"b", b"c", b"d", b"e", b"f"])
    with store.write() as conn:  # a chunk in the middle, then one past the part's end
        assert (
            store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"B", b"C"], first_seq=1)
            == 2
        )
        assert (
            store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"F", b"G"], first_seq=5)
            == 2
        )
    store.snapshot_entries.finish_snapshot(sid)
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)] == [
        b"a",
        b"B",
        b"C",
        b"d",
        b"e",
        b"F",
        b"G",
        b"7",
    ]


def test_only_a_running_snapshot_takes_entries(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    with pytest.raises(SnapshotError):
        _write(store, sid, 0, [b"a"])  # REQUESTED
    with pytest.raises(SnapshotError):
        _write(store, "no-such-snapshot", 0, [b"a"])
    with pytest.raises(SnapshotError):
        store.snapshot_entries.finish_snapshot(sid)
    store.snapshots.start_snapshot(sid)
    _write(store, sid, 0, [b"a"])
    store.snapshot_entries.finish_snapshot(sid)
    with pytest.raises(SnapshotError):
        _write(store, sid, 1, [b"late"])  # READY
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)] == [
        b"a",
        b"1",
    ]


def test_new_request_cancels_the_open_one(store: QueueStore) -> None:
    first = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(first)
    _write(store, first, 0, [b"a"])
    second = store.snapshots.request_snapshot(None, "b", "policy")
    old = store.snapshots.get_snapshot(first)
    assert old is not None and old.status is SnapshotStatus.CANCELLED
    assert second in old.reason
    assert store.snapshot_entries.count_snapshot_entries(first) == 0
    assert store.snapshot_entries.read_snapshot_entries(first, 0, 10) == []
    assert _status(store, second) is SnapshotStatus.REQUESTED
    other = store.snapshots.request_snapshot(None, "c", "policy")  # another stream: untouched
    assert _status(store, second) is SnapshotStatus.REQUESTED
    assert {r.snapshot_id for r in store.snapshots.list_snapshots(statuses=OPEN)} == {second, other}


def test_a_request_in_the_callers_transaction_leaves_the_old_entries_to_trim(
    store: QueueStore, app_transaction: Callable[[], AbstractContextManager[Connection]]
) -> None:
    first = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(first)
    _write(store, first, 0, [b"a"])
    with app_transaction() as conn:
        store.snapshots.request_snapshot(conn, "b", "policy")
    assert _status(store, first) is SnapshotStatus.CANCELLED
    assert store.snapshot_entries.read_snapshot_entries(first, 0, 10) == []
    assert (
        store.snapshot_entries.count_snapshot_entries(first) == 1
    )  # the caller's transaction kept off them
    assert store.retention.trim() == 1
    assert store.snapshot_entries.count_snapshot_entries(first) == 0


def test_list_and_open_snapshots(store: QueueStore) -> None:
    a = store.snapshots.request_snapshot(None, "b", "policy")
    b = _request_later(store, a, "b", "other")
    c = _request_later(store, b, "c", "policy")
    store.snapshots.cancel_snapshot(b)
    assert [r.snapshot_id for r in store.snapshots.list_snapshots()] == [c, b, a]
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(destination="b")] == [b, a]
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(client_name="policy")] == [c, a]
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(statuses=OPEN)] == [c, a]
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(limit=2)] == [c, b]  # the newest
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(None, None, OPEN, 1)] == [c]
    got = store.snapshots.list_snapshots("b", "other", [SnapshotStatus.CANCELLED])
    assert [r.snapshot_id for r in got] == [b]
    opened = store.snapshots.open_snapshots("b", ["policy", "other", "none"])
    assert {k: v.snapshot_id for k, v in opened.items()} == {"policy": a}
    assert store.snapshots.open_snapshots("d", ["policy"]) == {}


def test_the_send_checks_are_the_open_requests_and_the_drops_of_a_destination(
    store: QueueStore,
) -> None:
    store.sites.register_sites(["b", "c"])
    a = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.request_snapshot(None, "c", "other")
    assert store.retention.drop_stream("b", "other", "behind") is not None
    assert store.retention.drop_stream("c", "policy", "behind") is not None
    requests, drops = store.snapshots.send_checks("b", ["policy", "other"])
    assert {k: v.snapshot_id for k, v in requests.items()} == {"policy": a}
    assert {k: (d.destination, d.reason) for k, d in drops.items()} == {"other": ("b", "behind")}
    assert store.snapshots.send_checks("b", ["policy"])[0] == store.snapshots.open_snapshots(
        "b", ["policy"]
    )
    assert store.snapshots.send_checks("d", ["policy"]) == ({}, {})


def test_update_snapshot_only_from_expected_statuses(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert not store.snapshots.update_snapshot(
        sid, expect=[SnapshotStatus.RUNNING], shipped_position=5
    )
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.shipped_position == 0
    assert store.snapshots.update_snapshot(
        sid, expect=[SnapshotStatus.REQUESTED], shipped_position=5
    )
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.shipped_position == 5
    assert store.snapshots.update_snapshot(sid, reason="any status")
    assert not store.snapshots.update_snapshot("no-such-snapshot", reason="x")
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.reason == "any status"


def test_progress_is_recorded_while_running(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshot_entries.set_snapshot_progress(sid, 10)  # not running yet: ignored
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.rows_written == 0
    store.snapshots.start_snapshot(sid)
    store.snapshot_entries.set_snapshot_progress(sid, 10)
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.rows_written == 10


def test_cancel_and_complete_release_the_entries(store: QueueStore) -> None:
    done = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(done)
    _write(store, done, 0, [b"a", b"b"])
    assert not store.snapshots.complete_snapshot(done)  # RUNNING, not READY
    store.snapshot_entries.finish_snapshot(done)
    assert store.snapshots.complete_snapshot(done)
    assert _status(store, done) is SnapshotStatus.COMPLETED
    assert store.snapshot_entries.read_snapshot_entries(done, 0, 10) == []
    assert store.snapshot_entries.count_snapshot_entries(done) == 0
    assert not store.snapshots.cancel_snapshot(done)  # closed: stays completed
    assert _status(store, done) is SnapshotStatus.COMPLETED

    gone = store.snapshots.request_snapshot(None, "c", "policy")
    store.snapshots.start_snapshot(gone)
    _write(store, gone, 0, [b"a"])
    assert store.snapshots.cancel_snapshot(gone, "operator")
    req = store.snapshots.get_snapshot(gone)
    assert req is not None and (req.status, req.reason) == (SnapshotStatus.CANCELLED, "operator")
    assert store.snapshot_entries.count_snapshot_entries(gone) == 0
    assert not store.snapshots.cancel_snapshot(gone)


def test_heartbeat_keeps_a_running_snapshot_alive(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert not store.snapshots.heartbeat_snapshot(sid)  # REQUESTED: no worker to hear from
    store.snapshots.start_snapshot(sid)
    before = store.snapshots.get_snapshot(sid)
    assert before is not None
    assert store.snapshots.heartbeat_snapshot(sid)
    after = store.snapshots.get_snapshot(sid)
    assert after is not None and after.updated_at >= before.updated_at
    # Heard of after `silent_since`: not stalled.
    assert not store.snapshots.fail_stalled_snapshot(sid, after.updated_at - 1.0, "stalled")
    assert _status(store, sid) is SnapshotStatus.RUNNING


def test_a_snapshots_base_is_applied_at_its_origin_and_at_a_branch_once_delivered(
    store: QueueStore,
) -> None:
    """Where the node originates the client the base is its own send log's head: applied
    once fixed. At a branch the base is the last relayed entry stored (never below the
    last delivered), applied once the branch's subscriber has delivered through it."""
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert not store.snapshots.snapshot_base_applied(sid)  # REQUESTED: no base yet
    store.snapshots.start_snapshot(sid)
    assert store.snapshots.snapshot_base_applied(sid)
    store.cascade.apply_cascade_config("relayed", "s1", "branch", "s1", ["b"])
    store.recv.apply_log_batch("s1", "relayed", log(4, 5, 6))
    (queue,) = store.queues.list_queues("relayed")
    relayed = store.snapshots.request_snapshot(None, "b", "relayed")
    started = store.snapshots.start_snapshot(relayed)
    assert started is not None and started.base_position == 6
    assert not store.snapshots.snapshot_base_applied(relayed)
    assert pass_entries(store, queue.queue_id, 2) == [4, 5]
    assert not store.snapshots.snapshot_base_applied(relayed)
    assert pass_entries(store, queue.queue_id, 1) == [6]
    assert store.cascade.relay_delivered_position("relayed", "s1") == 6
    assert store.snapshots.snapshot_base_applied(relayed)


def test_a_silent_running_snapshot_is_failed_and_released(store: QueueStore) -> None:
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    _write(store, sid, 0, [b"a", b"b"])
    req = store.snapshots.get_snapshot(sid)
    assert req is not None
    assert store.snapshots.fail_stalled_snapshot(sid, req.updated_at + 1.0, "no heartbeat")
    failed = store.snapshots.get_snapshot(sid)
    assert failed is not None and failed.status is SnapshotStatus.FAILED
    assert failed.reason == "no heartbeat"
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    assert not store.snapshots.heartbeat_snapshot(sid)
    # Only RUNNING requests are failed.
    assert not store.snapshots.fail_stalled_snapshot(sid, req.updated_at + 1.0, "again")
    other = store.snapshots.request_snapshot(None, "b", "policy")
    assert not store.snapshots.fail_stalled_snapshot(other, req.updated_at + 3600, "requested")
    assert _status(store, other) is SnapshotStatus.REQUESTED


def test_snapshot_reads_continue_and_resume_in_order(store: QueueStore) -> None:
    """Reading on from the last read, or resuming anywhere, gives the same ordinals."""
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    parts = {0: 7, 1: 5, 3: 9}  # part -> entries; parts need not be contiguous
    with store.write() as conn:
        for part, n in parts.items():
            store.snapshot_entries.write_snapshot_entries(
                conn, sid, part, [b"%d-%d" % (part, i) for i in range(n)]
            )
    assert store.snapshot_entries.finish_snapshot(sid) == 21
    every = store.snapshot_entries.read_snapshot_entries(sid, 0, 100)
    expected = [b"%d-%d" % (p, i) for p, n in parts.items() for i in range(n)] + [b"21"]
    assert [e.payload for e in every] == expected
    assert every[-1].type is ReplicationType.LAST_FULL_SYNC_ENTRY
    # A snapshot's entries name their snapshot; no destinations, origin time or headers.
    assert {(e.snapshot_id, e.client_name, e.destinations, e.created_at) for e in every} == {
        (sid, "policy", (), 0.0)
    }
    assert {e.headers for e in every} == {None}
    # Continuing from where each read ended, 4 at a time (across parts and the end).
    got, after = [], 0
    while batch := store.snapshot_entries.read_snapshot_entries(sid, after, 4):
        assert len(batch) == min(4, 22 - after)
        assert [e.position for e in batch] == list(range(after + 1, after + len(batch) + 1))
        got += batch
        after = batch[-1].position
    assert [e.payload for e in got] == expected
    # Resuming at any ordinal (a reconnect), then continuing from there.
    for start in (0, 3, 7, 12, 20, 21):
        first = store.snapshot_entries.read_snapshot_entries(sid, start, 3)
        assert len(first) == min(3, 22 - start)
        rest = store.snapshot_entries.read_snapshot_entries(sid, start + len(first), 100)
        assert [e.payload for e in first + rest] == expected[start:]
    # A read that does not continue the previous one starts where it is asked to.
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 4)] == expected[
        :4
    ]
    assert [
        e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 10, 3)
    ] == expected[10:13]
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 1, 2)] == expected[
        1:3
    ]
    # A byte limit cuts a read short; the next read continues after what was returned.
    short = store.snapshot_entries.read_snapshot_entries(sid, 0, 100, max_bytes=40)
    assert 0 < len(short) < 22
    more = store.snapshot_entries.read_snapshot_entries(sid, len(short), 100)
    assert [e.payload for e in short + more] == expected


def test_reads_continuing_a_ready_snapshot_seek_where_the_last_one_ended(
    store: QueueStore,
) -> None:
    """A read from where the previous one ended (or from the start) is an index range;
    only a read resuming elsewhere (a reconnect) counts its way there with OFFSET."""
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    _write(store, sid, 0, [b"%d" % i for i in range(10)])
    assert store.snapshot_entries.finish_snapshot(sid) == 10

    def offsets(seen: list[str]) -> list[str]:
        return [q for q in seen if "OFFSET" in q.upper()]

    with recorded(store.engine) as seen:
        ends, after = [], 0
        while batch := store.snapshot_entries.read_snapshot_entries(sid, after, 3):
            after = batch[-1].position
            ends.append(after)
        assert ends == [3, 6, 9, 11]
        assert offsets(seen) == []
        resumed = store.snapshot_entries.read_snapshot_entries(sid, 5, 3)
        assert [e.payload for e in resumed] == [b"5", b"6", b"7"]
        assert len(offsets(seen)) == 1


def test_read_marks_are_bounded_the_oldest_going_first(store: QueueStore) -> None:
    """Each read that ends inside a snapshot leaves a mark to continue from; a full
    set of marks gives up its oldest, and reading goes on."""
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    _write(store, sid, 0, [b"%d" % i for i in range(4)])
    assert store.snapshot_entries.finish_snapshot(sid) == 4
    marks = store.snapshot_entries.core.snapshot_marks
    marks.update({("gone", n): (n, 0, n) for n in range(1, _MAX_MARKS + 1)})
    first = store.snapshot_entries.read_snapshot_entries(sid, 0, 2)
    assert [e.payload for e in first] == [b"0", b"1"]
    assert len(marks) == _MAX_MARKS
    assert ("gone", 1) not in marks and ("gone", 2) in marks
    assert marks[(sid, 2)] == (2, 0, 1)
    rest = store.snapshot_entries.read_snapshot_entries(sid, 2, 10)
    assert [e.payload for e in rest] == [b"2", b"3", b"4"]


def test_keys_not_matching_the_payloads_are_refused_and_nothing_is_written(
    store: QueueStore,
) -> None:
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    with (
        store.write() as conn,
        pytest.raises(ValueError, match=r"^keys must be as many as payloads$"),
    ):
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"a", b"b"], keys=[b"k"])
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    _write(store, sid, 0, [b"a"])
    assert store.snapshot_entries.count_snapshot_entries(sid) == 1


def test_completing_a_snapshot_leaves_another_ready_one_ready(store: QueueStore) -> None:
    store.sites.register_sites(["b"])
    sids = []
    for client in ("policy", "orders"):
        sid = store.snapshots.request_snapshot(None, "b", client)
        store.snapshots.start_snapshot(sid)
        _write(store, sid, 0, [client.encode()])
        assert store.snapshot_entries.finish_snapshot(sid) == 1
        sids.append(sid)
    done, other = sids
    # Finishing the second left the first's end marker in place.
    read = store.snapshot_entries.read_snapshot_entries(done, 0, 10)
    assert [e.payload for e in read] == [b"policy", b"1"]
    assert store.snapshots.complete_snapshot(done, "b")
    assert _status(store, done) is SnapshotStatus.COMPLETED
    assert _status(store, other) is SnapshotStatus.READY
    view = store.snapshots.get_snapshot(other, "b")
    assert view is not None and view.status is SnapshotStatus.READY
    read = store.snapshot_entries.read_snapshot_entries(other, 0, 10)
    assert [e.payload for e in read] == [b"orders", b"1"]


def test_another_snapshots_silence_does_not_fail_one_heard_of(store: QueueStore) -> None:
    store.sites.register_sites(["b"])
    quiet = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(quiet)
    silent = store.snapshots.get_snapshot(quiet)
    assert silent is not None
    while time.time() <= silent.updated_at:  # the other one is heard of strictly later
        pass
    heard = store.snapshots.request_snapshot(None, "b", "orders")
    store.snapshots.start_snapshot(heard)
    alive = store.snapshots.get_snapshot(heard)
    assert alive is not None and alive.updated_at > silent.updated_at
    assert not store.snapshots.fail_stalled_snapshot(heard, alive.updated_at, "stalled")
    assert _status(store, heard) is SnapshotStatus.RUNNING
    assert store.snapshots.fail_stalled_snapshot(quiet, alive.updated_at, "stalled")
    assert _status(store, quiet) is SnapshotStatus.FAILED
    assert _status(store, heard) is SnapshotStatus.RUNNING


def test_a_snapshot_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(
        bare_store, lambda: bare_store.snapshots.request_snapshot(None, "b", "policy")
    )
    refused_for_no_schema(bare_store, lambda: bare_store.snapshots.list_snapshots())


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    started = across_outage(outage, lambda: store.snapshots.start_snapshot(sid))
    assert _status(store, sid) is SnapshotStatus.RUNNING  # started once, by either call
    assert started is None or started.snapshot_id == sid
    assert [r.snapshot_id for r in across_outage(outage, store.snapshots.list_snapshots)] == [sid]


def _payloads(store: QueueStore, sid: str) -> list[bytes]:
    """What a READY snapshot ships, end marker aside."""
    return [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 100)[:-1]]


def _running(store: QueueStore) -> str:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert store.snapshots.start_snapshot(sid) is not None
    return sid


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "rows"])
def test_write_snapshot_part_writes_a_whole_part_in_chunks(store: QueueStore, bulk: bool) -> None:
    sid = _running(store)
    produced = (b"p%d" % i for i in range(5))  # produced while it is written
    assert store.snapshot_entries.write_snapshot_part(sid, 1, produced, 2, bulk=bulk) == 5
    assert (
        store.snapshot_entries.write_snapshot_part(sid, 0, [b"a", b"b", b"c", b"d"], 2, bulk=bulk)
        == 4
    )
    assert store.snapshot_entries.write_snapshot_part(sid, 2, [], 2, bulk=bulk) == 0
    assert store.snapshot_entries.count_snapshot_entries(sid) == 9
    assert store.snapshot_entries.finish_snapshot(sid) == 9
    assert _payloads(store, sid) == [b"a", b"b", b"c", b"d", b"p0", b"p1", b"p2", b"p3", b"p4"]


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "rows"])
def test_snapshot_entries_keep_their_partition_keys(store: QueueStore, bulk: bool) -> None:
    sid = _running(store)
    rows = [(b"a", b"ka"), b"b", (b"c", None), (b"d", b"kd")]
    assert store.snapshot_entries.write_snapshot_part(sid, 0, iter(rows), 3, bulk=bulk) == 4
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 1, [b"e", b"f"], 0, [b"ke", None])
    store.snapshot_entries.finish_snapshot(sid)
    found = [
        (e.payload, e.key) for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 100)[:-1]
    ]
    assert found == [
        (b"a", b"ka"),
        (b"b", None),
        (b"c", None),
        (b"d", b"kd"),
        (b"e", b"ke"),
        (b"f", None),
    ]


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "rows"])
def test_a_rewritten_part_leaves_one_entry_per_payload(store: QueueStore, bulk: bool) -> None:
    sid = _running(store)
    assert (
        store.snapshot_entries.write_snapshot_part(
            sid, 0, [b"old%d" % i for i in range(7)], 3, bulk=bulk
        )
        == 7
    )
    store.snapshot_entries.write_snapshot_part(sid, 1, [b"x"], 3, bulk=bulk)
    assert (
        store.snapshot_entries.write_snapshot_part(sid, 0, [b"a", b"b", b"c", b"d"], 3, bulk=bulk)
        == 4
    )
    assert store.snapshot_entries.count_snapshot_entries(sid) == 5
    store.snapshot_entries.finish_snapshot(sid)
    assert _payloads(store, sid) == [b"a", b"b", b"c", b"d", b"x"]


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "rows"])
def test_write_snapshot_part_needs_a_running_snapshot(store: QueueStore, bulk: bool) -> None:
    with pytest.raises(SnapshotError):
        store.snapshot_entries.write_snapshot_part("no-such-snapshot", 0, [b"a"], 2, bulk=bulk)
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    with pytest.raises(SnapshotError):  # requested, not running
        store.snapshot_entries.write_snapshot_part(sid, 0, [b"a"], 2, bulk=bulk)
    store.snapshots.start_snapshot(sid)
    store.snapshot_entries.write_snapshot_part(sid, 0, [b"a"], 2, bulk=bulk)
    store.snapshots.cancel_snapshot(sid)
    with pytest.raises(SnapshotError):
        store.snapshot_entries.write_snapshot_part(sid, 0, [b"b"], 2, bulk=bulk)
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0


def test_snapshot_rows_committed_counts_the_first_parts(store: QueueStore) -> None:
    sid = _running(store)
    store.snapshot_entries.write_snapshot_part(sid, 0, [b"a", b"b", b"c"], 2)
    store.snapshot_entries.write_snapshot_part(sid, 2, [b"d", b"e"], 2)
    assert [store.snapshot_entries.snapshot_rows_committed(sid, n) for n in range(5)] == [
        0,
        3,
        3,
        5,
        5,
    ]
    assert store.snapshot_entries.snapshot_rows_committed(sid, -1) == 0
    assert store.snapshot_entries.snapshot_rows_committed("no-such-snapshot", 3) == 0
    other = store.snapshots.request_snapshot(None, "c", "policy")  # another stream's snapshot
    store.snapshots.start_snapshot(other)
    store.snapshot_entries.write_snapshot_part(other, 0, [b"z"], 2)
    assert store.snapshot_entries.snapshot_rows_committed(sid, 3) == 5
    assert store.snapshot_entries.snapshot_rows_committed(other, 3) == 1


def test_drop_unwritten_parts_empties_the_parts_a_run_did_not_write(store: QueueStore) -> None:
    sid = _running(store)
    for part in range(5):  # an earlier run, with five partitions
        store.snapshot_entries.write_snapshot_part(sid, part, [b"old%d" % part], 2)
    store.snapshot_entries.write_snapshot_part(sid, 0, [b"a", b"b"], 2)  # this run: parts 0 and 2
    store.snapshot_entries.write_snapshot_part(sid, 2, [b"c"], 2)
    store.snapshot_entries.drop_unwritten_parts(sid, {0: 2, 2: 1})
    assert store.snapshot_entries.count_snapshot_entries(sid) == 3
    store.snapshot_entries.drop_unwritten_parts(sid, {0: 2, 2: 1})  # idempotent
    store.snapshot_entries.finish_snapshot(sid)
    assert _payloads(store, sid) == [b"a", b"b", b"c"]


def test_drop_unwritten_parts_of_an_empty_run_empties_the_snapshot(store: QueueStore) -> None:
    sid = _running(store)
    store.snapshot_entries.write_snapshot_part(sid, 0, [b"a"], 2)
    store.snapshot_entries.write_snapshot_part(sid, 3, [b"b"], 2)
    store.snapshot_entries.drop_unwritten_parts(sid, {})
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0


def test_drop_unwritten_parts_needs_a_running_snapshot(store: QueueStore) -> None:
    with pytest.raises(SnapshotError):
        store.snapshot_entries.drop_unwritten_parts("no-such-snapshot", {0: 1})
    sid = _running(store)
    store.snapshot_entries.write_snapshot_part(sid, 0, [b"a"], 2)
    store.snapshot_entries.write_snapshot_part(sid, 1, [b"b"], 2)
    store.snapshot_entries.finish_snapshot(sid)
    with pytest.raises(SnapshotError):  # READY: its entries no longer change
        store.snapshot_entries.drop_unwritten_parts(sid, {0: 1})
    assert _payloads(store, sid) == [b"a", b"b"]


def test_the_part_writes_on_an_empty_database_are_schema_errors(bare_store: QueueStore) -> None:
    refused_for_no_schema(
        bare_store, lambda: bare_store.snapshot_entries.write_snapshot_part("s", 0, [b"a"], 2)
    )
    refused_for_no_schema(
        bare_store, lambda: bare_store.snapshot_entries.snapshot_rows_committed("s", 2)
    )
    refused_for_no_schema(
        bare_store, lambda: bare_store.snapshot_entries.drop_unwritten_parts("s", {0: 1})
    )


def test_the_part_writes_survive_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    sid = _running(store)
    assert (
        across_outage(
            outage, lambda: store.snapshot_entries.write_snapshot_part(sid, 0, [b"a", b"b"], 1)
        )
        == 2
    )
    assert (
        across_outage(outage, lambda: store.snapshot_entries.write_snapshot_part(sid, 1, [b"c"], 1))
        == 1
    )
    assert (
        across_outage(outage, lambda: store.snapshot_entries.snapshot_rows_committed(sid, 2)) == 3
    )
    across_outage(outage, lambda: store.snapshot_entries.drop_unwritten_parts(sid, {0: 2}))
    assert store.snapshot_entries.count_snapshot_entries(sid) == 2
    store.snapshot_entries.finish_snapshot(sid)
    assert _payloads(store, sid) == [b"a", b"b"]


def test_an_unknown_snapshot_changes_nothing(store: QueueStore) -> None:
    sid = _running(store)
    _write(store, sid, 0, [b"a"])
    before = store.snapshots.list_snapshots()
    nope = "no-such-snapshot"
    assert store.snapshots.start_snapshot(nope) is None
    assert not store.snapshots.heartbeat_snapshot(nope)
    assert not store.snapshots.snapshot_base_applied(nope)
    assert not store.snapshots.fail_stalled_snapshot(nope, time.time() + 60, "stalled")
    store.snapshot_entries.set_snapshot_progress(nope, 5)
    assert not store.snapshots.cancel_snapshot(nope)
    assert not store.snapshots.complete_snapshot(nope)
    with pytest.raises(SnapshotError):
        store.snapshot_entries.finish_snapshot(nope)
    assert store.snapshot_entries.count_snapshot_entries(nope) == 0
    assert store.snapshot_entries.read_snapshot_entries(nope, 0, 10) == []
    assert store.snapshots.open_snapshots("b", ["nobody"]) == {}
    assert store.snapshots.list_snapshots(destination="nobody") == []
    assert store.snapshots.get_snapshot(nope) is None
    assert store.snapshots.list_snapshots() == before
    assert store.snapshot_entries.count_snapshot_entries(sid) == 1


def test_every_snapshot_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    def in_transaction(call: Callable[[Connection], object]) -> Callable[[], object]:
        def run() -> object:
            with bare_store.write() as conn:
                return call(conn)

        return run

    running = [SnapshotStatus.RUNNING]
    calls: list[Callable[[], object]] = [
        lambda: bare_store.snapshots.get_snapshot("s"),
        lambda: bare_store.snapshots.open_snapshots("b", ["policy"]),
        lambda: bare_store.snapshots.update_snapshot("s", expect=running, reason="x"),
        lambda: bare_store.snapshots.start_snapshot("s"),
        lambda: bare_store.snapshots.heartbeat_snapshot("s"),
        lambda: bare_store.snapshots.snapshot_base_applied("s"),
        lambda: bare_store.snapshots.fail_stalled_snapshot("s", time.time(), "stalled"),
        in_transaction(
            lambda c: bare_store.snapshot_entries.write_snapshot_entries(c, "s", 0, [b"a"])
        ),
        lambda: bare_store.snapshot_entries.count_snapshot_entries("s"),
        lambda: bare_store.snapshot_entries.set_snapshot_progress("s", 1),
        lambda: bare_store.snapshot_entries.finish_snapshot("s"),
        lambda: bare_store.snapshots.cancel_snapshot("s"),
        lambda: bare_store.snapshots.complete_snapshot("s"),
        lambda: bare_store.snapshot_entries.read_snapshot_entries("s", 0, 10),
    ]
    for call in calls:
        refused_for_no_schema(bare_store, call)


def test_the_lifecycle_survives_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    sid = _running(store)
    assert across_outage(outage, lambda: store.snapshots.heartbeat_snapshot(sid))
    across_outage(outage, lambda: store.snapshot_entries.set_snapshot_progress(sid, 1))

    def write() -> int:
        with store.write() as conn:
            return store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])

    assert across_outage(outage, write) == 2
    assert across_outage(outage, lambda: store.snapshot_entries.count_snapshot_entries(sid)) == 2
    assert across_outage(outage, lambda: store.snapshot_entries.finish_snapshot(sid)) == 2
    got = across_outage(outage, lambda: store.snapshot_entries.read_snapshot_entries(sid, 0, 10))
    assert [e.payload for e in got] == [b"a", b"b", b"2"]
    open_now = across_outage(
        outage, lambda: store.snapshots.open_snapshots("b", ["policy", "other"])
    )
    assert {c: r.snapshot_id for c, r in open_now.items()} == {"policy": sid}
    across_outage(outage, lambda: store.snapshots.complete_snapshot(sid))
    done = store.snapshots.get_snapshot(sid)
    assert done is not None and done.status is SnapshotStatus.COMPLETED
    other = across_outage(outage, lambda: store.snapshots.request_snapshot(None, "c", "policy"))
    assert across_outage(outage, lambda: store.snapshots.cancel_snapshot(other)) in (True, False)
    assert _status(store, other) is SnapshotStatus.CANCELLED


def test_a_first_read_may_start_anywhere(store: QueueStore) -> None:
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    _write(store, sid, 0, [b"a", b"b", b"c"])
    assert store.snapshot_entries.finish_snapshot(sid) == 3
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 1, 10)] == [
        b"b",
        b"c",
        b"3",
    ]


def test_snapshots_never_share_counts_or_end_markers(store: QueueStore) -> None:
    """Two snapshots at once: each end marker counts and closes its own snapshot only."""
    store.sites.register_sites(["b", "c"])
    first = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(first)
    second = store.snapshots.request_snapshot(None, "c", "policy")  # no cursor: the next one
    assert second != first
    store.snapshots.start_snapshot(second)
    _write(store, first, 0, [b"f1", b"f2"])
    _write(store, second, 0, [b"s1", b"s2", b"s3"])
    assert store.snapshot_entries.finish_snapshot(first) == 2
    assert store.snapshot_entries.finish_snapshot(second) == 3
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(first, 0, 10)] == [
        b"f1",
        b"f2",
        b"2",
    ]
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(second, 0, 10)] == [
        b"s1",
        b"s2",
        b"s3",
        b"3",
    ]
    for sid, count in ((first, 2), (second, 3)):
        req = store.snapshots.get_snapshot(sid)
        assert req is not None and (req.entry_count, req.rows_written) == (count, count)


def test_writing_to_a_snapshot_that_is_not_running_says_its_state(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    with pytest.raises(SnapshotError, match=rf"^snapshot {sid} is requested, not running$"):
        _write(store, sid, 0, [b"a"])
    with pytest.raises(SnapshotError, match=r"^snapshot nope is unknown, not running$"):
        _write(store, "nope", 0, [b"a"])


def test_a_cancel_without_a_reason_says_cancelled(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert store.snapshots.cancel_snapshot(sid)
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and (req.status, req.reason) == (SnapshotStatus.CANCELLED, "cancelled")


def test_a_snapshot_heard_of_exactly_at_the_limit_is_not_stalled(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    req = store.snapshots.get_snapshot(sid)
    assert req is not None
    assert not store.snapshots.fail_stalled_snapshot(sid, req.updated_at, "stalled")
    assert _status(store, sid) is SnapshotStatus.RUNNING
    assert store.snapshots.fail_stalled_snapshot(sid, req.updated_at + 1.0, "stalled")
    failed = store.snapshots.get_snapshot(sid)
    assert failed is not None and failed.updated_at > req.updated_at  # when it was failed
