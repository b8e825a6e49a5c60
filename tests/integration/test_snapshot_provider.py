"""In-process snapshot providers, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from lr_client import SnapshotContext, SnapshotProviderRunner
from lr_client.errors import (
    InvalidPartitionKeyError,
    InvalidPayloadError,
    PayloadTooLargeError,
    SnapshotError,
)
from lr_client.records import ReplicationType, SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.wait import join, wait_event, wait_for


def _entries(store: SQLAlchemyQueueStore, snapshot_id: str) -> list[tuple[ReplicationType, bytes]]:
    return [
        (e.type, e.payload)
        for e in store.snapshot_entries.read_snapshot_entries(snapshot_id, 0, 10_000)
    ]


def _status(store: SQLAlchemyQueueStore, snapshot_id: str) -> SnapshotStatus:
    req = store.snapshots.get_snapshot(snapshot_id)
    assert req is not None
    return req.status


def test_provider_writes_entries_and_completes(store: SQLAlchemyQueueStore) -> None:
    seen: list[SnapshotContext] = []

    def provide(ctx: SnapshotContext) -> None:
        seen.append(ctx)
        assert ctx.transmit([b"a", b"b"]) == 2
        assert ctx.transmit(iter([b"c", bytearray(b"d"), b"e"])) == 3
        assert ctx.progress == 5

    sid = store.snapshots.request_snapshot(None, "b", "policy", "test")
    runner = SnapshotProviderRunner(store, "policy", provide, chunk_size=2)
    assert runner.poll_once() == 1
    assert runner.poll_once() == 0  # nothing left to do
    ctx = seen[0]
    assert (ctx.snapshot_id, ctx.destination, ctx.client_name) == (sid, "b", "policy")
    assert ctx.completed and ctx.entry_count == 5
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.READY
    assert req.entry_count == 5 and req.rows_written == 5
    assert _entries(store, sid) == [
        (ReplicationType.SNAPSHOT_SYNC, b"a"),
        (ReplicationType.SNAPSHOT_SYNC, b"b"),
        (ReplicationType.SNAPSHOT_SYNC, b"c"),
        (ReplicationType.SNAPSHOT_SYNC, b"d"),
        (ReplicationType.SNAPSHOT_SYNC, b"e"),
        (ReplicationType.LAST_FULL_SYNC_ENTRY, b"5"),
    ]


def test_base_position_is_fixed_at_start(store: SQLAlchemyQueueStore) -> None:
    nums = store.sites.register_sites(["b"])
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]]), (b"y", [nums["b"]])])
    bases: list[int] = []
    store.snapshots.request_snapshot(None, "b", "policy")
    SnapshotProviderRunner(store, "policy", lambda ctx: bases.append(ctx.base_position)).poll_once()
    assert bases == [store.send.head_position()]


def test_explicit_parts_are_rewritable(store: SQLAlchemyQueueStore) -> None:
    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"p1-0", b"p1-1"], part=1)
        ctx.transmit([b"p1-0", b"p1-1"], part=1)  # a retried part replaces itself
        ctx.transmit([b"p2-0"], part=2)
        with pytest.raises(ValueError):
            ctx.transmit([b"x"], part=0)
        ctx.mark_completed()

    sid = store.snapshots.request_snapshot(None, "b", "policy")
    SnapshotProviderRunner(store, "policy", provide).poll_once()
    assert [p for _, p in _entries(store, sid)] == [b"p1-0", b"p1-1", b"p2-0", b"3"]


def test_only_its_client_and_destinations(store: SQLAlchemyQueueStore) -> None:
    other = store.snapshots.request_snapshot(None, "b", "inventory")
    mine_c = store.snapshots.request_snapshot(None, "c", "policy")
    done: list[str] = []
    runner = SnapshotProviderRunner(
        store, "policy", lambda ctx: done.append(ctx.destination), destinations=["b"]
    )
    assert runner.poll_once() == 0  # c's only
    assert _status(store, mine_c) == SnapshotStatus.REQUESTED
    # b joins c's: the runner of b's writes the shared snapshot once, for both.
    assert store.snapshots.request_snapshot(None, "b", "policy") == mine_c
    assert runner.poll_once() == 1
    assert done == ["c"]
    assert _status(store, mine_c) == SnapshotStatus.READY
    assert _status(store, other) == SnapshotStatus.REQUESTED


def test_superseded_snapshot_stops_and_delivers_nothing(store: SQLAlchemyQueueStore) -> None:
    newer: list[str] = []
    stopped_early: list[bool] = []

    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"old-1", b"old-2"])
        if not newer:  # a new request for the same stream arrives mid-snapshot
            newer.append(ctx.store.snapshots.request_snapshot(None, "b", "policy", "operator"))
        stopped_early.append(ctx.is_cancelled())
        with pytest.raises(SnapshotError):
            ctx.transmit([b"old-3"])
        raise SnapshotError("gave up")

    old = store.snapshots.request_snapshot(None, "b", "policy")
    runner = SnapshotProviderRunner(store, "policy", provide)
    assert runner.poll_once() == 1  # a superseded snapshot is not a failure
    assert stopped_early == [True]
    assert _status(store, old) == SnapshotStatus.CANCELLED
    assert store.snapshot_entries.read_snapshot_entries(old, 0, 100) == []
    assert store.snapshot_entries.count_snapshot_entries(old) == 0
    # The new request is served next, and has nothing of the old one.
    runner.provider = lambda ctx: ctx.transmit([b"new"]) and None
    assert runner.poll_once() == 1
    assert _entries(store, newer[0]) == [
        (ReplicationType.SNAPSHOT_SYNC, b"new"),
        (ReplicationType.LAST_FULL_SYNC_ENTRY, b"1"),
    ]


def test_provider_returning_after_supersession_completes_nothing(
    store: SQLAlchemyQueueStore,
) -> None:
    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"old"])
        ctx.store.snapshots.request_snapshot(None, "b", "policy")
        # Returns without noticing: the runner must not complete the old snapshot.

    old = store.snapshots.request_snapshot(None, "b", "policy")
    runner = SnapshotProviderRunner(store, "policy", provide)
    assert runner.poll_once() == 1
    assert _status(store, old) == SnapshotStatus.CANCELLED
    assert store.snapshot_entries.count_snapshot_entries(old) == 0
    assert store.snapshot_entries.read_snapshot_entries(old, 0, 100) == []


def test_three_successive_full_syncs_of_five(store: SQLAlchemyQueueStore) -> None:
    payloads = [f"row-{i}".encode() for i in range(5)]
    runner = SnapshotProviderRunner(store, "policy", lambda ctx: ctx.transmit(payloads) and None)
    for _ in range(3):
        sid = store.snapshots.request_snapshot(None, "b", "policy")
        assert runner.poll_once() == 1
        entries = _entries(store, sid)
        assert [p for t, p in entries if t == ReplicationType.SNAPSHOT_SYNC] == payloads
        assert entries[-1] == (ReplicationType.LAST_FULL_SYNC_ENTRY, b"5")
        assert store.snapshot_entries.count_snapshot_entries(sid) == 5
        store.snapshots.complete_snapshot(sid)  # what the sender session does once the sink has it


def test_failure_marks_failed_and_releases(store: SQLAlchemyQueueStore) -> None:
    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"a", b"b"])
        raise RuntimeError("source database went away")

    sid = store.snapshots.request_snapshot(None, "b", "policy")
    runner = SnapshotProviderRunner(store, "policy", provide)
    with pytest.raises(RuntimeError, match="went away"):
        runner.poll_once()
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.FAILED
    assert "went away" in req.reason
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    # Logged, not raised, when asked so (as run() does).
    sid2 = store.snapshots.request_snapshot(None, "b", "policy")
    assert runner.poll_once(raise_errors=False) == 1
    assert _status(store, sid2) == SnapshotStatus.FAILED


def test_bad_payloads_are_rejected_before_writing(store: SQLAlchemyQueueStore) -> None:
    def provide(ctx: SnapshotContext) -> None:
        with pytest.raises(InvalidPayloadError):
            ctx.transmit([b"ok", "not bytes"])  # type: ignore[list-item]
        with pytest.raises(InvalidPayloadError):
            ctx.transmit(b"a single payload")
        assert ctx.progress == 0
        ctx.transmit([b"ok"])

    sid = store.snapshots.request_snapshot(None, "b", "policy")
    SnapshotProviderRunner(store, "policy", provide).poll_once()
    assert [p for _, p in _entries(store, sid)] == [b"ok", b"1"]

    runner = SnapshotProviderRunner(
        store, "policy", lambda ctx: ctx.transmit([b"12345"]) and None, max_payload_bytes=4
    )
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    with pytest.raises(PayloadTooLargeError):
        runner.poll_once()
    assert _status(store, sid) == SnapshotStatus.FAILED


def test_provider_cancel_and_context_rules(store: SQLAlchemyQueueStore) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    req = store.snapshots.get_snapshot(sid)
    assert req is not None
    with pytest.raises(SnapshotError):  # not started yet
        SnapshotContext(store, req)

    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"a"])
        ctx.cancel("nothing to send after all")
        assert ctx.is_cancelled()

    SnapshotProviderRunner(store, "policy", provide).poll_once()
    assert _status(store, sid) == SnapshotStatus.CANCELLED
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0

    def twice(ctx: SnapshotContext) -> None:
        assert ctx.mark_completed() == 0
        assert ctx.mark_completed() == 0
        with pytest.raises(SnapshotError):
            ctx.transmit([b"late"])

    sid = store.snapshots.request_snapshot(None, "b", "policy")
    SnapshotProviderRunner(store, "policy", twice).poll_once()
    assert _entries(store, sid) == [(ReplicationType.LAST_FULL_SYNC_ENTRY, b"0")]


def test_run_serves_requests_until_stopped(store: SQLAlchemyQueueStore) -> None:
    stop = threading.Event()
    served = threading.Event()

    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"x"])
        served.set()

    runner = SnapshotProviderRunner(store, "policy", provide)
    thread = threading.Thread(target=runner.run, args=(stop, 0.02))
    thread.start()
    try:
        sid = store.snapshots.request_snapshot(None, "b", "policy")
        wait_event(served, 30, what="the provider called")
        wait_for(lambda: _status(store, sid) == SnapshotStatus.READY, 30, what="the end marker")
    finally:
        stop.set()
        join(thread, 30)


def test_snapshot_rows_carry_partition_keys(store: SQLAlchemyQueueStore) -> None:
    def provide(ctx: SnapshotContext) -> None:
        with pytest.raises(InvalidPartitionKeyError):
            ctx.transmit([(b"ok", b"k"), (b"bad", b"")])  # nothing of this call written
        assert ctx.transmit([(b"a", b"ka"), b"b", (b"c", "kc")]) == 3
        assert ctx.transmit(iter([(b"d", None), (b"e", b"ke")])) == 2

    sid = store.snapshots.request_snapshot(None, "b", "policy")
    SnapshotProviderRunner(store, "policy", provide, chunk_size=2).poll_once()
    found = [(e.payload, e.key) for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 100)]
    assert found == [
        (b"a", b"ka"),
        (b"b", None),
        (b"c", b"kc"),
        (b"d", None),
        (b"e", b"ke"),
        (b"5", None),  # the end marker
    ]
