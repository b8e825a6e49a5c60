"""Shipping: reading the send queue per destination, cursors and backlog."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lr_client.headers import encode_headers
from lr_client.records import ReplicationType, SnapshotStatus
from lr_client.store import watches
from lr_client.store.contract import QueueStore
from tests.contract.calls import across_outage, append, positions, refused_for_no_schema
from tests.contract.outage import Outage
from tests.kit.wait import wait_for


def test_reads_are_per_destination_and_client(store: QueueStore) -> None:
    before = time.time()
    p = append(store, "policy", (b"1", ["b", "c"]), (b"2", ["b"]), (b"3", ["c"]), (b"4", ["d"]))
    after = time.time()
    got = store.shipping.read_log_entries("b", "policy", 0, 10)
    assert {e.type for e in got} == {ReplicationType.LOG_ENTRY_SYNC}
    assert all(before <= e.created_at <= after for e in got)  # the transmit's time
    append(store, "other", (b"o", ["b"]))
    assert [e.payload for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == [
        b"1",
        b"2",
    ]
    assert [e.payload for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == [
        b"1",
        b"3",
    ]
    assert [e.payload for e in store.shipping.read_log_entries("c", "policy", p[0], 10)] == [b"3"]
    assert [e.position for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == [
        p[0],
        p[2],
    ]
    assert {e.client_name for e in store.shipping.read_log_entries("b", "policy", 0, 10)} == {
        "policy"
    }
    assert store.shipping.read_log_entries("c", "other", 0, 10) == []
    assert store.shipping.read_log_entries("b", "policy", p[1], 10) == []


def test_an_unknown_destination_has_nothing(store: QueueStore) -> None:
    append(store, "policy", (b"1", ["b"]))
    assert store.shipping.read_log_entries("unknown", "policy", 0, 10) == []
    backlog = store.shipping.backlog("unknown", "policy")
    assert (backlog.entries, backlog.bytes, backlog.oldest_created_at) == (0, 0, None)
    cursor = store.shipping.get_cursor("unknown", "policy")
    assert (cursor.position, cursor.needs_snapshot) == (0, False)
    assert "unknown" not in store.sites.site_numbers(refresh=True)


def test_read_limits(store: QueueStore) -> None:
    p = append(store, "policy", *[(bytes([i]) * 100, ["b"]) for i in range(10)])
    assert [e.position for e in store.shipping.read_log_entries("b", "policy", 0, 3)] == p[:3]
    assert [
        e.position for e in store.shipping.read_log_entries("b", "policy", 0, 10, max_bytes=300)
    ] == (p[:2])
    # never empty: the first entry whatever its size
    assert [
        e.position for e in store.shipping.read_log_entries("b", "policy", 0, 10, max_bytes=1)
    ] == (p[:1])
    assert [
        e.position for e in store.shipping.read_log_entries("b", "policy", p[2], 10, up_to=p[5])
    ] == (p[3:6])
    assert [e.payload for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == [
        bytes([i]) * 100 for i in range(10)
    ]


def test_a_byte_bounded_read_takes_entries_that_fill_it_exactly(store: QueueStore) -> None:
    """The byte cut: payloads plus 32 bytes each, up to and including ``max_bytes``."""
    p = append(store, "policy", *[(bytes([i]) * 10, ["b"]) for i in range(3)])
    exact = 2 * (10 + 32)
    got = store.shipping.read_log_entries("b", "policy", 0, 10, max_bytes=exact)
    assert [e.position for e in got] == p[:2]
    got = store.shipping.read_log_entries("b", "policy", 0, 10, max_bytes=exact - 1)
    assert [e.position for e in got] == p[:1]


def test_a_byte_bounded_read_stops_at_the_first_entry_past_the_limit(store: QueueStore) -> None:
    """A small entry after one that does not fit is not taken: a read is a prefix."""
    p = append(store, "policy", (b"a" * 10, ["b"]), (b"b" * 100, ["b"]), (b"c" * 10, ["b"]))
    got = store.shipping.read_log_entries("b", "policy", 0, 10, max_bytes=2 * (10 + 32))
    assert [(e.position, e.payload) for e in got] == [(p[0], b"a" * 10)]


def test_the_client_log_names_each_entrys_destinations(store: QueueStore) -> None:
    before = time.time()
    p = append(store, "policy", (b"1", ["b", "c"]), (b"2", ["c"]), (b"3", ["b"]))
    after = time.time()
    append(store, "other", (b"o", ["b"]))
    got = store.shipping.read_client_log("policy", 0, 10)
    assert [(e.position, e.payload, sorted(e.destinations)) for e in got] == [
        (p[0], b"1", ["b", "c"]),
        (p[1], b"2", ["c"]),
        (p[2], b"3", ["b"]),
    ]
    assert {(e.client_name, e.type) for e in got} == {("policy", ReplicationType.LOG_ENTRY_SYNC)}
    assert got.complete is True  # fewer than the limit: the end of the queue
    assert all(before <= e.created_at <= after for e in got)  # the transmit's time
    first = store.shipping.read_client_log("policy", 0, 1)
    assert [e.position for e in first] == [p[0]] and first.complete is False  # the limit
    assert [e.position for e in store.shipping.read_client_log("policy", p[0], 1)] == [p[1]]
    sized = store.shipping.read_client_log("policy", 0, 10, max_bytes=1)
    assert [e.position for e in sized] == [p[0]] and sized.complete is False  # the byte cut
    two = store.shipping.read_client_log("policy", 0, 10, max_bytes=2 * (1 + 32))  # 1-byte payloads
    assert [e.position for e in two] == p[:2] and two.complete is False
    assert store.shipping.read_client_log("nobody", 0, 10) == []


def test_oldest_position_per_client(store: QueueStore) -> None:
    assert store.shipping.oldest_position() is None
    p = append(store, "policy", (b"1", ["b"]))
    q = append(store, "other", (b"2", ["b"]))
    assert store.shipping.oldest_position() == p[0]
    assert store.shipping.oldest_position("other") == q[0]
    assert store.shipping.oldest_position("nobody") is None


def test_cursors_and_backlog(store: QueueStore) -> None:
    p = append(store, "policy", (b"ab", ["b"]), (b"cde", ["b"]))
    fresh = store.shipping.get_cursor("b", "policy")
    assert (fresh.destination, fresh.client_name, fresh.position) == ("b", "policy", 0)
    backlog = store.shipping.backlog("b", "policy")
    assert (backlog.destination, backlog.client_name) == ("b", "policy")
    assert store.shipping.backlog("b", "policy").entries == 2
    assert store.shipping.backlog("b", "policy").bytes == 5
    assert store.shipping.backlog("b", "policy").oldest_created_at is not None
    store.shipping.set_cursor("b", "policy", p[0])
    assert store.shipping.get_cursor("b", "policy").position == p[0]
    assert store.shipping.backlog("b", "policy").entries == 1
    assert store.shipping.backlog("b", "policy").bytes == 3
    store.shipping.set_cursor("b", "policy", p[1])
    assert store.shipping.backlog("b", "policy").entries == 0
    assert store.shipping.backlog("b", "policy").bytes == 0
    unknown = store.shipping.backlog("unknown", "policy")
    assert (unknown.destination, unknown.client_name, unknown.entries) == ("unknown", "policy", 0)


def test_the_backlogs_of_several_streams_are_each_ones_backlog(store: QueueStore) -> None:
    p = append(store, "policy", (b"ab", ["b", "c"]), (b"cde", ["b"]), (b"f", ["c"]))
    append(store, "other", (b"xyz", ["b"]))
    store.shipping.set_cursor("c", "policy", p[0])
    streams = [("c", "policy"), ("unknown", "policy"), ("b", "other"), ("b", "policy")]
    got = store.shipping.backlogs(streams)
    assert got == [store.shipping.backlog(d, c) for d, c in streams]
    assert [(b.destination, b.client_name, b.entries, b.bytes) for b in got] == [
        ("c", "policy", 1, 1),
        ("unknown", "policy", 0, 0),
        ("b", "other", 1, 3),
        ("b", "policy", 2, 5),
    ]
    assert store.shipping.backlogs([]) == []


def test_a_cursor_is_its_own_destinations_and_clients(store: QueueStore) -> None:
    store.shipping.set_cursor("b", "policy", 5)
    assert store.shipping.get_cursor("b", "other").position == 0
    assert store.shipping.get_cursor("c", "policy").position == 0
    assert store.shipping.get_cursor("b", "policy").position == 5


def test_set_cursor_keeps_the_snapshot_flag_unless_told(store: QueueStore) -> None:
    store.shipping.set_cursor("b", "policy", 4, needs_snapshot=True)
    store.shipping.set_cursor("b", "policy", 7)
    cursor = store.shipping.get_cursor("b", "policy")
    assert (cursor.position, cursor.needs_snapshot) == (7, True)
    store.shipping.set_cursor("b", "policy", 7, needs_snapshot=False)
    assert store.shipping.get_cursor("b", "policy").needs_snapshot is False
    assert store.shipping.get_cursor("b", "policy").acked_at > 0


def test_list_cursors_by_destination_then_client(store: QueueStore) -> None:
    store.shipping.set_cursor("c", "policy", 3)
    store.shipping.set_cursor("b", "zeta", 2)
    store.shipping.set_cursor("b", "alpha", 1)
    got = [(c.destination, c.client_name, c.position) for c in store.shipping.list_cursors()]
    assert got == [("b", "alpha", 1), ("b", "zeta", 2), ("c", "policy", 3)]


def test_log_streams_since_a_position(store: QueueStore) -> None:
    assert store.shipping.log_streams() == (set(), 0)
    p = append(store, "policy", (b"1", ["b", "c"]), (b"2", ["c"]))
    q = append(store, "other", (b"3", ["b"]))
    assert store.shipping.log_streams() == (
        {("b", "policy"), ("c", "policy"), ("b", "other")},
        q[0],
    )
    assert store.shipping.log_streams(p[0]) == ({("c", "policy"), ("b", "other")}, q[0])
    assert store.shipping.log_streams(q[0]) == (set(), q[0])


def test_a_shipping_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(bare_store, lambda: bare_store.shipping.get_cursor("b", "policy"))
    refused_for_no_schema(bare_store, lambda: bare_store.shipping.read_client_log("policy", 0, 10))


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    p = append(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    across_outage(outage, lambda: store.shipping.set_cursor("b", "policy", p[0]))
    assert store.shipping.get_cursor("b", "policy").position == p[0]
    got = across_outage(outage, lambda: store.shipping.read_log_entries("b", "policy", 0, 10))
    assert [e.position for e in got] == p


def test_every_shipping_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: bare_store.shipping.read_log_entries("b", "policy", 0, 10),
        lambda: bare_store.shipping.oldest_position("policy"),
        bare_store.shipping.oldest_position,
        bare_store.shipping.list_cursors,
        lambda: bare_store.shipping.set_cursor("b", "policy", 1),
        lambda: bare_store.shipping.backlog("b", "policy"),
        bare_store.shipping.log_streams,
    ]
    for call in calls:
        refused_for_no_schema(bare_store, call)


def test_every_shipping_read_survives_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    p = append(store, "policy", (b"1", ["b"]), (b"2", ["b", "c"]))
    store.shipping.set_cursor("b", "policy", p[0])
    got = across_outage(outage, lambda: store.shipping.read_client_log("policy", 0, 10))
    assert [(e.position, sorted(e.destinations)) for e in got] == [
        (p[0], ["b"]),
        (p[1], ["b", "c"]),
    ]
    assert across_outage(outage, lambda: store.shipping.oldest_position("policy")) == p[0]
    assert across_outage(outage, lambda: store.shipping.get_cursor("b", "policy")).position == p[0]
    cursors = across_outage(outage, store.shipping.list_cursors)
    assert [(c.destination, c.client_name, c.position) for c in cursors] == [("b", "policy", p[0])]
    assert across_outage(outage, lambda: store.shipping.backlog("b", "policy")).entries == 1
    assert across_outage(outage, store.shipping.log_streams) == (
        {("b", "policy"), ("c", "policy")},
        p[1],
    )


def test_watch_sends_is_woken_by_work_for_the_sessions_only(
    store: QueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed transmit, a full-sync request, a dropped stream and an accepted loss
    wake the watch (PostgreSQL: ``NOTIFY lrq_sends``; SQLite: the send queues' heads
    moved); a write that is no work for a session (its status row) does not."""
    monkeypatch.setattr(watches, "NOTIFY_INTERVAL", 0.0)  # every transmit notifies
    wakes: list[int] = []
    watch = store.shipping.watch_sends(lambda: wakes.append(1))
    assert watch is not None
    try:
        wait_for(lambda: watch.listening and len(wakes) == 1, what="the watch's first wake")
        append(store, "policy", (b"1", ["b"]))
        wait_for(lambda: len(wakes) == 2, what="a transmit's wake-up")
        append(store, "policy", (b"2", ["b"]), (b"3", ["c"]))
        wait_for(lambda: len(wakes) == 3, what="a batch's wake-up")
        status = {"inflight_batches": 0, "inflight_bytes": 0}
        store.inspection.save_session_status("b", "connected", connected=True, **status)
        store.snapshots.request_snapshot(None, "b", "policy", "test")  # the marker
        wait_for(lambda: len(wakes) >= 4, what="a full-sync request's wake-up")
        assert len(wakes) == 4  # the status row woke nobody
        store.retention.drop_stream("c", "policy", "test")
        wait_for(lambda: len(wakes) == 5, what="a dropped stream's wake-up")
        store.retention.stop_stream("c", "policy", "test", 1)
        assert store.retention.accept_stream_loss("c", "policy") is not None
        wait_for(lambda: len(wakes) >= 6, what="an accepted loss's wake-up")
    finally:
        watch.close()


def test_a_snapshots_new_status_wakes_the_sessions(
    store: QueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session may have a step to take when a snapshot's status changes (failed,
    cancelled, ready): the change wakes the watch (PostgreSQL: the store notifies)."""
    monkeypatch.setattr(watches, "NOTIFY_INTERVAL", 0.0)
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert store.snapshots.start_snapshot(sid) is not None
    wakes: list[int] = []
    watch = store.shipping.watch_sends(lambda: wakes.append(1))
    assert watch is not None
    try:
        wait_for(lambda: watch.listening and len(wakes) >= 1, what="the watch's first wake")
        for expect, status in (
            (SnapshotStatus.RUNNING, SnapshotStatus.FAILED),
            (SnapshotStatus.FAILED, SnapshotStatus.CANCELLED),
        ):
            seen = len(wakes)
            assert store.snapshots.update_snapshot(sid, expect=[expect], status=status)
            wait_for(lambda seen=seen: len(wakes) > seen, what=f"the wake-up of {status}")
    finally:
        watch.close()


def test_every_send_wakes_says_whether_each_transmit_rings_however_soon(
    store: QueueStore,
) -> None:
    """Where it says so (SQLite), each transmit rings the watch, however soon after the
    last (the sessions skip reads on it); PostgreSQL rations its notifications (one per
    process per ``NOTIFY_INTERVAL``) and says so."""
    wakes: list[int] = []
    watch = store.shipping.watch_sends(lambda: wakes.append(1))
    assert watch is not None
    try:
        wait_for(lambda: watch.listening and len(wakes) == 1, what="the watch's first wake")
        append(store, "policy", (b"0", ["b"]))
        wait_for(lambda: len(wakes) == 2, what="the first transmit's wake-up")
        if store.shipping.every_send_wakes:
            for i in range(1, 4):
                append(store, "policy", (b"%d" % i, ["b"]))
                wait_for(lambda i=i: len(wakes) == 2 + i, what=f"transmit {i}'s wake-up")
    finally:
        watch.close()


def test_both_reads_give_each_entry_its_key_headers_and_destinations(store: QueueStore) -> None:
    """A destination's read and a client's read (a cascade root's) return each entry's
    partition key and stored headers as written; the client's read its destinations."""
    nums = store.sites.register_sites(["b", "c"])
    blob = encode_headers({"content-type": "application/json"})
    with store.write() as conn:
        refs = store.send.append_log_entries(
            conn,
            "policy",
            [
                (b"1", [nums["b"]], b"k1", blob),
                (b"2", [nums["b"], nums["c"]], None, None),
                (b"3", [nums["b"]], b"k3", None),
            ],
        )
    positions(store, refs)  # PostgreSQL: sequenced
    want = [(b"k1", blob), (None, None), (b"k3", None)]
    assert [
        (e.key, e.headers) for e in store.shipping.read_log_entries("b", "policy", 0, 9)
    ] == want
    mine = store.shipping.read_client_log("policy", 0, 9)
    assert [(e.payload, e.key, e.headers) for e in mine] == [
        (b"1", b"k1", blob),
        (b"2", None, None),
        (b"3", b"k3", None),
    ]
    assert [sorted(e.destinations) for e in mine] == [["b"], ["b", "c"], ["b"]]
