"""Receiving: applying batches from a source to the sink's receive queues, exactly once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from lr_client.errors import InvalidNameError, ProtocolError, StoreUnavailableError
from lr_client.lanes import MAX_LANES, lane_of
from lr_client.records import ReplicationType, SinkProgress, SinkSnapshotState, WireEntry
from lr_client.store.contract import QueueStore
from lr_client.store.recv import arrival_watch
from tests.contract.calls import across_outage, log, refused_for_no_schema
from tests.contract.outage import Outage
from tests.kit.wait import wait_for

#: The client of the wake-up tests: notifications are per database, and no other test
#: (in another schema of it) sends one for this name.
WATCHED = "watched-" + uuid.uuid4().hex[:8]

SNAP = ReplicationType.SNAPSHOT_SYNC
END = ReplicationType.LAST_FULL_SYNC_ENTRY


def _queued(store: QueueStore, client: str = "policy") -> list[tuple[int, bytes, str]]:
    """(source position, payload, snapshot id) of everything queued for ``client``, in order."""
    (queue,) = store.queues.list_queues(client)
    with store.write() as conn:
        got = store.queues.read_queue(conn, queue.queue_id, 100)
    return [(e.source_position, e.payload, e.snapshot_id) for e in got]


def test_receiver_is_idempotent_and_registers_queue(store: QueueStore) -> None:
    batch = log(3, 5, 9)
    assert store.recv.apply_log_batch("site-a", "policy", batch) == (True, 9)
    assert store.recv.apply_log_batch("site-a", "policy", batch) == (False, 9)
    assert store.recv.apply_log_batch("site-a", "policy", [*batch, *log(11)]) == (True, 11)
    (queue,) = store.queues.list_queues("policy")
    assert queue.queue_name == "LRQ_Recv_policy__site-a"
    assert (queue.source_id, queue.client_name) == ("site-a", "policy")
    assert [p for p, _, _ in _queued(store)] == [3, 5, 9, 11]
    progress = store.recv.sink_progress("site-a", "policy")
    assert progress.last_position == 11
    assert progress.snapshot_state is SinkSnapshotState.NONE


def test_a_gap_is_refused_and_applies_nothing(store: QueueStore) -> None:
    store.recv.apply_log_batch("site-a", "policy", log(1, 2))
    with pytest.raises(ProtocolError, match="gap"):
        store.recv.apply_log_batch("site-a", "policy", log(5, 6), previous_position=4)
    assert [p for p, _, _ in _queued(store)] == [1, 2]
    assert store.recv.sink_progress("site-a", "policy").last_position == 2
    assert store.recv.apply_log_batch("site-a", "policy", log(3, 4), previous_position=2) == (
        True,
        4,
    )
    assert [p for p, _, _ in _queued(store)] == [1, 2, 3, 4]


def test_a_queue_registered_by_a_receive_rolled_back_is_registered_again(
    store: QueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a receive transaction that registered a new queue and then failed
    (its connection lost while it appended) left the queue's id cached, so the next
    batch's entries went to a queue that no registration named: no subscriber found them."""

    def lost(*args: object) -> None:
        raise StoreUnavailableError("the connection is lost")

    with monkeypatch.context() as patched:
        patched.setattr(store.core, "append_recv", lost)
        with pytest.raises(StoreUnavailableError):
            store.recv.apply_log_batch("site-a", "policy", log(1, 2))
    assert store.queues.list_queues("policy") == []
    assert store.recv.sink_progress("site-a", "policy").last_position == 0
    assert store.recv.apply_log_batch("site-a", "policy", log(1, 2)) == (True, 2)
    assert [p for p, _, _ in _queued(store)] == [1, 2]


@pytest.mark.parametrize(("source", "client"), [("Site-A", "policy"), ("site-a", "po_licy")])
def test_a_bad_name_applies_nothing(store: QueueStore, source: str, client: str) -> None:
    with pytest.raises(InvalidNameError):
        store.recv.apply_log_batch(source, client, log(1))
    with pytest.raises(InvalidNameError):
        store.recv.apply_snapshot_batch(source, client, "s1", [WireEntry(1, SNAP, b"x", "s1")])
    with pytest.raises(InvalidNameError):
        store.recv.apply_drop_notice(source, client, "n1", 1, "dropped")
    assert store.queues.list_queues() == []
    assert store.recv.list_sink_progress() == []
    assert store.recv.list_sink_drops() == []


def test_sources_get_separate_queues(store: QueueStore) -> None:
    e = [WireEntry(1, ReplicationType.LOG_ENTRY_SYNC, b"x")]
    store.recv.apply_log_batch("a-b", "c", e)
    store.recv.apply_log_batch("a", "b-c", e)
    names = sorted(q.queue_name for q in store.queues.list_queues())
    assert names == ["LRQ_Recv_b-c__a", "LRQ_Recv_c__a-b"]


def test_sink_snapshot_supersedes_and_sets_base(store: QueueStore) -> None:
    store.recv.apply_snapshot_batch("a", "policy", "s1", [WireEntry(1, SNAP, b"old", "s1")])
    assert store.recv.sink_progress("a", "policy").snapshot_state is SinkSnapshotState.ONGOING
    store.recv.apply_snapshot_batch("a", "policy", "s2", [WireEntry(1, SNAP, b"new", "s2")])
    end = WireEntry(2, END, b"1", "s2", 1, base_position=42)
    assert store.recv.apply_snapshot_batch("a", "policy", "s2", [end]) == (True, 2)
    assert [(b, s) for _, b, s in _queued(store)] == [(b"new", "s2"), (b"1", "s2")]
    progress = store.recv.sink_progress("a", "policy")
    assert progress.last_position == 42 and progress.snapshot_id == "s2"
    assert progress.snapshot_state is SinkSnapshotState.COMPLETED
    # a replayed batch of the completed snapshot is not applied again
    assert store.recv.apply_snapshot_batch("a", "policy", "s2", [end])[0] is False
    # log entries resume after the base
    assert store.recv.apply_log_batch("a", "policy", log(40, 43)) == (True, 43)
    assert [p for p, _, _ in _queued(store)][-1:] == [43]


def test_snapshot_batches_are_checked_for_gaps(store: QueueStore) -> None:
    first = [WireEntry(1, SNAP, b"a", "s1"), WireEntry(2, SNAP, b"b", "s1")]
    assert store.recv.apply_snapshot_batch("a", "policy", "s1", first, previous_position=0) == (
        True,
        2,
    )
    assert store.recv.apply_snapshot_batch("a", "policy", "s1", first[1:], previous_position=1) == (
        False,
        2,
    )
    with pytest.raises(ProtocolError):
        store.recv.apply_snapshot_batch(
            "a", "policy", "s1", [WireEntry(5, SNAP, b"e", "s1")], previous_position=4
        )
    with pytest.raises(ProtocolError):
        store.recv.apply_snapshot_batch(
            "a", "policy", "s2", [WireEntry(3, SNAP, b"c", "s2")], previous_position=2
        )
    assert [(p, s) for p, _, s in _queued(store)] == [(1, "s1"), (2, "s1")]
    assert store.recv.sink_progress("a", "policy").snapshot_id == "s1"


def test_a_drop_notice_is_queued_once_and_rewinds(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3, 4))
    assert store.recv.apply_drop_notice("a", "policy", "n1", 3, "too far behind")
    assert not store.recv.apply_drop_notice("a", "policy", "n1", 3, "too far behind")
    queued = _queued(store)
    assert queued[-1] == (3, b"too far behind", "n1")
    (queue,) = store.queues.list_queues("policy")
    with store.write() as conn:
        assert store.queues.read_queue(conn, queue.queue_id, 100)[-1].type is (
            ReplicationType.STREAM_DROPPED
        )
    assert store.recv.sink_progress("a", "policy").last_position == 2
    (drop,) = store.recv.list_sink_drops()
    assert (drop.source_id, drop.client_name, drop.notice_id) == ("a", "policy", "n1")
    assert (drop.first_dropped_position, drop.reason) == (3, "too far behind")
    assert store.recv.apply_drop_notice("a", "policy", "n2", 9, "again")
    assert [d.notice_id for d in store.recv.list_sink_drops()] == ["n2"]  # the last per stream
    assert store.recv.sink_progress("a", "policy").last_position == 2  # never moved forward


def test_a_drop_notice_is_its_own_streams(store: QueueStore) -> None:
    """A notice id repeats per stream only; the rewind and the lanes forgotten are the
    stream's own; the snapshot state it had stays; a drop of the first entry rewinds to 0."""
    one = _key(1, 2)
    before = time.time()
    store.recv.apply_lane_batch("b", "policy", 1, 2, _keyed(one, 5), 0, 0)
    store.recv.apply_snapshot_batch("a", "policy", "s1", _snap("s1", 1, end=2, base=3))
    had = store.recv.sink_progress("a", "policy")
    assert store.recv.apply_drop_notice("b", "policy", "n1", 1, "gone")
    assert store.recv.apply_drop_notice("a", "policy", "n1", 1, "gone")  # not a repeat here
    assert store.recv.apply_drop_notice("a", "other", "n1", 1, "gone")
    now = store.recv.sink_progress("a", "policy")
    assert (now.snapshot_state, now.snapshot_id, now.snapshot_position) == (
        had.snapshot_state,
        had.snapshot_id,
        had.snapshot_position,
    )
    assert now.entries_received == had.entries_received > 0
    assert store.recv.sink_progress("b", "policy").last_position == 0
    drops = store.recv.list_sink_drops()
    assert [(d.source_id, d.client_name) for d in drops] == [
        ("a", "other"),
        ("a", "policy"),
        ("b", "policy"),
    ]
    assert all(before <= d.received_at <= time.time() for d in drops)
    store.recv.apply_lane_batch("c", "policy", 1, 2, _keyed(one, 7), 0, 0)
    store.recv.apply_lane_batch("b", "other", 1, 2, _keyed(one, 7), 0, 0)
    assert store.recv.apply_drop_notice("b", "policy", "n2", 1, "again")
    # The other streams' lane rows stay: their entries sent again are not applied twice.
    assert store.recv.apply_lane_batch("c", "policy", 1, 2, _keyed(one, 7), 0, 0) == (False, 7)
    assert store.recv.apply_lane_batch("b", "other", 1, 2, _keyed(one, 7), 0, 0) == (False, 7)
    # A loss an operator accepted (an id "a..."): the position goes on past it.
    assert store.recv.apply_drop_notice("b", "policy", "a1", 6, "skipped")
    assert store.recv.sink_progress("b", "policy").last_position == 5


def test_a_drop_notice_ends_a_partial_snapshot(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1))
    store.recv.apply_snapshot_batch("a", "policy", "s1", [WireEntry(1, SNAP, b"part", "s1")])
    assert store.recv.apply_drop_notice("a", "policy", "n1", 2, "dropped")
    assert [(p, s) for p, _, s in _queued(store)] == [(1, ""), (2, "n1")]
    progress = store.recv.sink_progress("a", "policy")
    assert (progress.snapshot_state, progress.snapshot_id) == (SinkSnapshotState.NONE, "")


def test_sink_progress_is_listed_per_source_and_client(store: QueueStore) -> None:
    assert store.recv.sink_progress("a", "policy").last_position == 0
    store.recv.apply_log_batch("b", "policy", log(7))
    store.recv.apply_log_batch("a", "zeta", log(5))
    store.recv.apply_log_batch("a", "alpha", log(3))
    got = [(p.source_id, p.client_name, p.last_position) for p in store.recv.list_sink_progress()]
    assert got == [("a", "alpha", 3), ("a", "zeta", 5), ("b", "policy", 7)]
    store.recv.apply_drop_notice("b", "zeta", "n", 1, "r")
    store.recv.apply_drop_notice("a", "policy", "m", 1, "r")
    assert [(d.source_id, d.client_name) for d in store.recv.list_sink_drops()] == [
        ("a", "policy"),
        ("b", "zeta"),
    ]


def test_a_receiving_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(
        bare_store, lambda: bare_store.recv.apply_log_batch("a", "policy", log(1))
    )
    refused_for_no_schema(bare_store, bare_store.recv.list_sink_progress)


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    store.recv.apply_log_batch("a", "policy", log(1))
    assert (
        across_outage(outage, lambda: store.recv.apply_log_batch("a", "policy", log(1, 2)))[1] == 2
    )
    assert [p for p, _, _ in _queued(store)] == [1, 2]  # applied once
    assert across_outage(outage, lambda: store.recv.sink_progress("a", "policy")).last_position == 2


def test_every_receiving_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: bare_store.recv.apply_log_batch("a", "policy", log(1)),
        lambda: bare_store.recv.apply_snapshot_batch(
            "a", "policy", "s1", [WireEntry(1, SNAP, b"x")]
        ),
        lambda: bare_store.recv.apply_drop_notice("a", "policy", "n1", 1, "dropped"),
        lambda: bare_store.recv.apply_lane_batch("a", "policy", 1, 2, [], 0, 0),
        lambda: bare_store.recv.sink_progress("a", "policy"),
        bare_store.recv.list_sink_progress,
        bare_store.recv.list_sink_drops,
    ]
    for call in calls:
        refused_for_no_schema(bare_store, call)


def test_every_receiving_method_survives_a_lost_connection(
    store: QueueStore, outage: Outage
) -> None:
    snap = [WireEntry(1, SNAP, b"x", "s1")]
    assert across_outage(outage, lambda: store.recv.apply_snapshot_batch("a", "p", "s1", snap)) in (
        (True, 1),
        (False, 1),
    )
    assert across_outage(
        outage, lambda: store.recv.apply_drop_notice("a", "p", "n1", 2, "gone")
    ) in (
        True,
        False,
    )
    lane = _keyed(None, 5)
    assert across_outage(
        outage, lambda: store.recv.apply_lane_batch("a", "q", 1, 2, lane, 0, 0)
    ) in (
        (True, 5),
        (False, 5),
    )
    drops = across_outage(outage, store.recv.list_sink_drops)
    assert [(d.source_id, d.client_name, d.notice_id) for d in drops] == [("a", "p", "n1")]
    progress = across_outage(outage, store.recv.list_sink_progress)
    assert [(p.source_id, p.client_name) for p in progress] == [("a", "p"), ("a", "q")]
    assert [(p, b) for p, b, _ in _queued(store, "p")] == [(2, b"gone")]
    assert [p for p, _, _ in _queued(store, "q")] == [5]  # applied once


# -- the progress a batch leaves behind, field by field --------------------------------
def _snap(sid: str, *positions: int, end: int | None = None, base: int = 0) -> list[WireEntry]:
    """Snapshot entries ``positions`` of ``sid`` (payload ``b"<sid>-<n>"``), then its end."""
    out = [WireEntry(p, SNAP, b"%s-%d" % (sid.encode(), p), sid) for p in positions]
    if end is not None:
        out.append(WireEntry(end, END, b"", sid, snapshot_count=end - 1, base_position=base))
    return out


def test_a_stream_never_seen_has_empty_progress_of_its_own(store: QueueStore) -> None:
    assert store.recv.sink_progress("site-a", "policy") == SinkProgress("site-a", "policy")


def test_progress_counts_every_entry_received_and_stamps_the_time(
    store: QueueStore,
) -> None:
    before = time.time()
    store.recv.apply_log_batch("site-a", "policy", log(1, 2, 3))
    store.recv.apply_log_batch("site-a", "policy", log(3, 4))  # 3 again: not counted
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1, 2))
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 2, end=3, base=4))
    got = store.recv.sink_progress("site-a", "policy")
    assert got.entries_received == 4 + 2 + 1
    assert before - 1 <= got.updated_at <= time.time() + 1
    assert store.recv.list_sink_progress() == [got]


def test_a_partial_snapshot_keeps_the_log_position_and_its_end_completes_it(
    store: QueueStore,
) -> None:
    store.recv.apply_log_batch("site-a", "policy", log(4, 5))
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1, 2))
    got = store.recv.sink_progress("site-a", "policy")
    assert (got.last_position, got.snapshot_state) == (5, SinkSnapshotState.ONGOING)
    assert (got.snapshot_id, got.snapshot_position) == ("s1", 2)
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", end=3, base=9))
    got = store.recv.sink_progress("site-a", "policy")
    assert (got.last_position, got.snapshot_state) == (9, SinkSnapshotState.COMPLETED)
    assert (got.snapshot_id, got.snapshot_position) == ("s1", 3)


def test_an_empty_first_batch_of_a_new_snapshot_still_supersedes_the_unfinished_one(
    store: QueueStore,
) -> None:
    store.recv.apply_log_batch("site-a", "policy", log(1, 2))
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1, 2))
    assert store.recv.apply_snapshot_batch("site-a", "policy", "s2", []) == (False, 0)
    got = store.recv.sink_progress("site-a", "policy")
    assert (got.source_id, got.client_name) == ("site-a", "policy")
    assert (got.last_position, got.snapshot_state) == (2, SinkSnapshotState.ONGOING)
    assert (got.snapshot_id, got.snapshot_position, got.entries_received) == ("s2", 0, 4)
    assert _queued(store) == [(1, b"1", ""), (2, b"2", "")]


def test_a_new_snapshot_removes_only_the_unfinished_one_of_its_own_stream(
    store: QueueStore,
) -> None:
    """Queued log entries stay; another source's snapshot of the same id stays."""
    store.recv.apply_log_batch("site-a", "policy", log(1, 2))
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1, 2))
    store.recv.apply_snapshot_batch("site-c", "policy", "s1", _snap("s1", 1))
    store.recv.apply_snapshot_batch("site-a", "policy", "s2", _snap("s2", 1))
    by_source = {q.source_id: q.queue_id for q in store.queues.list_queues("policy")}
    with store.engine.begin() as conn:
        a = store.queues.read_queue(conn, by_source["site-a"], 100)
        c = store.queues.read_queue(conn, by_source["site-c"], 100)
    assert [(e.source_position, e.snapshot_id) for e in a] == [(1, ""), (2, ""), (1, "s2")]
    assert [(e.source_position, e.snapshot_id) for e in c] == [(1, "s1")]


def test_a_completed_snapshot_stays_whole_when_a_new_one_starts(
    store: QueueStore,
) -> None:
    """The log entries after its base follow it in the queue and need its end before them."""
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1, end=2, base=5))
    store.recv.apply_log_batch("site-a", "policy", log(6))
    store.recv.apply_snapshot_batch("site-a", "policy", "s2", _snap("s2", 1))
    assert [(p, sid) for p, _, sid in _queued(store)] == [(1, "s1"), (2, "s1"), (6, ""), (1, "s2")]


def test_gaps_are_refused_with_what_each_side_has(store: QueueStore) -> None:
    store.recv.apply_log_batch("site-a", "policy", log(1, 2))
    with pytest.raises(ProtocolError, match="gap: batch follows position 4, sink has 2"):
        store.recv.apply_log_batch("site-a", "policy", log(5), previous_position=4)
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1))
    with pytest.raises(ProtocolError, match=r"^gap in snapshot batch$"):
        store.recv.apply_snapshot_batch(
            "site-a", "policy", "s1", _snap("s1", 3), previous_position=2
        )
    with pytest.raises(ProtocolError, match="a new snapshot must start at its first entry"):
        store.recv.apply_snapshot_batch(
            "site-a", "policy", "s2", _snap("s2", 2), previous_position=1
        )
    assert [(p, sid) for p, _, sid in _queued(store)] == [(1, ""), (2, ""), (1, "s1")]


def test_log_batches_keep_the_streams_snapshot_state(store: QueueStore) -> None:
    """An ongoing snapshot goes on after a log batch; a completed one's replay stays a duplicate."""
    store.recv.apply_snapshot_batch("site-a", "policy", "s1", _snap("s1", 1, 2))
    assert store.recv.apply_log_batch("site-a", "policy", log(3)) == (True, 3)
    got = store.recv.sink_progress("site-a", "policy")
    assert (got.last_position, got.snapshot_state) == (3, SinkSnapshotState.ONGOING)
    assert (got.snapshot_id, got.snapshot_position) == ("s1", 2)
    end = _snap("s1", end=3, base=4)
    assert store.recv.apply_snapshot_batch("site-a", "policy", "s1", end, previous_position=2) == (
        True,
        3,
    )
    assert store.recv.apply_log_batch("site-a", "policy", log(5)) == (True, 5)
    got = store.recv.sink_progress("site-a", "policy")
    assert (got.last_position, got.snapshot_state) == (5, SinkSnapshotState.COMPLETED)
    assert (got.snapshot_id, got.snapshot_position) == ("s1", 3)
    assert store.recv.apply_snapshot_batch("site-a", "policy", "s1", end, previous_position=2) == (
        False,
        3,
    )
    assert [(p, sid) for p, _, sid in _queued(store)] == [
        (1, "s1"),
        (2, "s1"),
        (3, ""),
        (3, "s1"),
        (5, ""),
    ]


# -- lanes: one stream's entries over several gRPC streams ---------------------------------


def _key(lane: int, lanes: int) -> bytes:
    """A partition key on ``lane`` of ``lanes``."""
    return next(k for k in (b"k%d" % i for i in range(100)) if lane_of(k, lanes) == lane)


def _keyed(key: bytes | None, *positions: int) -> list[WireEntry]:
    return [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p, key=key) for p in positions]


def test_lanes_apply_out_of_global_order_and_a_resend_applies_nothing_twice(
    store: QueueStore,
) -> None:
    one, two = _key(1, 2), _key(2, 2)
    assert store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(two, 3, 4), 0, 0) == (True, 4)
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 1, 2, 5), 0, 0) == (True, 5)
    assert [p for p, _, _ in _queued(store)] == [3, 4, 1, 2, 5]
    assert store.recv.sink_progress("a", "policy").last_position == 0  # no low-water mark yet
    # After a crash the source sends everything again from the stream's position (0).
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 1, 2, 5), 0, 0) == (
        False,
        5,
    )
    assert store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(two, 3, 4, 6), 0, 0) == (True, 6)
    assert [p for p, _, _ in _queued(store)] == [3, 4, 1, 2, 5, 6]
    # The low-water mark (every entry up to it acknowledged) becomes the stream's position.
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, [], 5, 6) == (False, 6)
    assert store.recv.sink_progress("a", "policy").last_position == 6
    assert store.recv.sink_progress("a", "policy").entries_received == 6


def test_a_lane_gap_or_an_entry_of_another_lane_is_refused_and_applies_nothing(
    store: QueueStore,
) -> None:
    one, two = _key(1, 2), _key(2, 2)
    store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(two, 3), 0, 0)
    with pytest.raises(ProtocolError, match="gap"):
        store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(two, 9), 7, 0)
    with pytest.raises(ProtocolError, match="lane 2"):
        store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(one, 4), 3, 0)
    with pytest.raises(ProtocolError, match="lane 2"):  # an unkeyed entry goes on lane 1
        store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(None, 4), 3, 0)
    with pytest.raises(ProtocolError, match="out of range"):
        store.recv.apply_lane_batch("a", "policy", 3, 2, [], 0, 0)
    assert [p for p, _, _ in _queued(store)] == [3]
    assert store.recv.sink_progress("a", "policy").last_position == 0


def test_entries_applied_under_one_lane_count_are_skipped_under_another(
    store: QueueStore,
) -> None:
    keys = [b"k%d" % i for i in range(6)]
    for n, k in enumerate(keys, start=1):  # positions 1..6 over 2 lanes
        store.recv.apply_lane_batch("a", "policy", lane_of(k, 2), 2, _keyed(k, n), 0, 0)
    # Sent again over 3 lanes (the configuration changed), with 7 and 8 new.
    for n, k in enumerate([*keys, b"x", b"y"], start=1):
        store.recv.apply_lane_batch("a", "policy", lane_of(k, 3), 3, _keyed(k, n), 0, 0)
    assert sorted(p for p, _, _ in _queued(store)) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_each_streams_lanes_are_its_own(store: QueueStore) -> None:
    """Lane rows are kept per source and client: another stream's lanes neither hold
    back this one's entries nor are forgotten when this one's low-water mark passes them."""
    one, two = _key(1, 2), _key(2, 2)
    store.recv.apply_lane_batch("b", "policy", 1, 2, _keyed(one, 9), 0, 0)
    store.recv.apply_lane_batch("a", "other", 1, 2, _keyed(one, 9), 0, 0)
    # a/policy's entries below those positions are its own, fresh.
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 2, 3), 0, 0) == (True, 3)
    assert store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(two, 12), 0, 0) == (True, 12)
    # Its low-water mark reaches 10: it forgets its own lane rows up to 10, no other.
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, [], 3, 10) == (False, 10)
    # Sent again from the start (a source restarted): nothing is applied twice.
    assert store.recv.apply_lane_batch("b", "policy", 1, 2, _keyed(one, 9), 0, 0) == (False, 9)
    assert store.recv.apply_lane_batch("a", "other", 1, 2, _keyed(one, 9), 0, 0) == (False, 9)
    assert store.recv.apply_lane_batch("a", "policy", 2, 2, _keyed(two, 12), 10, 10) == (
        False,
        12,
    )
    assert sorted(p for p, _, _ in _queued(store, "other")) == [9]
    assert store.recv.sink_progress("a", "policy").entries_received == 3


def test_a_lane_batch_is_checked_against_its_bounds_and_the_mark(store: QueueStore) -> None:
    one = _key(1, 2)
    last = _key(MAX_LANES, MAX_LANES)
    assert store.recv.apply_lane_batch("a", "policy", MAX_LANES, MAX_LANES, [], 0, 0) == (False, 0)
    assert store.recv.apply_lane_batch(
        "a", "policy", MAX_LANES, MAX_LANES, _keyed(last, 1), 0, 0
    ) == (True, 1)
    with pytest.raises(ProtocolError, match="out of range"):
        store.recv.apply_lane_batch("a", "policy", 1, MAX_LANES + 1, [], 0, 0)
    with pytest.raises(ProtocolError, match="gap"):  # nothing of lane 1 held: it follows 0
        store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 3), 1, 0)
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 2, 3), 0, 0) == (True, 3)
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, [], 3, 3) == (False, 3)
    # The entry at the low-water mark itself is held by the mark, its lane row forgotten.
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 3), 2, 3) == (False, 3)
    assert [p for p, _, _ in _queued(store)] == [1, 2, 3]


def test_a_snapshots_end_and_a_drop_notice_forget_the_lanes(store: QueueStore) -> None:
    one = _key(1, 2)
    store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 1, 2, 3), 0, 0)
    store.recv.apply_drop_notice("a", "policy", "n1", 3, "gone")  # the stream resumes after 2
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 3), 2, 2) == (True, 3)
    store.recv.apply_snapshot_batch("a", "policy", "s1", _snap("s1", 1, end=2, base=2))
    # After the end, log entries after the base (2) are applied again, whatever the lanes held.
    assert store.recv.apply_lane_batch("a", "policy", 1, 2, _keyed(one, 3), 2, 2) == (True, 3)
    assert [p for p, _, _ in _queued(store)] == [1, 2, 3, 3, 3, 1, 2, 3]


def test_a_store_told_not_to_notify_wakes_no_subscriber(store: QueueStore) -> None:
    """``notify_arrivals`` off (``[receiver] notify_subscribers = false``): batches are
    stored as ever and no watch is woken (notifications come in commit order: the batch
    stored after it, with notifications on again, is the next wake-up). SQLite has no
    notifications: its watch sees the commits to the file."""
    woken: list[int] = []
    watch = store.queues.watch_arrivals(WATCHED, lambda: woken.append(1))
    assert watch is not None
    try:
        wait_for(lambda: woken == [1], what="the wake-up after LISTEN")
        store.recv.notify_arrivals = False
        assert store.recv.apply_log_batch("a", WATCHED, log(1)) == (True, 1)
        if store.dialect == "sqlite":
            # SQLite's watch sees every commit to the file, told to notify or not:
            # the batch wakes it (and its count depends on when the watch looks).
            wait_for(lambda: len(woken) >= 2, what="the watch seeing the commit")
            assert [p for p, _, _ in _queued(store, WATCHED)] == [1]
            return
        store.recv.notify_arrivals = True
        store.recv.apply_log_batch("a", WATCHED, log(2))
        wait_for(lambda: len(woken) >= 2, what="the wake-up for position 2")
        assert len(woken) == 2
        assert [p for p, _, _ in _queued(store, WATCHED)] == [1, 2]
    finally:
        watch.close()


def test_a_snapshot_batch_wakes_its_clients_subscribers(store: QueueStore) -> None:
    """As a log batch does: on PostgreSQL by a notification naming the client (a
    snapshot batch's stream lock announces nothing), on SQLite by the commit."""
    woken: list[int] = []
    watch = store.queues.watch_arrivals(WATCHED, lambda: woken.append(1))
    assert watch is not None
    try:
        wait_for(lambda: woken == [1], what="the wake-up after LISTEN")
        store.recv.apply_snapshot_batch("a", WATCHED, "s1", _snap("s1", 1, 2))
        wait_for(lambda: len(woken) >= 2, what="the wake-up for the snapshot batch")
        assert [p for p, _, _ in _queued(store, WATCHED)] == [1, 2]
    finally:
        watch.close()


def test_no_notification_is_sent_once_the_notification_queue_is_at_its_limit(
    store: QueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's notification queue at ``QUEUE_USAGE_LIMIT`` (a limit of 0 here: the
    queue's usage, 0, is at it): the batch is stored and nobody is woken, so a listener
    that stopped reading can never fill the queue and fail receive transactions. SQLite
    has no notification queue: its watch sees commits to the file, apart or together."""
    if store.dialect == "sqlite":
        return
    woken: list[int] = []
    watch = store.queues.watch_arrivals(WATCHED, lambda: woken.append(1))
    assert watch is not None
    try:
        wait_for(lambda: woken == [1], what="the wake-up after LISTEN")
        monkeypatch.setattr(arrival_watch, "QUEUE_USAGE_LIMIT", 0.0)
        assert store.recv.apply_log_batch("a", WATCHED, log(1)) == (True, 1)
        monkeypatch.undo()
        store.recv.apply_log_batch("a", WATCHED, log(2))
        wait_for(lambda: len(woken) >= 2, what="the wake-up for position 2")
        assert len(woken) == 2
    finally:
        watch.close()
