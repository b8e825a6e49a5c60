"""The queue store contract, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from lr_client.errors import SchemaError
from lr_client.records import ReplicationType, SnapshotStatus, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, lifecycle, open_store
from lr_client.store import schema as s


def _append(store: SQLAlchemyQueueStore, client: str, *rows: tuple[bytes, list[str]]) -> list[int]:
    nums = store.register_sites(sorted({d for _, ds in rows for d in ds}))
    with store.write() as conn:
        return store.append_log_entries(
            conn, client, [(p, [nums[d] for d in ds]) for p, ds in rows]
        )


def test_schema_is_checked(db_url: str) -> None:
    store = open_store(create_engine(db_url))
    try:
        with pytest.raises(SchemaError, match="no schema; `lr init-db` creates"):
            store.check_schema()  # an empty database
        store.create_schema()
        store.check_schema()
        p = _append(store, "policy", (b"1", ["b"]))
        store.create_schema()  # idempotent: what is there stays
        store.check_schema()
        assert [e.position for e in store.read_log_entries("b", "policy", 0, 10)] == p
        with store.write() as conn:  # as a newer release would leave it
            conn.execute(text(f"UPDATE {lifecycle.VERSION_TABLE} SET version_num = 'ffff'"))
        with pytest.raises(SchemaError, match="revision ffff is newer than this release"):
            store.check_schema()
    finally:
        store.engine.dispose()


def test_positions_are_monotonic_and_reads_are_per_tag(store: SQLAlchemyQueueStore) -> None:
    p = _append(store, "policy", (b"1", ["b", "c"]), (b"2", ["b"]), (b"3", ["c"]), (b"4", ["d"]))
    assert p == sorted(p) and len(set(p)) == 4
    assert [e.payload for e in store.read_log_entries("b", "policy", 0, 10)] == [b"1", b"2"]
    assert [e.payload for e in store.read_log_entries("c", "policy", 0, 10)] == [b"1", b"3"]
    assert [e.payload for e in store.read_log_entries("c", "policy", p[0], 10)] == [b"3"]
    assert store.read_log_entries("c", "other", 0, 10) == []
    assert store.read_log_entries("unknown", "policy", 0, 10) == []
    assert store.head_position() == p[-1]


def test_read_limits(store: SQLAlchemyQueueStore) -> None:
    _append(store, "policy", *[(bytes(100), ["b"]) for _ in range(10)])
    assert len(store.read_log_entries("b", "policy", 0, 3)) == 3
    assert len(store.read_log_entries("b", "policy", 0, 10, max_bytes=300)) == 2
    assert len(store.read_log_entries("b", "policy", 0, 10, max_bytes=1)) == 1  # never empty


def test_payload_stored_once_whatever_the_destinations(store: SQLAlchemyQueueStore) -> None:
    dests = [f"s{i}" for i in range(8)]
    _append(store, "policy", (b"x" * 1024, dests))
    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(s.send_log_entries)).scalar() == 1
    for d in dests:
        assert [e.payload for e in store.read_log_entries(d, "policy", 0, 10)] == [b"x" * 1024]


def test_rollback_leaves_nothing(store: SQLAlchemyQueueStore) -> None:
    nums = store.register_sites(["b"])
    conn = store.engine.connect()
    tx = conn.begin()
    store.append_log_entries(conn, "policy", [(b"x", [nums["b"]])])
    tx.rollback()
    conn.close()
    assert store.read_log_entries("b", "policy", 0, 10) == []


def test_cursors_and_backlog(store: SQLAlchemyQueueStore) -> None:
    p = _append(store, "policy", (b"ab", ["b"]), (b"cde", ["b"]))
    assert store.get_cursor("b", "policy").position == 0
    assert store.backlog("b", "policy").entries == 2
    assert store.backlog("b", "policy").bytes == 5
    store.set_cursor("b", "policy", p[0])
    assert store.get_cursor("b", "policy").position == p[0]
    assert store.backlog("b", "policy").entries == 1


def test_trim_keeps_what_a_destination_needs(store: SQLAlchemyQueueStore) -> None:
    p = _append(store, "policy", (b"1", ["b", "c"]), (b"2", ["b"]), (b"3", ["c"]))
    store.set_cursor("b", "policy", p[2])
    assert store.trim() == 1  # only 2: 1 and 3 still wait for c
    assert [e.payload for e in store.read_log_entries("c", "policy", 0, 10)] == [b"1", b"3"]
    store.set_cursor("c", "policy", p[0])
    assert store.trim() == 1
    assert store.oldest_position() == p[2]
    # positions are never reused after a trim
    store.set_cursor("c", "policy", p[2])
    store.trim()
    assert _append(store, "policy", (b"4", ["b"]))[0] > p[2]


def test_drop_releases_backlog(store: SQLAlchemyQueueStore) -> None:
    _append(store, "policy", (b"1", ["b", "c"]), (b"2", ["c"]))
    store.register_sites(["b"])
    drop = store.drop_stream("c", "policy", "too far behind")
    assert drop is not None and drop.first_dropped_position == 1
    assert store.get_cursor("c", "policy").needs_snapshot
    store.set_cursor("c", "policy", 1)  # a late log ack keeps the flag
    assert store.get_cursor("c", "policy").needs_snapshot
    store.set_cursor("b", "policy", 10)
    assert store.trim() == 2
    assert [d.destination for d in store.list_drops()] == ["c"]
    store.clear_drop("c", "policy")
    assert store.list_drops() == []


def test_snapshot_lifecycle_is_idempotent(store: SQLAlchemyQueueStore) -> None:
    store.register_sites(["b"])
    sid = store.request_snapshot(None, "b", "policy")
    req = store.start_snapshot(sid)
    assert req is not None and req.status is SnapshotStatus.RUNNING
    assert store.start_snapshot(sid) is None
    with store.write() as conn:
        store.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])
        store.write_snapshot_entries(conn, sid, 1, [b"c"])
    with store.write() as conn:  # a retried part replaces itself
        store.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])
    assert store.read_snapshot_entries(sid, 0, 10) == []  # not ready yet
    assert store.finish_snapshot(sid) == 3
    entries = store.read_snapshot_entries(sid, 0, 10)
    assert [e.payload for e in entries[:-1]] == [b"a", b"b", b"c"]
    assert entries[-1].type is ReplicationType.LAST_FULL_SYNC_ENTRY
    assert [e.position for e in entries] == [1, 2, 3, 4]
    assert [e.payload for e in store.read_snapshot_entries(sid, 2, 10)] == [b"c", b"3"]


def test_new_request_cancels_the_open_one(store: SQLAlchemyQueueStore) -> None:
    first = store.request_snapshot(None, "b", "policy")
    store.start_snapshot(first)
    second = store.request_snapshot(None, "b", "policy")
    old = store.get_snapshot(first)
    assert old is not None and old.status is SnapshotStatus.CANCELLED
    assert store.read_snapshot_entries(first, 0, 10) == []
    new = store.get_snapshot(second)
    assert new is not None and new.status is SnapshotStatus.REQUESTED


def test_receiver_is_idempotent_and_registers_queue(store: SQLAlchemyQueueStore) -> None:
    batch = [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p) for p in (3, 5, 9)]
    assert store.apply_log_batch("site-a", "policy", batch) == (True, 9)
    assert store.apply_log_batch("site-a", "policy", batch) == (False, 9)
    more = [*batch, WireEntry(11, ReplicationType.LOG_ENTRY_SYNC, b"11")]
    assert store.apply_log_batch("site-a", "policy", more) == (True, 11)
    (queue,) = store.list_queues("policy")
    assert queue.queue_name == "LRQ_Recv_policy__site-a"
    with store.read() as conn:
        got = store.read_queue(conn, queue.queue_id, 10)
    assert [e.source_position for e in got] == [3, 5, 9, 11]
    assert store.sink_progress("site-a", "policy").last_position == 11


def test_sources_get_separate_queues(store: SQLAlchemyQueueStore) -> None:
    e = [WireEntry(1, ReplicationType.LOG_ENTRY_SYNC, b"x")]
    store.apply_log_batch("a-b", "c", e)
    store.apply_log_batch("a", "b-c", e)
    names = sorted(q.queue_name for q in store.list_queues())
    assert names == ["LRQ_Recv_b-c__a", "LRQ_Recv_c__a-b"]


def test_sink_snapshot_supersedes_and_sets_base(store: SQLAlchemyQueueStore) -> None:
    snap = ReplicationType.SNAPSHOT_SYNC
    store.apply_snapshot_batch("a", "policy", "s1", [WireEntry(1, snap, b"old", "s1")])
    store.apply_snapshot_batch("a", "policy", "s2", [WireEntry(1, snap, b"new", "s2")])
    end = WireEntry(2, ReplicationType.LAST_FULL_SYNC_ENTRY, b"1", "s2", 1, base_position=42)
    assert store.apply_snapshot_batch("a", "policy", "s2", [end]) == (True, 2)
    (queue,) = store.list_queues()
    with store.read() as conn:
        got = store.read_queue(conn, queue.queue_id, 10)
    assert [(e.payload, e.snapshot_id) for e in got] == [(b"new", "s2"), (b"1", "s2")]
    progress = store.sink_progress("a", "policy")
    assert progress.last_position == 42 and progress.snapshot_id == "s2"
    # a replayed batch of the completed snapshot is not applied again
    assert store.apply_snapshot_batch("a", "policy", "s2", [end])[0] is False


def test_heartbeat_keeps_a_running_snapshot_alive(store: SQLAlchemyQueueStore) -> None:
    sid = store.request_snapshot(None, "b", "policy")
    assert not store.heartbeat_snapshot(sid)  # REQUESTED: no worker to hear from
    store.start_snapshot(sid)
    before = store.get_snapshot(sid)
    assert before is not None
    assert store.heartbeat_snapshot(sid)
    after = store.get_snapshot(sid)
    assert after is not None and after.updated_at >= before.updated_at
    # Heard of after `silent_since`: not stalled.
    assert not store.fail_stalled_snapshot(sid, after.updated_at - 1.0, "stalled")
    assert store.get_snapshot(sid).status is SnapshotStatus.RUNNING  # type: ignore[union-attr]


def test_a_silent_running_snapshot_is_failed_and_released(store: SQLAlchemyQueueStore) -> None:
    store.register_sites(["b"])
    sid = store.request_snapshot(None, "b", "policy")
    store.start_snapshot(sid)
    with store.write() as conn:
        store.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])
    req = store.get_snapshot(sid)
    assert req is not None
    assert store.fail_stalled_snapshot(sid, req.updated_at + 1.0, "no heartbeat")
    failed = store.get_snapshot(sid)
    assert failed is not None and failed.status is SnapshotStatus.FAILED
    assert failed.reason == "no heartbeat"
    assert store.count_snapshot_entries(sid) == 0
    assert not store.heartbeat_snapshot(sid)
    # Only RUNNING requests are failed.
    assert not store.fail_stalled_snapshot(sid, req.updated_at + 1.0, "again")
    other = store.request_snapshot(None, "b", "policy")
    assert not store.fail_stalled_snapshot(other, req.updated_at + 3600, "requested")
    assert store.get_snapshot(other).status is SnapshotStatus.REQUESTED  # type: ignore[union-attr]


def test_snapshot_reads_continue_and_resume_in_order(store: SQLAlchemyQueueStore) -> None:
    """Reading on from the last read, or resuming anywhere, gives the same ordinals."""
    store.register_sites(["b"])
    sid = store.request_snapshot(None, "b", "policy")
    store.start_snapshot(sid)
    parts = {0: 7, 1: 5, 3: 9}  # part -> entries; parts need not be contiguous
    with store.write() as conn:
        for part, n in parts.items():
            store.write_snapshot_entries(conn, sid, part, [b"%d-%d" % (part, i) for i in range(n)])
    assert store.finish_snapshot(sid) == 21
    every = store.read_snapshot_entries(sid, 0, 100)
    expected = [b"%d-%d" % (p, i) for p, n in parts.items() for i in range(n)] + [b"21"]
    assert [e.payload for e in every] == expected
    assert every[-1].type is ReplicationType.LAST_FULL_SYNC_ENTRY
    # Continuing from where each read ended, 4 at a time (across parts and the end).
    got, after = [], 0
    while batch := store.read_snapshot_entries(sid, after, 4):
        assert [e.position for e in batch] == list(range(after + 1, after + len(batch) + 1))
        got += batch
        after = batch[-1].position
    assert [e.payload for e in got] == expected
    # Resuming at any ordinal (a reconnect), then continuing from there.
    for start in (0, 3, 7, 12, 20, 21):
        first = store.read_snapshot_entries(sid, start, 3)
        rest = store.read_snapshot_entries(sid, start + len(first), 100)
        assert [e.payload for e in first + rest] == expected[start:]
    # A byte limit cuts a read short; the next read continues after what was returned.
    short = store.read_snapshot_entries(sid, 0, 100, max_bytes=40)
    assert 0 < len(short) < 22
    more = store.read_snapshot_entries(sid, len(short), 100)
    assert [e.payload for e in short + more] == expected
