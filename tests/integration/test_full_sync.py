"""Full sync end to end: snapshot then log entries, drops, backpressure.

Real gRPC between in-process sites, an in-process snapshot provider at the
source, a subscriber applying to the sink's own table; on both backends.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import func, select

from lr_client import BackpressureError, RoutingQueueClient
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from lr_client.subscriber import RoutingQueueSubscriber
from tests.kit import kvapp
from tests.kit.sites import Sites
from tests.kit.wait import scaled, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


RETENTION = "[retention]\nmax_entries = 40\ntrim_interval = 0.1\nrotation_period = 0.5\n"


@contextmanager
def running(*loops: object) -> Iterator[threading.Event]:
    """Run ``loop.run(stop)`` of each object in a thread until the block ends."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop.run, args=(stop,), daemon=True) for loop in loops]  # type: ignore[attr-defined]
    for t in threads:
        t.start()
    try:
        yield stop
    finally:
        stop.set()
        for t in threads:
            t.join(scaled(30))


def source_app(
    sites: Sites, site: str, dests: list[str]
) -> tuple[SQLAlchemyQueueStore, RoutingQueueClient]:
    store = sites.store(site)
    kvapp.meta.create_all(store.engine)
    client = RoutingQueueClient(store, source_id=site, client_name="policy", backpressure="ignore")
    client.register_destinations(dests)
    return store, client


def sink_app(
    sites: Sites, site: str
) -> tuple[SQLAlchemyQueueStore, RoutingQueueSubscriber, kvapp.KvListener]:
    store = sites.store(site)
    kvapp.meta.create_all(store.engine)
    listener = kvapp.KvListener()
    sub = RoutingQueueSubscriber(store, "policy", listener, poll_interval=0.02)
    return store, sub, listener


def test_first_contact_snapshot_then_log_entries_while_writing(sites: Sites) -> None:
    src, client = source_app(sites, "a", ["b"])
    for i in range(50):
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"])
    sink, sub, listener = sink_app(sites, "b")
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    rng = random.Random(7)

    def writer() -> None:
        for i in range(150):
            kvapp.write(src.engine, client, {f"k{rng.randrange(80)}": 1000 + i}, ["b"])

    with running(runner, sub):
        w = threading.Thread(target=writer)
        w.start()
        w.join()
        wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=60)
    assert len(listener.full_syncs) == 1
    (snap,) = src.snapshots.list_snapshots("b", "policy")
    assert snap.status is SnapshotStatus.COMPLETED and snap.entry_count is not None
    with sink.read() as conn:
        kinds = [r.kind for r in conn.execute(select(kvapp.applied).order_by(kvapp.applied.c.id))]
    first_log = kinds.index("log") if "log" in kinds else len(kinds)
    assert kinds[:first_log] == ["snapshot"] * snap.entry_count
    assert "snapshot" not in kinds[first_log:]
    assert listener.errors == []


def test_down_destination_is_dropped_then_fully_synced(sites: Sites) -> None:
    healthy = ["c", "d", "e"]
    dests = ["b", *healthy]
    src, client = source_app(sites, "a", dests)
    sinks = {}
    for site in dests:
        sinks[site] = sink_app(sites, site)
    for site in healthy:
        sites.start(site, sources=["a"])
    sites.start("a", dests=dests, snapshot="app", extra=RETENTION)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    sizes: list[int] = []

    def queue_size() -> int:
        with src.read() as conn:
            return int(
                conn.execute(select(func.count()).select_from(s.send_log_entries)).scalar_one()
            )

    with running(runner, *(sinks[x][1] for x in dests)):
        for i in range(300):
            kvapp.write(src.engine, client, {f"k{i % 60}": i}, dests)
            if i % 20 == 0:
                sizes.append(queue_size())
        # b was dropped (its backlog released) and the queue stayed bounded
        wait_for(lambda: any(d.destination == "b" for d in src.retention.list_drops()), timeout=30)
        assert max(sizes) < 300
        wait_for(lambda: queue_size() < 100, timeout=30)
        for site in healthy:
            wait_for(
                lambda site=site: kvapp.table(sinks[site][0].engine) == kvapp.table(src.engine)
            )
        # b comes back: full sync, then later entries, in order
        sites.start("b", sources=["a"])
        wait_for(lambda: kvapp.table(sinks["b"][0].engine) == kvapp.table(src.engine), timeout=60)
        for i in range(20):
            kvapp.write(src.engine, client, {f"k{i}": 5000 + i}, dests)
        wait_for(lambda: kvapp.table(sinks["b"][0].engine) == kvapp.table(src.engine), timeout=60)
        # On a loaded machine a healthy destination can fall 40 entries behind the write
        # loop too: it is dropped and fully synced the same way, and its record goes then.
        wait_for(
            lambda: src.retention.list_drops() == [], timeout=60, what="every drop record gone"
        )
    assert sinks["b"][2].full_syncs
    assert src.shipping.get_cursor("b", "policy").needs_snapshot is False


def test_majority_down_applies_backpressure_until_they_recover(sites: Sites) -> None:
    dests = ["b", "c", "d"]
    src = sites.store("a")
    # Every transmit reads the flow state (no cache), so the first one after
    # backpressure turns on in the store is refused, however fast the loop runs.
    client = RoutingQueueClient(
        src, source_id="a", client_name="policy", backpressure="raise", flow_check_interval=0.0
    )
    client.register_destinations(dests)
    sites.start("d", sources=["a"])
    sites.start("a", dests=dests, snapshot="none", extra=RETENTION)
    sent = 0
    with pytest.raises(BackpressureError):
        for _ in range(500):
            with src.engine.begin() as conn:
                client.transmit_log_entry_message(conn, b"x", dests)
            sent += 1
            if sent > 60:
                wait_for(lambda: src.send.flow_state("policy")[0], timeout=10)
    assert src.retention.list_drops() == []  # a majority is never dropped
    sites.start("b", sources=["a"])
    sites.start("c", sources=["a"])
    wait_for(lambda: not src.send.flow_state("policy")[0], timeout=60)
    with src.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"after", dests)
    # Everything accepted reaches every destination once, in order, the last one too.
    expected = [b"x"] * sent + [b"after"]
    wait_for(lambda: all(queued(sites.store(d)) == expected for d in dests), timeout=60)


def queued(sink: SQLAlchemyQueueStore) -> list[bytes]:
    """The payloads waiting in a sink's receive queue from source ``a``."""
    queues = [q for q in sink.queues.list_queues("policy") if q.source_id == "a"]
    if not queues:
        return []
    with sink.read() as conn:
        return [e.payload for e in sink.queues.read_queue(conn, queues[0].queue_id, 100_000)]


def test_wait_mode_waits_then_raises(store: SQLAlchemyQueueStore) -> None:
    client = RoutingQueueClient(
        store,
        source_id="a",
        client_name="policy",
        backpressure="wait",
        backpressure_timeout=0.3,
        flow_check_interval=0.05,
    )
    client.register_destinations(["b"])
    store.retention.set_flow_state("policy", True, ["b"])
    with pytest.raises(BackpressureError), store.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"x", ["b"])
    assert store.shipping.backlog("b", "policy").entries == 0
    store.retention.set_flow_state("policy", False, [])
    with store.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"x", ["b"])
    assert store.shipping.backlog("b", "policy").entries == 1


def test_raise_mode_rechecks_a_cached_on_before_refusing(store: SQLAlchemyQueueStore) -> None:
    client = RoutingQueueClient(
        store, source_id="a", client_name="policy", backpressure="raise", flow_check_interval=3600
    )
    client.register_destinations(["b"])
    store.retention.set_flow_state("policy", True, ["b"])
    with pytest.raises(BackpressureError), store.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"x", ["b"])
    # Lifted in the store: the next call must see it, though its cache is an hour long.
    store.retention.set_flow_state("policy", False, [])
    with store.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"x", ["b"])
    assert store.shipping.backlog("b", "policy").entries == 1


def test_backpressure_settings_are_checked(store: SQLAlchemyQueueStore) -> None:
    for bad in (
        {"backpressure": "sometimes"},
        {"backpressure_timeout": -1.0},
        {"flow_check_interval": -0.1},
    ):
        with pytest.raises(ValueError):
            RoutingQueueClient(store, source_id="a", client_name="policy", **bad)  # type: ignore[arg-type]
