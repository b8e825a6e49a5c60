"""No log entry past a snapshot's base reaches the sink before the snapshot, and none twice.

The first tests drive one sender session step by step against a real
receiver and sink store (:mod:`tests.kit.rig`, no timing involved): ship log
entries, open a full sync, fix its base, transmit more, let the session take
one round, and look at what the sink holds. The last one runs real sites
over gRPC while the application keeps writing and the provider starts each
full sync at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import select

from lr_client import RoutingQueueClient
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.sending.streams import Mode
from tests.kit import kvapp
from tests.kit.rig import CLIENT, Rig, make_rig
from tests.kit.sites import Sites, wait_for


@pytest.fixture
def rig(store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]) -> Iterator[Rig]:
    with make_rig(store, db_url_factory) as r:
        yield r


def test_a_running_snapshot_stops_log_entries_at_its_base(rig: Rig) -> None:
    first = rig.log_at_sink()
    shipped = rig.transmit(4)
    rig.connect()
    assert rig.streams[CLIENT].mode is Mode.LOG
    rig.step()
    assert rig.log_at_sink() == first + shipped

    sid = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator")
    below = rig.transmit(2)  # committed before the base is fixed
    started = rig.src.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == below[-1]
    above = rig.transmit(3)
    rig.step()  # the session has not run its periodic request check since

    assert rig.log_at_sink() == first + shipped + below  # nothing past the base
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT

    rig.provide(sid, [b"row-1", b"row-2"])
    rig.until_complete(sid)
    rig.drain(above[-1])
    assert rig.deliver() == [
        ("log", tuple(first + shipped + below)),
        ("start", sid),
        ("snapshot", (b"row-1", b"row-2")),
        ("end", sid),
        ("log", tuple(above)),
    ]


def test_a_requested_snapshot_stops_log_entries_at_once(rig: Rig) -> None:
    first = rig.log_at_sink()
    shipped = rig.transmit(3)
    rig.connect()
    rig.step()
    assert rig.log_at_sink() == first + shipped

    sid = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator")
    rig.transmit(2)  # before the base: the snapshot holds their effect
    rig.step()
    assert rig.log_at_sink() == first + shipped
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT

    started = rig.src.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position is not None
    above = rig.transmit(2)
    rig.step()
    assert rig.log_at_sink() == first + shipped  # and nothing past the base either

    rig.provide(sid, [b"row"])
    rig.until_complete(sid)
    rig.drain(above[-1])
    assert rig.deliver() == [
        ("log", tuple(first + shipped)),
        ("start", sid),
        ("snapshot", (b"row",)),
        ("end", sid),
        ("log", tuple(above)),
    ]


def test_with_no_open_request_log_entries_flow(rig: Rig) -> None:
    """The gate costs nothing when no full sync is open: every round ships."""
    first = rig.log_at_sink()
    rig.connect()
    expected = list(first)
    for _ in range(3):
        batch = rig.transmit(2)
        rig.step()
        expected += batch
        assert rig.log_at_sink() == expected
    assert rig.streams[CLIENT].mode is Mode.LOG


def test_open_snapshots_gives_each_listed_client_its_open_request(
    store: SQLAlchemyQueueStore,
) -> None:
    store.sites.register_sites(["b", "c"])
    done = store.snapshots.request_snapshot(None, "b", "p1", "first")
    store.snapshots.start_snapshot(done)
    store.snapshot_entries.finish_snapshot(done)
    store.snapshots.complete_snapshot(done)
    p1 = store.snapshots.request_snapshot(None, "b", "p1", "second")
    p2 = store.snapshots.request_snapshot(None, "b", "p2", "x")
    store.snapshots.start_snapshot(p2)
    store.snapshots.request_snapshot(None, "b", "p3", "not asked for")
    store.snapshots.request_snapshot(None, "c", "p1", "another destination")
    found = store.snapshots.open_snapshots("b", ["p1", "p2", "p4"])
    assert {k: (v.snapshot_id, v.status) for k, v in found.items()} == {
        "p1": (p1, SnapshotStatus.REQUESTED),
        "p2": (p2, SnapshotStatus.RUNNING),
    }
    assert store.snapshots.open_snapshots("b", []) == {}


# -- end to end ---------------------------------------------------------------------------
def _applied(store: SQLAlchemyQueueStore) -> list[tuple[str, int]]:
    with store.read() as conn:
        rows = conn.execute(
            select(kvapp.applied.c.kind, kvapp.applied.c.position).order_by(kvapp.applied.c.id)
        ).all()
    return [(r.kind, r.position) for r in rows]


def test_full_syncs_requested_mid_stream_keep_every_log_entry_once_and_in_place(
    sites: Sites,
) -> None:
    src = sites.store("a")
    sink = sites.store("b")
    for st in (src, sink):
        kvapp.meta.create_all(st.engine)
    client = RoutingQueueClient(src, source_id="a", client_name=CLIENT, backpressure="ignore")
    client.register_destinations(["b"])
    for i in range(20):
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"])
    listener = kvapp.KvListener()
    sub = RoutingQueueSubscriber(sink, CLIENT, listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, CLIENT, kvapp.provider(src.engine))
    stop = threading.Event()
    writes = [0]

    def writer() -> None:  # the application keeps writing every few milliseconds
        while not stop.is_set():
            kvapp.write(src.engine, client, {f"k{writes[0] % 50}": writes[0]}, ["b"])
            writes[0] += 1
            stop.wait(0.003)

    def provider_loop() -> None:  # starts each requested full sync at once
        while not stop.is_set():
            if not runner.poll_once():
                stop.wait(0.005)

    def completed(sid: str) -> bool:
        req = src.snapshots.get_snapshot(sid)
        return req is not None and req.status is SnapshotStatus.COMPLETED

    def logs_after_snapshot(number: int) -> int:
        """Log entries applied after the rows of the ``number``-th snapshot (0: its rows
        are not all applied yet, or a later one's are)."""
        kinds = [k for k, _ in _applied(sink)]
        starts = [
            i for i, k in enumerate(kinds) if k == "snapshot" and (i == 0 or kinds[i - 1] != k)
        ]
        if len(starts) != number:
            return 0
        return kinds[::-1].index("snapshot")

    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")
    threads = [threading.Thread(target=f, daemon=True) for f in (writer, provider_loop)]
    threads.append(threading.Thread(target=sub.run, args=(stop,), daemon=True))
    for t in threads:
        t.start()
    try:
        for round_ in range(3):  # first contact, then two requested mid-stream
            if round_:
                client.request_snapshot_sync("b", reason="test")
            wait_for(lambda r=round_: len(listener.full_syncs) == r + 1, timeout=90)
            # The next request comes once the source has the sink's end ack: a request
            # before it would supersede (cancel) a snapshot the sink completed. The end
            # ack says the sink stored the snapshot, not that its listener applied it:
            # the log entries counted next are those applied after this snapshot's
            # rows (the listener started it in a transaction not committed yet shows
            # the last one's). Without them, a request would stop the log at once and
            # the next snapshot's rows would follow this one's with no log between.
            wait_for(lambda: completed(listener.full_syncs[-1]), timeout=90)
            wait_for(lambda r=round_: logs_after_snapshot(r + 1) >= 20, timeout=90)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    sites.stop("a")
    sites.stop("b")
    while sub.poll_once():  # whatever reached the sink before the stop
        pass

    snaps = {x.snapshot_id: x for x in src.snapshots.list_snapshots("b", CLIENT)}
    bases: list[int] = []
    for sid in listener.full_syncs:
        base = snaps[sid].base_position
        assert snaps[sid].status is SnapshotStatus.COMPLETED and base is not None
        bases.append(base)

    # Split what the listener applied into log runs around the snapshot blocks.
    applied = _applied(sink)
    runs: list[list[int]] = [[]]
    blocks = 0
    for i, (kind, position) in enumerate(applied):
        if kind == "snapshot":
            if i == 0 or applied[i - 1][0] != "snapshot":
                blocks += 1
                runs.append([])
        else:
            runs[-1].append(position)
    assert blocks == len(bases) == 3
    logs = [p for run in runs for p in run]
    assert logs == sorted(set(logs)), "a log entry came twice or out of order"
    for k, base in enumerate(bases):
        assert all(p <= base for p in runs[k]), f"log entries past base {base} before snapshot {k}"
        after = runs[k + 1]
        # Log entries resume right after the base, none missing.
        assert after == list(range(base + 1, base + 1 + len(after))), (base, after[:5])
    assert listener.errors == []
