"""Inspection: what running sender sessions say of themselves."""

from __future__ import annotations

from lr_client.records import ReplicationType, WireEntry
from lr_client.store.contract import QueueStore
from lr_client.store.ops.inspection import BROWSE_HEAD_BYTES
from tests.contract.calls import (
    across_outage,
    append,
    log,
    pass_entries,
    positions,
    refused_for_no_schema,
)
from tests.contract.outage import Outage


def _summary(store: QueueStore) -> list[tuple[object, ...]]:
    return [
        (
            r["destination"],
            r["state"],
            bool(r["connected"]),
            r["inflight_batches"],
            r["inflight_bytes"],
            r["last_error"],
        )
        for r in store.inspection.list_session_status()
    ]


def test_session_status_is_one_row_per_destination(store: QueueStore) -> None:
    assert store.inspection.list_session_status() == []
    store.inspection.save_session_status(
        "c", "streaming", connected=True, inflight_batches=2, inflight_bytes=9
    )
    store.inspection.save_session_status(
        "b", "backoff", connected=False, inflight_batches=0, inflight_bytes=0, last_error="down"
    )
    assert _summary(store) == [
        ("b", "backoff", False, 0, 0, "down"),
        ("c", "streaming", True, 2, 9, ""),
    ]
    store.inspection.save_session_status(
        "b", "streaming", connected=True, inflight_batches=1, inflight_bytes=3
    )
    assert _summary(store) == [
        ("b", "streaming", True, 1, 3, ""),
        ("c", "streaming", True, 2, 9, ""),
    ]
    assert all(r["updated_at"] > 0 for r in store.inspection.list_session_status())


def test_a_long_error_is_kept_to_its_start(store: QueueStore) -> None:
    error = "".join(chr(ord("a") + i % 26) for i in range(5000))
    store.inspection.save_session_status(
        "b", "backoff", connected=False, inflight_batches=0, inflight_bytes=0, last_error=error
    )
    (row,) = store.inspection.list_session_status()
    assert row["last_error"] == error[:2000]


def test_an_inspection_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(bare_store, bare_store.inspection.list_session_status)
    refused_for_no_schema(
        bare_store,
        lambda: bare_store.inspection.save_session_status(
            "b", "idle", connected=False, inflight_batches=0, inflight_bytes=0
        ),
    )


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    store.inspection.save_session_status(
        "b", "idle", connected=True, inflight_batches=0, inflight_bytes=0
    )
    across_outage(
        outage,
        lambda: store.inspection.save_session_status(
            "b", "streaming", connected=True, inflight_batches=1, inflight_bytes=5
        ),
    )
    assert across_outage(outage, lambda: _summary(store)) == [("b", "streaming", True, 1, 5, "")]


def test_head_position_estimate_counts_what_was_assigned(store: QueueStore) -> None:
    assert store.inspection.head_position_estimate() == 0
    p = append(store, "policy", (b"1", ["b"]), (b"2", ["c"]))
    assert store.inspection.head_position_estimate() == p[-1] == store.send.head_position()
    nums = store.sites.register_sites(["b"])
    with store.write() as conn:  # a position assigned in an open transaction
        (pending,) = store.send.append_log_entries(conn, "policy", [(b"3", [nums["b"]])])
        # SQLite gave it a position at insert; PostgreSQL gives it one after commit.
        assert p[-1] <= store.inspection.head_position_estimate() <= (pending.position or p[-1])
    (done,) = positions(store, [pending])
    assert done > p[-1] and store.inspection.head_position_estimate() == done


def test_queue_depths_are_those_of_the_non_empty_queues(store: QueueStore) -> None:
    assert store.inspection.queue_depths() == {}
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3))
    store.recv.apply_log_batch("b", "policy", log(1))
    store.recv.apply_log_batch("a", "other", log(7))
    qa, qb = (q.queue_id for q in store.queues.list_queues("policy"))
    (qo,) = (q.queue_id for q in store.queues.list_queues("other"))
    assert store.inspection.queue_depths() == {qa: 3, qb: 1, qo: 1}
    pass_entries(store, qb, 10)
    assert store.inspection.queue_depths() == {qa: 3, qo: 1}


def test_queue_sizes_count_every_queue_by_name(store: QueueStore) -> None:
    assert store.inspection.queue_sizes() == (0, 0, [])
    append(store, "policy", (b"1", ["b"]), (b"2", ["b", "c"]))
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"x", b"y", b"z"])
    store.recv.apply_log_batch("b", "policy", log(1, 2))
    store.recv.apply_log_batch("a", "policy", log(1))
    n_log, n_snap, queues = store.inspection.queue_sizes()
    assert (n_log, n_snap) == (2, 3)
    assert [(q.queue_name, q.source_id, depth) for q, depth in queues] == [
        ("LRQ_Recv_policy__a", "a", 1),
        ("LRQ_Recv_policy__b", "b", 2),
    ]
    pass_entries(store, queues[0][0].queue_id, 10)
    assert [(q.queue_name, d) for q, d in store.inspection.queue_sizes()[2]] == [
        ("LRQ_Recv_policy__a", 0),
        ("LRQ_Recv_policy__b", 2),
    ]


def test_queue_slots_show_where_rows_are_stored(store: QueueStore) -> None:
    append(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3))
    found = store.inspection.queue_slots()
    if store.dialect == "sqlite":  # one table per queue, trimmed by rows: no slots
        assert found == []
        return
    for queue, rows in (("send", 2), ("receive", 3)):
        mine = [x for x in found if x.queue == queue]
        assert [x.slot for x in mine] == sorted(x.slot for x in mine)
        (current,) = (x for x in mine if x.current)
        assert current.entries == rows and current.bytes > 0
        assert sum(x.entries for x in mine) == rows


def test_browse_log_entries_shows_what_a_destination_still_needs(store: QueueStore) -> None:
    p = append(store, "policy", (b"1", ["b"]), (b"2", ["b", "c"]), (b"3", ["c"]))
    q = append(store, "other", (b"4", ["b"]))
    every = store.inspection.browse_log_entries(None, None, 0, 10)
    assert [(e.position, e.client_name, e.payload) for e in every] == [
        (p[0], "policy", b"1"),
        (p[1], "policy", b"2"),
        (p[2], "policy", b"3"),
        (q[0], "other", b"4"),
    ]
    assert [sorted(e.destinations) for e in every] == [["b"], ["b", "c"], ["c"], ["b"]]
    assert [e.position for e in store.inspection.browse_log_entries(None, None, p[0], 2)] == p[1:]
    assert [e.position for e in store.inspection.browse_log_entries(None, "other", 0, 10)] == q
    assert [e.position for e in store.inspection.browse_log_entries("b", None, 0, 10)] == [
        p[0],
        p[1],
        q[0],
    ]
    store.shipping.set_cursor("b", "policy", p[0])
    assert [e.position for e in store.inspection.browse_log_entries("b", "policy", 0, 10)] == [p[1]]
    store.retention.drop_stream("b", "other", "too slow")
    assert [e.position for e in store.inspection.browse_log_entries("b", None, 0, 10)] == [p[1]]
    assert store.inspection.browse_log_entries("nobody", None, 0, 10) == []


def test_browse_snapshot_entries_by_destination_and_client(store: QueueStore) -> None:
    assert store.inspection.browse_snapshot_entries(None, None, 0, 10) == []
    first = store.snapshots.request_snapshot(None, "b", "policy")
    second = store.snapshots.request_snapshot(None, "c", "other")
    for sid, payloads in ((first, [b"p0", b"p1"]), (second, [b"o0"])):
        store.snapshots.start_snapshot(sid)
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(conn, sid, 0, payloads)
    every = store.inspection.browse_snapshot_entries(None, None, 0, 10)
    assert [(e.snapshot_id, e.client_name, e.destinations, e.payload) for e in every] == [
        (first, "policy", ("b",), b"p0"),
        (first, "policy", ("b",), b"p1"),
        (second, "other", ("c",), b"o0"),
    ]
    positions = [e.position for e in every]
    assert positions == sorted(positions)
    assert store.inspection.browse_snapshot_entries(None, None, positions[0], 1) == every[1:2]
    assert [e.payload for e in store.inspection.browse_snapshot_entries("c", None, 0, 10)] == [
        b"o0"
    ]
    assert [e.payload for e in store.inspection.browse_snapshot_entries(None, "policy", 0, 10)] == [
        b"p0",
        b"p1",
    ]
    assert store.inspection.browse_snapshot_entries("b", "other", 0, 10) == []
    assert store.inspection.browse_snapshot_entries("nobody", None, 0, 10) == []


def test_browsing_reads_a_payloads_head_and_size_only(store: QueueStore) -> None:
    """Every browse returns the first BROWSE_HEAD_BYTES of a payload and its whole size."""
    big = bytes(range(256)) * 40 + b"\x00"  # every byte value, NULs included
    head = big[:BROWSE_HEAD_BYTES]
    append(store, "policy", (big, ["b"]), (b"tiny", ["b"]))
    logged = store.inspection.browse_log_entries("b", None, 0, 10)
    assert [(e.payload, e.size) for e in logged] == [(head, len(big)), (b"tiny", 4)]
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [big])
    assert [
        (e.payload, e.size) for e in store.inspection.browse_snapshot_entries("b", None, 0, 10)
    ] == [(head, len(big))]
    store.recv.apply_log_batch("a", "policy", [WireEntry(3, ReplicationType.LOG_ENTRY_SYNC, big)])
    queued = store.inspection.browse_queue("LRQ_Recv_policy__a", 0, 10)
    assert [(e.payload, e.size) for e in queued or []] == [(head, len(big))]


def test_browse_queue_by_name_from_a_seq(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(2, 4, 6))
    store.recv.apply_log_batch("b", "policy", log(1))
    got = store.inspection.browse_queue("LRQ_Recv_policy__a", 0, 10)
    assert got is not None
    assert [(e.position, e.payload, e.client_name) for e in got] == [
        (2, b"2", "policy"),
        (4, b"4", "policy"),
        (6, b"6", "policy"),
    ]
    seqs = [e.seq or 0 for e in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert {e.type for e in got} == {int(ReplicationType.LOG_ENTRY_SYNC)}
    assert [
        e.position for e in store.inspection.browse_queue("LRQ_Recv_policy__a", seqs[0], 1) or []
    ] == [4]
    assert store.inspection.browse_queue("LRQ_Recv_policy__a", seqs[-1], 10) == []
    assert store.inspection.browse_queue("LRQ_Recv_nobody__a", 0, 10) is None
    qa = store.queues.list_queues("policy")[0].queue_id
    pass_entries(store, qa, 1)  # delivered: no longer in the queue
    assert [
        e.position for e in store.inspection.browse_queue("LRQ_Recv_policy__a", 0, 10) or []
    ] == [4, 6]


def test_the_views_on_an_empty_database_are_schema_errors(bare_store: QueueStore) -> None:
    refused_for_no_schema(bare_store, bare_store.inspection.head_position_estimate)
    refused_for_no_schema(bare_store, bare_store.inspection.queue_depths)
    refused_for_no_schema(bare_store, bare_store.inspection.queue_sizes)
    refused_for_no_schema(
        bare_store, lambda: bare_store.inspection.browse_log_entries(None, None, 0, 10)
    )
    refused_for_no_schema(
        bare_store, lambda: bare_store.inspection.browse_snapshot_entries(None, None, 0, 10)
    )
    refused_for_no_schema(
        bare_store, lambda: bare_store.inspection.browse_queue("LRQ_Recv_p__a", 0, 10)
    )


def test_the_views_survive_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    p = append(store, "policy", (b"1", ["b"]))
    store.recv.apply_log_batch("a", "policy", log(5))
    (queue,) = store.queues.list_queues("policy")
    assert across_outage(outage, store.inspection.head_position_estimate) == p[0]
    assert across_outage(outage, store.inspection.queue_depths) == {queue.queue_id: 1}
    assert across_outage(outage, store.inspection.queue_sizes) == (1, 0, [(queue, 1)])
    logged = across_outage(outage, lambda: store.inspection.browse_log_entries("b", None, 0, 10))
    assert [e.position for e in logged] == p
    assert (
        across_outage(outage, lambda: store.inspection.browse_snapshot_entries(None, None, 0, 10))
        == []
    )
    queued = across_outage(outage, lambda: store.inspection.browse_queue(queue.queue_name, 0, 10))
    assert [e.position for e in queued or []] == [5]


def test_sink_reads_count_what_waits_and_nothing_failed(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3))
    (backlog,) = store.inspection.sink_backlogs("policy")
    assert (backlog.client_name, backlog.source_id, backlog.depth) == ("policy", "a", 3)
    assert backlog.oldest_received_at is not None
    assert store.inspection.sink_backlogs("other") == []
    failures = store.inspection.sink_failures("policy")
    assert (failures.parked, failures.blocked) == ({}, {})
    assert store.inspection.sink_partition_lags("policy") == []  # no partitions claimed
