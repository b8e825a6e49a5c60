"""Snapshots through real sessions and receivers: restarts, supersession, repeated full syncs."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from lr_client import RoutingQueueClient
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotContext, SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore
from lr_client.subscriber import RoutingQueueSubscriber
from tests.kit import kvapp
from tests.kit.sites import Sites
from tests.kit.wait import scaled, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


SMALL_BATCHES = "batch_max_entries = 10\nsnapshot_batch_max_entries = 10\nwindow_batches = 2"
#: 20 heartbeats of the runners below (every 0.1 s): room for a loaded machine.
STALL_TIMEOUT = 2.0
STALL = f"snapshot_stall_timeout = {STALL_TIMEOUT}"


def applied(store: SQLAlchemyQueueStore, kind: str) -> list[int]:
    """The positions the sink application applied, of one kind, in the order it applied them."""
    with store.read() as conn:
        rows = conn.execute(
            select(kvapp.applied.c.position)
            .where(kvapp.applied.c.kind == kind)
            .order_by(kvapp.applied.c.id)
        )
        return [r.position for r in rows]


class Loops:
    def __init__(self, *loops: object) -> None:
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=x.run, args=(self.stop,)) for x in loops]  # type: ignore[attr-defined]

    def __enter__(self) -> Loops:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(scaled(30))


def setup(sites: Sites) -> tuple[SQLAlchemyQueueStore, RoutingQueueClient, SQLAlchemyQueueStore]:
    src = sites.store("a")
    sink = sites.store("b")
    for st in (src, sink):
        kvapp.meta.create_all(st.engine)
    client = RoutingQueueClient(src, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    return src, client, sink


def test_sender_restarted_mid_snapshot_resumes_without_duplicates(sites: Sites) -> None:
    src, client, sink = setup(sites)
    for i in range(8):
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"])
    with src.engine.begin() as conn:  # state written before replication: only a snapshot has it
        conn.execute(kvapp.kv.insert(), [{"key": f"x{i}", "value": i} for i in range(3000)])
    listener = kvapp.KvListener()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    sites.start("b", sources=["a"])
    with Loops(runner):
        sites.start("a", dests=["b"], snapshot="app", replication=SMALL_BATCHES)
        wait_for(lambda: sink.recv.sink_progress("a", "policy").snapshot_position > 100, timeout=60)
        sites.stop("a")  # mid-transfer
        progress = sink.recv.sink_progress("a", "policy")
        assert progress.snapshot_position < 3000
        # The rest in batches of the default size: the restarted session resumes from
        # the position the sink holds, whatever batches came before.
        sites.start("a", dests=["b"], snapshot="app")
        with Loops(subscriber):
            wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=60)
    (snap,) = src.snapshots.list_snapshots("b", "policy")
    assert snap.status is SnapshotStatus.COMPLETED
    # resumed, not restarted: each snapshot entry was delivered exactly once, in order
    assert snap.entry_count == 3008
    assert applied(sink, "snapshot") == list(range(1, snap.entry_count + 1))
    assert len(listener.full_syncs) == 1


def test_superseded_snapshot_delivers_nothing_of_itself(sites: Sites) -> None:
    src, client, sink = setup(sites)
    kvapp.write(src.engine, client, {"k": 1}, ["b"])
    first = src.snapshots.request_snapshot(None, "b", "policy", "operator")
    src.snapshots.start_snapshot(first)
    with src.write() as conn:
        src.snapshot_entries.write_snapshot_entries(conn, first, 0, [kvapp.encode("stale", 666)])
    src.snapshot_entries.finish_snapshot(first)  # READY, but the sink is not up yet
    second = client.request_snapshot_sync("b")
    old = src.snapshots.get_snapshot(first)
    assert old is not None and old.status is SnapshotStatus.CANCELLED
    listener = kvapp.KvListener()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")
    with Loops(runner, subscriber):
        wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=60)
    assert listener.full_syncs == [second]
    assert "stale" not in kvapp.table(sink.engine)


def test_three_successive_full_syncs_deliver_five_each(sites: Sites) -> None:
    src, client, sink = setup(sites)
    for i in range(5):
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"])
    got: dict[str, list[tuple[int, bytes]]] = {}  # snapshot id -> (ordinal, payload) delivered

    class Counting(kvapp.KvListener):
        def process_full_sync(self, session, source_id, messages):  # type: ignore[no-untyped-def]
            sid = messages[0].snapshot_id
            got.setdefault(sid, []).extend((m.source_position, m.payload) for m in messages)
            return super().process_full_sync(session, source_id, messages)

    listener = Counting()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")
    with Loops(runner, subscriber):
        for round_ in range(3):
            wait_for(lambda round_=round_: len(listener.full_syncs) == round_ + 1, timeout=60)
            wait_for(
                lambda: all(
                    s.status is SnapshotStatus.COMPLETED
                    for s in src.snapshots.list_snapshots("b", "policy")
                )
            )
            wait_for(
                lambda round_=round_: (
                    len(got) == round_ + 1
                    and all(
                        sink.queues.queue_depth(q.queue_id) == 0 for q in sink.queues.list_queues()
                    )
                ),
                timeout=60,
            )
            if round_ < 2:
                client.request_snapshot_sync("b", reason="operator asked")
    # Each full sync delivered the five rows once each, in the provider's order.
    rows = [(i + 1, kvapp.encode(f"k{i}", i)) for i in range(5)]
    assert listener.full_syncs == list(got)
    assert list(got.values()) == [rows, rows, rows]
    snapshots = src.snapshots.list_snapshots("b", "policy")
    assert sorted(s.snapshot_id for s in snapshots) == sorted(got)


def provide_none(ctx: SnapshotContext) -> None:
    """A provider with nothing to send: an empty full sync."""


def test_zero_row_snapshot(sites: Sites) -> None:
    src, client, sink = setup(sites)
    listener = kvapp.KvListener()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, "policy", provide_none)
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")
    with Loops(runner, subscriber):
        wait_for(lambda: len(listener.full_syncs) == 1, timeout=60)
        kvapp.write(src.engine, client, {"after": 1}, ["b"])
        wait_for(lambda: kvapp.table(sink.engine) == {"after": 1}, timeout=60)
    # The empty snapshot applied nothing; the one log entry after it applied once.
    assert (applied(sink, "snapshot"), applied(sink, "log")) == ([], [src.send.head_position()])


def test_a_snapshot_whose_provider_died_is_replaced(sites: Sites) -> None:
    """A provider took the request and went silent: the session fails it and asks again."""
    src, client, sink = setup(sites)
    for i in range(5):
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"])
    dead = src.snapshots.request_snapshot(None, "b", "policy", "first contact")
    src.snapshots.start_snapshot(dead)  # taken by a provider that then crashed: no heartbeat
    with src.write() as conn:
        src.snapshot_entries.write_snapshot_entries(
            conn, dead, 0, [kvapp.encode("half-written", 1)]
        )
    listener = kvapp.KvListener()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(
        src, "policy", kvapp.provider(src.engine), heartbeat_interval=0.1
    )
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app", replication=STALL)
    with Loops(runner, subscriber):
        wait_for(
            lambda: src.snapshots.get_snapshot(dead).status is SnapshotStatus.FAILED,  # type: ignore[union-attr]
            timeout=30,
        )
        wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=60)
    failed = src.snapshots.get_snapshot(dead)
    assert failed is not None and "heartbeat" in failed.reason
    assert src.snapshot_entries.count_snapshot_entries(dead) == 0
    (done,) = src.snapshots.list_snapshots("b", "policy", [SnapshotStatus.COMPLETED])
    assert listener.full_syncs == [done.snapshot_id]
    assert "half-written" not in kvapp.table(sink.engine)


def test_a_slow_provider_keeps_its_snapshot_by_heartbeat(sites: Sites) -> None:
    """Silent in its writes for longer than the timeout, but its runner beats: kept."""
    src, client, sink = setup(sites)
    kvapp.write(src.engine, client, {"k": 1}, ["b"])
    slow = kvapp.provider(src.engine)

    def beaten_for(sid: str, since: float, seconds: float) -> bool:
        req = src.snapshots.get_snapshot(sid)
        return req is not None and req.updated_at >= since + seconds

    def provide(ctx: SnapshotContext) -> None:
        # A long source query: nothing written until the runner's heartbeats have kept
        # the request alive for twice the stall timeout.
        since = ctx.request.updated_at
        wait_for(
            lambda: beaten_for(ctx.request.snapshot_id, since, 2 * STALL_TIMEOUT),
            60,
            what="heartbeats for two stall timeouts",
        )
        slow(ctx)

    listener = kvapp.KvListener()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, "policy", provide, heartbeat_interval=0.1)
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app", replication=STALL)
    with Loops(runner, subscriber):
        wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=60)
        # Applied at the sink first; completed once the sink's acknowledgement is back.
        wait_for(
            lambda: (
                [x.status for x in src.snapshots.list_snapshots("b", "policy")]
                == [SnapshotStatus.COMPLETED]
            ),
            timeout=30,
            what="the one snapshot completed",
        )
    assert len(listener.full_syncs) == 1
