"""The shared reader returns exactly what each session's own read would (both backends)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from lr_client.records import LogRange, SendEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_server.config import ClientConfig, ReplicationConfig
from lr_server.receiving.receiver import Receiver
from lr_server.sending.fanout import LogFanout
from lr_server.sending.session import SenderSession
from lr_server.transport.inproc import InProcessTransport
from tests.kit.wait import join, wait_for

DESTS = ["b", "c", "d", "e"]
CLIENTS = ["policy", "orders"]


def _key(entries: list[SendEntry]) -> list[tuple[int, str, bytes, float]]:
    return [(e.position, e.client_name, e.payload, e.created_at) for e in entries]


def _transmit(store: SQLAlchemyQueueStore, rng: random.Random, n: int) -> None:
    nums = store.sites.site_numbers()
    with store.write() as conn:
        for _ in range(n):
            client = rng.choice(CLIENTS)
            dests = rng.sample(DESTS, rng.randint(1, len(DESTS)))
            payload = rng.randbytes(rng.randint(1, 300))
            store.send.append_log_entries(conn, client, [(payload, [nums[d] for d in dests])])


def _client_log_reads(store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``after`` of every ``read_client_log`` of ``store`` from now on, as it happens."""
    calls: list[int] = []
    real = store.shipping.read_client_log

    def counted(client_name: str, after: int, limit: int, max_bytes: int | None) -> LogRange:
        calls.append(after)
        return real(client_name, after, limit, max_bytes)

    monkeypatch.setattr(store.shipping, "read_client_log", counted)
    return calls


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fanout_reads_equal_direct_reads(store: SQLAlchemyQueueStore, seed: int) -> None:
    """Random transmits and session reads, rewinds (reconnects) and jumps (snapshots).

    Streams of each destination, and of no destination (a cascaded client's child at
    the root, which gets every entry of the client). A tiny window (7 entries, 3 per
    refresh) makes every path run: serving from the window, refreshing at its end,
    evicting under a reader, restarting it, and falling back to direct reads for a
    stream behind it.
    """
    rng = random.Random(seed)
    store.sites.register_sites(DESTS)
    fanout = LogFanout(
        store.shipping, max_entries=7, max_bytes=900, read_batch=3, min_refresh_interval=0
    )
    streams: list[tuple[str | None, str]] = [(d, c) for d in [*DESTS, None] for c in CLIENTS]
    sent = dict.fromkeys(streams, 0)
    acked = dict(sent)
    for _ in range(400):
        op = rng.random()
        if op < 0.3:
            _transmit(store, rng, rng.randint(1, 6))
            continue
        stream = rng.choice(streams)
        if op < 0.35:  # reconnect: resume from the last acknowledged position
            sent[stream] = acked[stream]
            continue
        if op < 0.38:  # a full sync: log entries resume after its base (the head)
            sent[stream] = acked[stream] = store.send.head_position()
            continue
        dest, client = stream
        limit = rng.randint(1, 6)
        max_bytes = rng.choice([None, 200, 700])
        expected = (
            list(store.shipping.read_client_log(client, sent[stream], limit, max_bytes=max_bytes))
            if dest is None
            else store.shipping.read_log_entries(
                dest, client, sent[stream], limit, max_bytes=max_bytes
            )
        )
        got = fanout.read(dest, client, sent[stream], limit, max_bytes=max_bytes)
        assert _key(got) == _key(expected), (stream, sent[stream], limit, max_bytes)
        if got:
            sent[stream] = got[-1].position
            if rng.random() < 0.7:
                acked[stream] = sent[stream]
    assert fanout.hits > 0 and fanout.misses > 0  # both paths ran


def test_one_read_of_the_database_serves_every_destination(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.sites.register_sites(DESTS)
    nums = store.sites.site_numbers()
    with store.write() as conn:
        store.send.append_log_entries(
            conn, "policy", [(b"x%d" % i, [nums[d] for d in DESTS]) for i in range(50)]
        )
    calls = _client_log_reads(store, monkeypatch)
    fanout = LogFanout(store.shipping, min_refresh_interval=60.0)
    for dest in DESTS:
        got = fanout.read(dest, "policy", 0, 100)
        assert [e.payload for e in got] == [b"x%d" % i for i in range(50)]
    assert calls == [0]  # read once, for all four destinations
    assert fanout.misses == 0


def test_the_root_ships_a_cascaded_client_to_its_children_from_one_read(
    store: SQLAlchemyQueueStore,
    db_url_factory: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cascaded client goes whole to each child of its root: the root's sessions to the
    children take it from the shared window, read from the database once."""
    node = store.cascade.apply_cascade_config(
        "policy", "s1", "root", "", ("s2", "s3"), nodes=("s2", "s3")
    )
    nums = store.sites.register_sites(["s2", "s3"])
    with store.write() as conn:
        store.send.append_log_entries(
            conn, "policy", [(b"x%d" % i, [nums["s2"], nums["s3"]]) for i in range(40)]
        )
    head = store.send.head_position()
    calls = _client_log_reads(store, monkeypatch)
    fanout = LogFanout(store.shipping, min_refresh_interval=3600.0)
    leaves: dict[str, SQLAlchemyQueueStore] = {}
    stop = threading.Event()
    workers = []
    sessions: list[SenderSession] = []
    try:
        for child in ("s2", "s3"):
            leaf = leaves[child] = open_store(db_url_factory(child))
            leaf.create_schema()
            leaf.cascade.apply_cascade_config("policy", "s1", "leaf", "s1")
            at_leaf = Receiver(leaf, child, ["s1"])
            session = SenderSession(
                store,
                "s1",
                child,
                [ClientConfig("policy")],
                lambda r=at_leaf: InProcessTransport(r, "s1"),  # type: ignore[misc]
                ReplicationConfig(batch_max_entries=10),
                reader=fanout,
                cascade={"policy": node},
            )
            sessions.append(session)
            workers.append(threading.Thread(target=session.run, args=(stop,), daemon=True))
        for worker in workers:
            worker.start()
        for child, leaf in leaves.items():
            wait_for(
                lambda s=leaf: s.recv.sink_progress("s1", "policy").last_position == head,
                what=f"{child} has every entry",
                detail=lambda: [(x.state, x.last_error) for x in sessions],
            )
            got = leaf.cascade.read_relay("policy", "s1", 0, 100)
            assert [e.payload for e in got] == [b"x%d" % i for i in range(40)]
        assert calls == [0]  # one read of the database, for both children
        assert fanout.hits >= 8  # four batches of ten for each child
    finally:
        stop.set()
        for worker in workers:
            join(worker, 30)
        for leaf in leaves.values():
            leaf.engine.dispose()


def test_the_first_read_of_a_client_fills_the_window_whatever_the_refresh_interval(
    store: SQLAlchemyQueueStore,
) -> None:
    """The interval between refreshes counts from the last one; before the first there is
    none (it counted from the clock's zero: on a machine up for less than the interval,
    nothing was ever read)."""
    store.sites.register_sites(DESTS)
    nums = store.sites.site_numbers()
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x%d" % i, [nums["b"]]) for i in range(3)])
    fanout = LogFanout(store.shipping, min_refresh_interval=1e12)
    assert [e.payload for e in fanout.read("b", "policy", 0, 10)] == [b"x0", b"x1", b"x2"]


def test_sessions_at_the_end_of_the_queue_asking_at_once_share_one_read(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions swept or woken together, all caught up: a refresh that began after a
    session asked, and reached the end of the queue, answers it too, however long reads
    take. One that began before it asked does not (what woke it may have committed since)."""
    store.sites.register_sites(DESTS)
    _transmit(store, random.Random(4), 5)
    fanout = LogFanout(store.shipping, min_refresh_interval=0)  # shared by asking alone
    head = store.send.head_position()
    for client in CLIENTS:
        fanout.read("b", client, 0, 100)
    real = store.shipping.read_client_log
    reads: list[int] = []
    inside, go = threading.Event(), threading.Event()

    def slow(client_name: str, after: int, limit: int, max_bytes: int | None) -> LogRange:
        reads.append(after)
        inside.set()
        go.wait(10)
        time.sleep(0.05)  # a database read longer than the refresh interval
        return real(client_name, after, limit, max_bytes)

    monkeypatch.setattr(fanout.store, "read_client_log", slow)
    asked: list[str] = []
    window = fanout._window

    def asking(client_name: str) -> Any:
        asked.append(client_name)
        return window(client_name)

    monkeypatch.setattr(fanout, "_window", asking)
    got: dict[str, list[SendEntry]] = {}

    def session(dest: str) -> threading.Thread:
        def read() -> None:
            got[dest] = fanout.read(dest, "policy", head, 100)

        thread = threading.Thread(target=read)
        thread.start()
        return thread

    threads = [session("b")]
    assert inside.wait(10)  # b's refresh has begun; c, d and e ask after it
    threads += [session(d) for d in DESTS[1:]]
    wait_for(lambda: len(asked) == len(DESTS), what="every session asked")
    go.set()
    for t in threads:
        join(t)
    assert got == {dest: [] for dest in DESTS}
    assert reads == [head, head]  # b's, then one for c, d and e


def test_a_read_due_before_a_refresh_began_is_answered_by_it(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions whose waits ended together (on the grid, or woken at once) pass when their
    round was due: the refresh one began since then answers the others, however late the
    scheduler runs them; a read due after it began reads again."""
    store.sites.register_sites(DESTS)
    _transmit(store, random.Random(5), 5)
    fanout = LogFanout(store.shipping, min_refresh_interval=0)
    head = store.send.head_position()
    fanout.read("b", "policy", 0, 100)
    real = store.shipping.read_client_log
    reads: list[int] = []

    def counted(client_name: str, after: int, limit: int, max_bytes: int | None) -> LogRange:
        reads.append(after)
        return real(client_name, after, limit, max_bytes)

    monkeypatch.setattr(fanout.store, "read_client_log", counted)
    due = time.monotonic()
    assert fanout.read("b", "policy", head, 100, asked=due) == []  # refreshes: one read
    assert fanout.read("c", "policy", head, 100, asked=due) == []  # answered by b's
    assert len(reads) == 1
    assert fanout.read("d", "policy", head, 100) == []  # due now: after b's began
    assert len(reads) == 2


def test_a_read_tells_when_the_state_it_returns_was_read(store: SQLAlchemyQueueStore) -> None:
    """From the window: when the refresh's read returned (a look-up begun since sees all
    that committed before those entries); read on its own: after that read."""
    store.sites.register_sites(DESTS)
    nums = store.sites.site_numbers()
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])] * 5)
    fanout = LogFanout(store.shipping, min_refresh_interval=60.0)
    before = time.monotonic()
    got, at = fanout.read_stated("b", "policy", 0, 2)
    assert [e.position for e in got] == [1, 2] and before <= at <= time.monotonic()
    later = time.monotonic()
    got, again = fanout.read_stated("b", "policy", 2, 1)
    assert [e.position for e in got] == [3] and again == at < later  # served: the same read
    small = LogFanout(store.shipping, max_entries=2, min_refresh_interval=60.0)
    small.read_stated("b", "policy", 0, 5)  # the window keeps the last two
    got, own = small.read_stated("b", "policy", 0, 1)  # behind the window: its own read
    assert [e.position for e in got] == [1] and own >= later and small.misses == 1
