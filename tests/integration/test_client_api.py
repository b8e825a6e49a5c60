"""The application-facing client API: schema set-up, snapshot requests and their progress."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session

import lr_client
from lr_client import (
    InvalidInputError,
    InvalidNameError,
    RoutingQueueClient,
    SchemaState,
    SnapshotContext,
    SnapshotInfo,
    SnapshotProviderRunner,
    SnapshotStatus,
    create_engine,
)
from lr_client.records import ReplicationType
from lr_client.store import QueueStore, SQLAlchemyQueueStore
from tests.kit.apps import App, every_flavour
from tests.kit.sites import Sites
from tests.kit.wait import wait_for


@pytest.fixture
def client(store: QueueStore) -> RoutingQueueClient:
    c = RoutingQueueClient(store, "a", "policy")
    c.register_destinations(["b", "c"])
    return c


def test_create_schema_from_a_url_or_an_engine_without_a_store(db_url: str) -> None:
    assert lr_client.create_schema(db_url).state is SchemaState.EMPTY
    assert lr_client.create_schema(db_url).state is SchemaState.CURRENT  # idempotent
    engine = create_engine(db_url)
    try:
        client = RoutingQueueClient(engine, "a", "policy")
        assert client.create_schema().state is SchemaState.CURRENT
        client.register_destinations(["b"])  # the tables are there
        with engine.connect() as conn:  # the caller's engine stays open
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()


@pytest.fixture
def app(store: QueueStore, make_app: Callable[..., App]) -> App:
    """``client`` in the test's flavour (sync, or async on a driver)."""
    store.sites.register_sites(["b", "c"])
    assert isinstance(store, SQLAlchemyQueueStore)
    return make_app(store, "a", "policy")


@every_flavour()
def test_request_snapshot_sync_destination_first_warns_nothing(app: App, store: QueueStore) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sid = app.call("request_snapshot_sync", "b", reason="rebuild")
        with app.transaction() as tx:
            in_txn = tx.request_snapshot("c", reason="in my transaction")
        tx = app.open()
        try:
            rolled_back = tx.request_snapshot("c")
            tx.rollback()
        finally:
            tx.close()
    assert caught == []
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and (req.destination, req.reason) == ("b", "rebuild")
    assert in_txn == sid  # c joined b's snapshot, in the caller's transaction
    committed = store.snapshots.get_snapshot(in_txn, "c")
    assert committed is not None and committed.reason == "in my transaction"
    assert store.snapshots.get_snapshot(rolled_back) is None


def test_request_snapshot_sync_session_first_still_works_with_a_deprecation_warning(
    client: RoutingQueueClient, store: QueueStore
) -> None:
    with pytest.warns(DeprecationWarning, match=r"request_snapshot_sync\(destination"):
        sid = client.request_snapshot_sync(None, "b")  # type: ignore[call-overload]
    with Session(store.engine) as s, s.begin(), pytest.warns(DeprecationWarning):
        other = client.request_snapshot_sync(s, "c", "old style")
    first, second = store.snapshots.get_snapshot(sid, "b"), store.snapshots.get_snapshot(other, "c")
    assert first is not None and (first.destination, first.reason) == ("b", "application")
    assert second is not None and (second.destination, second.reason) == ("c", "old style")


@every_flavour()
def test_request_snapshot_sync_rejects_what_is_not_a_destination(app: App) -> None:
    with pytest.raises(InvalidInputError, match="destination must be a site id"):
        app.call("request_snapshot_sync", None)
    with pytest.raises(InvalidNameError):
        app.call("request_snapshot_sync", "Not A Site")
    assert app.call("snapshots") == []


@every_flavour()
def test_snapshots_lists_this_clients_requests_by_destination_and_state(
    app: App, store: QueueStore
) -> None:
    call = app.call
    first = call("request_snapshot_sync", "b", reason="one")
    second = call("request_snapshot_sync", "b", reason="two")  # supersedes the first
    to_c = call("request_snapshot_sync", "c", reason="three")
    assert to_c == second  # c joins b's snapshot: not started yet
    other = RoutingQueueClient(store, "a", "orders").request_snapshot_sync("b")
    every = call("snapshots")
    assert {x.snapshot_id for x in every} == {first, second}  # not the other client's
    assert [x.snapshot_id for x in call("snapshots", "b")] == [second, first]  # newest first
    by_id = {x.snapshot_id: x for x in call("snapshots", "b")}
    assert by_id[first].state is SnapshotStatus.CANCELLED and not by_id[first].is_open
    assert by_id[second].state is SnapshotStatus.REQUESTED and by_id[second].is_open
    assert by_id[second].reason == "two" and by_id[second].base_position is None
    assert by_id[second].created_at <= by_id[second].updated_at
    open_ones = call("snapshots", states=["requested", SnapshotStatus.RUNNING])
    assert sorted(x.snapshot_id for x in open_ones) == [second, second]  # b's and c's
    (for_c,) = call("snapshots", "c", states="requested")
    assert (for_c.snapshot_id, for_c.reason) == (second, "three")
    assert call("snapshot", second, "c") == for_c
    assert call("snapshot", second, "b") == by_id[second]
    whole = call("snapshot", second)
    assert whole is not None and whole.state is SnapshotStatus.REQUESTED
    assert whole.reason == "two"  # the snapshot's: its first request's
    assert call("snapshot", second, "d") is None  # not in it
    assert call("snapshot", other) is None  # another client's
    assert call("snapshot", "0" * 32) is None
    with pytest.raises(InvalidInputError, match="unknown snapshot state 'done'"):
        call("snapshots", states=["done"])
    with pytest.raises(InvalidNameError):
        call("snapshots", "B!")


def test_snapshot_progress_from_request_to_completed(sites: Sites) -> None:
    """Rows written, the base, then the rows the sink acknowledged, read from code."""
    src = sites.store("a")
    client = RoutingQueueClient(src, "a", "policy")
    client.register_destinations(["b"])
    with Session(src.engine) as s, s.begin():
        client.transmit_log_entry_message(s, b"before", ["b"])
    sid = client.request_snapshot_sync("b", reason="from code")

    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([b"r1", b"r2", b"r3"])

    runner = SnapshotProviderRunner(src, "policy", provide)
    assert runner.poll_once() == 1
    ready = client.snapshot(sid)
    assert ready is not None and ready.state is SnapshotStatus.READY
    assert (ready.rows_written, ready.rows_total, ready.rows_shipped) == (3, 3, 0)
    assert ready.base_position == src.send.head_position()

    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")
    stop = threading.Event()
    worker = threading.Thread(target=runner.run, args=(stop, 0.05))
    worker.start()
    try:
        wait_for(lambda: _state(client, sid) is SnapshotStatus.COMPLETED, timeout=60)
    finally:
        stop.set()
        worker.join()
    done = client.snapshot(sid)
    assert isinstance(done, SnapshotInfo)
    assert (done.rows_total, done.rows_shipped, done.reason) == (3, 3, "from code")
    assert done.base_position == ready.base_position and not done.is_open
    sink = sites.store("b")  # every snapshot entry reached the sink with the base
    (queue,) = sink.queues.list_queues("policy")
    with sink.read() as conn:
        head = sink.heads.read_head(conn, queue.queue_id, 100)
    snap = [e for e in head if e.type is not ReplicationType.LOG_ENTRY_SYNC]
    assert [e.payload for e in snap[:3]] == [b"r1", b"r2", b"r3"]
    assert {e.base_position for e in snap} == {ready.base_position}


def _state(client: RoutingQueueClient, sid: str) -> SnapshotStatus | None:
    info = client.snapshot(sid)
    return None if info is None else info.state
