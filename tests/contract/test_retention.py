"""Retention: trim, dropped streams, trim marks, stopped streams and flow state."""

from __future__ import annotations

from collections.abc import Callable

from lr_client.records import SnapshotStatus
from lr_client.store.contract import QueueStore
from tests.contract.calls import across_outage, append_apart, refused_for_no_schema
from tests.contract.outage import Outage


def _positions(store: QueueStore, destination: str) -> list[int]:
    return [e.position for e in store.shipping.read_log_entries(destination, "policy", 0, 100)]


def test_trim_keeps_what_a_destination_needs(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"1", ["b", "c"]), (b"2", ["b"]), (b"3", ["c"]))
    store.shipping.set_cursor("b", "policy", p[2])
    assert store.retention.trim() == 1  # only 2: 1 and 3 still wait for c
    assert [e.payload for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == [
        b"1",
        b"3",
    ]
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 10)] == [p[0], p[2]]
    store.shipping.set_cursor("c", "policy", p[0])
    assert store.retention.trim() == 1
    assert store.shipping.oldest_position() == p[2]
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 10)] == [p[2]]
    # positions are never reused after a trim
    store.shipping.set_cursor("c", "policy", p[2])
    store.retention.trim()
    assert store.shipping.read_client_log("policy", 0, 10) == []
    assert append_apart(store, "policy", (b"4", ["b"]))[0] > p[2]


def test_trim_in_batches_deletes_all_that_is_acknowledged(store: QueueStore) -> None:
    p = append_apart(store, "policy", *[(b"%d" % i, ["b"]) for i in range(7)])
    store.shipping.set_cursor("b", "policy", p[4])
    if store.dialect == "postgresql":  # whole slots: the batch bounds SQLite's row deletes
        assert store.retention.trim(batch_size=2, max_batches=1) == 5
        assert _positions(store, "b") == p[5:]
        return
    assert store.retention.trim(batch_size=2, max_batches=1) == 2
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 10)] == p[
        2:
    ]  # the oldest
    assert store.retention.trim(batch_size=2) == 3
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 10)] == p[5:]
    assert _positions(store, "b") == p[5:]


def test_trim_keeps_what_follows_an_open_snapshots_base(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)  # base p[1]
    q = append_apart(store, "policy", (b"3", ["b"]))
    store.shipping.set_cursor("b", "policy", q[0])
    store.retention.trim()
    assert _positions(store, "b") == q  # what follows the base stays
    assert p[1] not in _positions(store, "b")


def test_trim_releases_the_entries_of_closed_snapshots(store: QueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])
    store.snapshot_entries.finish_snapshot(sid)
    kept = store.snapshots.request_snapshot(None, "c", "policy")
    store.snapshots.start_snapshot(kept)
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, kept, 0, [b"k"])
    store.snapshots.update_snapshot(sid, status=SnapshotStatus.FAILED)
    assert store.retention.trim() == 3  # two entries and the end marker of the failed one
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    assert store.snapshot_entries.count_snapshot_entries(kept) == 1


def test_trim_marks_follow_what_trim_deleted(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"1", ["b", "c"]), (b"2", ["b"]), (b"3", ["c"]))
    assert store.retention.trimmed_through("b", "policy") == 0
    store.shipping.set_cursor("b", "policy", p[2])
    store.retention.trim()
    assert store.retention.trimmed_through("b", "policy") == p[1]
    assert store.retention.trimmed_through("c", "policy") == 0
    store.shipping.set_cursor("c", "policy", p[0])
    store.retention.trim()
    assert store.retention.trimmed_through("b", "policy") == p[1]  # never lowered
    assert store.retention.trimmed_through("c", "policy") == p[0]
    assert store.retention.trimmed_through("unknown", "policy") == 0
    assert store.retention.trimmed_through("b", "other") == 0


def test_drop_releases_backlog(store: QueueStore) -> None:
    append_apart(store, "policy", (b"1", ["b", "c"]), (b"2", ["c"]))
    store.sites.register_sites(["b"])
    drop = store.retention.drop_stream("c", "policy", "too far behind")
    assert drop is not None and drop.first_dropped_position == 1
    assert (drop.destination, drop.client_name, drop.reason) == ("c", "policy", "too far behind")
    assert store.shipping.get_cursor("c", "policy").needs_snapshot
    store.shipping.set_cursor("c", "policy", 1)  # a late log ack keeps the flag
    assert store.shipping.get_cursor("c", "policy").needs_snapshot
    store.shipping.set_cursor("b", "policy", 10)
    assert store.retention.trim() == 2
    assert store.shipping.read_client_log("policy", 0, 10) == []
    assert [d.destination for d in store.retention.list_drops()] == ["c"]
    store.retention.clear_drop("c", "policy")
    assert store.retention.list_drops() == []


def test_a_drop_is_recorded_once(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"1", ["b"]), (b"2", ["b"]), (b"3", ["c"]))
    store.shipping.set_cursor("b", "policy", p[0])
    first = store.retention.drop_stream("b", "policy", "behind")
    assert first is not None and first.first_dropped_position == p[0] + 1
    again = store.retention.drop_stream("b", "policy", "again", first_dropped_position=99)
    assert again == first
    told = store.retention.drop_stream("c", "policy", "told", first_dropped_position=p[2])
    assert told is not None and told.first_dropped_position == p[2]
    assert [(d.destination, d.reason) for d in store.retention.list_drops("b")] == [("b", "behind")]
    assert sorted(d.destination for d in store.retention.list_drops()) == ["b", "c"]
    store.retention.clear_drop("b", "policy")
    assert [d.destination for d in store.retention.list_drops()] == ["c"]


def test_an_unknown_destination_is_not_dropped(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"1", ["b"]))
    assert store.retention.drop_stream("unknown", "policy", "x") is None
    assert store.retention.list_drops() == []
    assert store.shipping.get_cursor("unknown", "policy").needs_snapshot is False
    assert _positions(store, "b") == p


def test_a_stopped_stream_is_recorded_accepted_and_resumed(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    store.shipping.set_cursor("b", "policy", p[1])
    store.retention.trim()
    assert store.retention.get_stream_stop("b", "policy") is None
    assert store.retention.accept_stream_loss("b", "policy") is None  # not stopped
    assert store.retention.stop_stream("b", "policy", "lost", resume_after=p[1])
    assert not store.retention.stop_stream("b", "policy", "again", resume_after=0)  # still open
    stop = store.retention.get_stream_stop("b", "policy")
    assert stop is not None
    assert (stop.destination, stop.client_name, stop.reason, stop.resume_after) == (
        "b",
        "policy",
        "lost",
        p[1],
    )
    assert (stop.accepted_at, stop.accepted_through, stop.resumed_at) == (None, None, None)
    store.retention.mark_stream_resumed("b", "policy")  # not accepted: stays stopped
    still = store.retention.get_stream_stop("b", "policy")
    assert still is not None and still.resumed_at is None
    accepted = store.retention.accept_stream_loss("b", "policy")
    assert accepted is not None and accepted.accepted_at is not None
    assert accepted.accepted_through == p[1]  # the trim mark when the loss was accepted
    assert store.retention.accept_stream_loss("b", "policy") is None  # once
    store.retention.mark_stream_resumed("b", "policy")
    resumed = store.retention.get_stream_stop("b", "policy")
    assert resumed is not None and resumed.resumed_at is not None
    # A new loss after a resumed one replaces the record.
    assert store.retention.stop_stream("b", "policy", "lost again", resume_after=p[1] + 5)
    fresh = store.retention.get_stream_stop("b", "policy")
    assert fresh is not None and (fresh.reason, fresh.accepted_at) == ("lost again", None)
    store.retention.clear_stream_stop("b", "policy")
    assert store.retention.get_stream_stop("b", "policy") is None


def test_stream_stops_are_listed_by_destination_then_client(store: QueueStore) -> None:
    store.retention.stop_stream("c", "policy", "x", 1)
    store.retention.stop_stream("b", "zeta", "y", 2)
    store.retention.stop_stream("b", "alpha", "z", 3)
    got = [(s.destination, s.client_name, s.reason) for s in store.retention.list_stream_stops()]
    assert got == [("b", "alpha", "z"), ("b", "zeta", "y"), ("c", "policy", "x")]
    store.retention.clear_stream_stop("b", "zeta")
    assert [s.client_name for s in store.retention.list_stream_stops()] == ["alpha", "policy"]


def test_set_flow_state_is_per_client(store: QueueStore) -> None:
    store.retention.set_flow_state("policy", True, ["c", "b"])
    store.retention.set_flow_state("other", False, ["d"])
    assert store.send.flow_state("policy") == (True, ["b", "c"])
    assert store.send.flow_state("other") == (False, ["d"])
    store.retention.set_flow_state("policy", False, [])
    assert store.send.flow_state("policy") == (False, [])
    assert store.send.flow_state("other") == (False, ["d"])


def test_a_retention_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(bare_store, bare_store.retention.trim)
    refused_for_no_schema(bare_store, bare_store.retention.list_stream_stops)


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    p = append_apart(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    store.shipping.set_cursor("b", "policy", p[0])
    across_outage(outage, store.retention.trim)
    assert _positions(store, "b") == p[1:]
    assert across_outage(outage, lambda: store.retention.trimmed_through("b", "policy")) == p[0]


def test_every_retention_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: bare_store.retention.drop_stream("b", "policy", "too slow"),
        bare_store.retention.list_drops,
        lambda: bare_store.retention.clear_drop("b", "policy"),
        lambda: bare_store.retention.trimmed_through("b", "policy"),
        lambda: bare_store.retention.stop_stream("b", "policy", "lost", 0),
        lambda: bare_store.retention.get_stream_stop("b", "policy"),
        lambda: bare_store.retention.accept_stream_loss("b", "policy"),
        lambda: bare_store.retention.mark_stream_resumed("b", "policy"),
        lambda: bare_store.retention.clear_stream_stop("b", "policy"),
        lambda: bare_store.retention.set_flow_state("policy", True, ["b"]),
    ]
    for call in calls:
        refused_for_no_schema(bare_store, call)


def test_unknown_streams_have_no_records(store: QueueStore) -> None:
    assert store.retention.list_drops("nobody") == []
    store.retention.clear_drop("nobody", "policy")
    assert store.retention.get_stream_stop("nobody", "policy") is None
    assert store.retention.accept_stream_loss("nobody", "policy") is None
    store.retention.mark_stream_resumed("nobody", "policy")
    store.retention.clear_stream_stop("nobody", "policy")
    assert store.retention.list_stream_stops() == []
    assert store.retention.list_drops() == []


def test_stops_and_drops_survive_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    p = append_apart(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    drop = across_outage(outage, lambda: store.retention.drop_stream("b", "policy", "too slow"))
    assert drop is None or drop.first_dropped_position == p[0]  # None: recorded before
    assert [
        (d.destination, d.client_name) for d in across_outage(outage, store.retention.list_drops)
    ] == [("b", "policy")]
    across_outage(outage, lambda: store.retention.clear_drop("b", "policy"))
    assert store.retention.list_drops() == []
    assert across_outage(outage, lambda: store.retention.stop_stream("c", "policy", "lost", 4)) in (
        True,
        False,
    )
    stop = across_outage(outage, lambda: store.retention.get_stream_stop("c", "policy"))
    assert stop is not None and (stop.reason, stop.resume_after) == ("lost", 4)
    accepted = across_outage(outage, lambda: store.retention.accept_stream_loss("c", "policy"))
    assert accepted is not None and accepted.accepted_at is not None
    across_outage(outage, lambda: store.retention.mark_stream_resumed("c", "policy"))
    stops = across_outage(outage, store.retention.list_stream_stops)
    assert [(s.destination, s.resumed_at is not None) for s in stops] == [("c", True)]
    across_outage(outage, lambda: store.retention.clear_stream_stop("c", "policy"))
    assert store.retention.list_stream_stops() == []
    across_outage(outage, lambda: store.retention.set_flow_state("policy", True, ["b"]))
    assert store.send.flow_state("policy") == (True, ["b"])


def test_site_numbers_that_share_digits_are_kept_apart(store: QueueStore) -> None:
    """Sites 1, 11 and 12: a stream's reads and trim never take another's entries for its own."""
    sites = [f"s{i:02d}" for i in range(1, 13)]
    nums = store.sites.register_sites(sites)
    one, eleven, twelve = (next(s for s, n in nums.items() if n == k) for k in (1, 11, 12))
    p = append_apart(
        store, "policy", (b"to 11", [eleven]), (b"to 1", [one]), (b"to 1 and 12", [one, twelve])
    )
    assert [e.payload for e in store.shipping.read_log_entries(one, "policy", 0, 10)] == [
        b"to 1",
        b"to 1 and 12",
    ]
    assert [e.payload for e in store.shipping.read_log_entries(eleven, "policy", 0, 10)] == [
        b"to 11"
    ]
    assert store.shipping.backlog(one, "policy").entries == 2
    store.shipping.set_cursor(one, "policy", p[2])
    assert store.retention.trim() == 1  # "to 1" only: 11 and 12 have not acknowledged theirs
    assert [e.payload for e in store.shipping.read_client_log("policy", 0, 10)] == [
        b"to 11",
        b"to 1 and 12",
    ]
    store.shipping.set_cursor(twelve, "policy", p[2])
    assert store.retention.trim() == 1
    assert store.retention.trimmed_through(one, "policy") == p[2]
    assert store.retention.trimmed_through(twelve, "policy") == p[2]
    assert store.retention.trimmed_through(eleven, "policy") == 0
    assert [e.payload for e in store.shipping.read_log_entries(eleven, "policy", 0, 10)] == [
        b"to 11"
    ]


def test_an_entry_for_a_destination_without_a_cursor_stays(store: QueueStore) -> None:
    p = append_apart(store, "policy", (b"b and c", ["b", "c"]), (b"b", ["b"]))
    store.shipping.set_cursor("b", "policy", p[1])  # c never connected: no cursor
    assert store.retention.trim() == 1
    assert [e.payload for e in store.shipping.read_client_log("policy", 0, 10)] == [b"b and c"]
    assert [e.payload for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == [
        b"b and c"
    ]


def test_a_slot_is_closed_by_a_trim_once_its_rotation_period_passed(store: QueueStore) -> None:
    """PostgreSQL retires whole slots, and the current one only once closed; SQLite rows."""
    p = append_apart(store, "policy", (b"1", ["b"]))
    store.shipping.set_cursor("b", "policy", p[0])
    store.retention.rotation_period = 3600.0
    assert store.retention.trim() == (0 if store.dialect == "postgresql" else 1)
    store.retention.rotation_period = 0.0
    store.retention.trim()
    assert store.shipping.read_client_log("policy", 0, 10) == []


def test_a_slot_limit_never_costs_an_entry_a_destination_needs(store: QueueStore) -> None:
    store.retention.max_slots = 2
    p = append_apart(store, "policy", *[(b"%d" % i, ["c"]) for i in range(5)])
    store.retention.trim()  # c acknowledged nothing: every slot is pinned
    assert _positions(store, "c") == p
    store.shipping.set_cursor("c", "policy", p[2])
    store.retention.trim()
    assert _positions(store, "c")[-2:] == p[3:]
