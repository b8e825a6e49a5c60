"""Woken, not polling (I11): sender sessions wake on a commit that transmitted, and a
lost wake-up costs at most the safety poll, never an entry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from lr_client import LRMessageWithDestinations, RoutingQueueClient, create_engine
from lr_client.store import SQLAlchemyQueueStore, open_store, watches
from lr_client.store.postgres import PostgresCore
from lr_client.store.send import pg_append
from lr_client.store.sqlite import SQLiteCore
from lr_server import Site
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.wait import scaled, wait_for

#: A poll so slow that only a wake-up delivers within a test's deadlines.
NEVER = 3600


def _pair(
    tmp_path: Path, make_url: Callable[[str], str], poll_interval: float
) -> tuple[Site, Site]:
    """A sink ``b`` and a source ``a`` whose sessions poll every ``poll_interval`` s."""
    port = free_port()
    sink = Site(write_config(tmp_path, SiteSpec("b", make_url("b"), port, sources=["a"])))
    path = write_config(tmp_path, SiteSpec("a", make_url("a"), destinations=[("b", port)]))
    text = path.read_text()
    assert "poll_interval = 0.01\n" in text
    path.write_text(text.replace("poll_interval = 0.01\n", f"poll_interval = {poll_interval}\n"))
    return sink, Site(path)


def _transmit(source: Site, payloads: list[bytes]) -> None:
    client = RoutingQueueClient(source.store, "a", "policy")
    for p in payloads:
        with Session(source.store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, p, ["b"])


def _received(sink: Site) -> list[bytes]:
    queues = sink.store.queues.list_queues("policy")
    if not queues:
        return []
    with sink.store.read() as conn:
        return [e.payload for e in sink.store.queues.read_queue(conn, queues[0].queue_id, 1000)]


@pytest.mark.stop_calls_at_once
def test_an_idle_session_ships_a_commit_at_once_not_at_its_poll(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    """Sessions polling once an hour ship each transmit as it commits: only the send
    queue's watch (PostgreSQL NOTIFY, SQLite data_version) can wake them."""
    sink, source = _pair(tmp_path, db_url_factory, NEVER)
    with sink, source:
        session = source.server.sessions["b"]
        session.idle_poll_max = NEVER
        wait_for(lambda: session.connected, what="the session connected")
        assert source.server.send_watch is not None
        wait_for(lambda: source.server.send_watch.listening, what="the send watch listening")
        for n in range(1, 4):  # each one after the session went idle again
            _transmit(source, [b"e%d" % n])
            wait_for(lambda n=n: len(_received(sink)) == n, what=f"entry {n} shipped")
        assert _received(sink) == [b"e1", b"e2", b"e3"]


@pytest.mark.stop_calls_at_once
def test_every_wakeup_lost_still_ships_everything_in_order_within_the_safety_poll(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No watch at all (every signal lost): the sessions' safety poll ships every entry,
    in order, once each."""
    for backend in (SQLiteCore, PostgresCore):
        monkeypatch.setattr(backend, "watch_sends", lambda self, wake: None)
    sink, source = _pair(tmp_path, db_url_factory, 0.05)
    with sink, source:
        assert source.server.send_watch is None
        session = source.server.sessions["b"]
        session.idle_poll_max = 0.2
        payloads = [b"p%03d" % i for i in range(60)]
        for i in range(0, 60, 20):  # three bursts, the session idle in between
            _transmit(source, payloads[i : i + 20])
            wait_for(lambda i=i: len(_received(sink)) == i + 20, timeout=10)
        assert _received(sink) == payloads


def test_a_sqlite_watch_wakes_on_the_heads_it_watches_only(tmp_path: Path) -> None:
    """Another connection's commit wakes a :class:`DataVersionWatch` only if it moved
    a watched head (the ``changed`` check); its own start wakes it once."""
    store = open_store(create_engine(f"sqlite:///{tmp_path / 'w.db'}"))
    store.create_schema()
    store.sites.register_sites(["b"])
    rings: list[int] = []
    watch = store.shipping.watch_sends(lambda: rings.append(1))
    assert watch is not None
    try:
        wait_for(lambda: watch.listening and rings == [1], what="the watch started")
        status = {"inflight_batches": 0, "inflight_bytes": 0}
        store.inspection.save_session_status(
            "b", "connected", connected=True, **status
        )  # not a head
        store.sites.register_sites(["c"])
        store.inspection.save_session_status("b", "idle", connected=False, **status)
        client = RoutingQueueClient(store, "a", "policy")
        with Session(store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, b"x", ["b"])
        wait_for(lambda: len(rings) == 2, what="the transmit's wake-up")
        # The status writes came first: had they woken it, the count would be higher.
        assert len(rings) == 2
    finally:
        watch.close()
        store.close()


@pytest.fixture
def pg_store(store: SQLAlchemyQueueStore) -> SQLAlchemyQueueStore:
    """A PostgreSQL store in a database of its own: notifications are per database."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's notifications")
    store.sites.register_sites(["b"])
    return store


def test_transmits_notify_at_most_once_per_interval(
    pg_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transmitting process notifies the sessions once per ``NOTIFY_INTERVAL``, not
    once per transaction, in the statement it runs anyway; single and batch forms."""
    rings: list[int] = []
    got = threading.Event()

    def ring() -> None:
        rings.append(1)
        got.set()

    watch = pg_store.shipping.watch_sends(ring)
    assert watch is not None
    client = RoutingQueueClient(pg_store, "a", "policy")
    try:
        wait_for(lambda: watch.listening and rings == [1], what="the watch started")
        monkeypatch.setattr(watches, "NOTIFY_INTERVAL", NEVER)
        got.clear()
        for payload in (b"1", b"2", b"3"):
            with Session(pg_store.engine) as s, s.begin():
                client.transmit_log_entry_message(s, payload, ["b"])
        with Session(pg_store.engine) as s, s.begin():
            client.transmit_log_entry_messages(s, [_message(b"4"), _message(b"5")])
        assert got.wait(scaled(10))
        monkeypatch.setattr(watches, "NOTIFY_INTERVAL", 0.0)  # every one notifies now
        got.clear()
        with Session(pg_store.engine) as s, s.begin():
            client.transmit_log_entry_messages(s, [_message(b"6"), _message(b"7")])
        assert got.wait(scaled(10))
        # A rolled-back transmit notifies nobody.
        with pytest.raises(RuntimeError), Session(pg_store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, b"8", ["b"])
            raise RuntimeError("the application's transaction fails")
        # The marker: a notification sent after the rolled-back one, outside any transmit.
        got.clear()
        with pg_store.engine.begin() as conn:
            conn.exec_driver_sql(f"NOTIFY {watches.SENDS_CHANNEL}")
        assert got.wait(scaled(10))
        # 1 at the start, 1 for the four transactions of one interval, 1 for the
        # batch, none for the rollback, 1 for the marker.
        assert len(rings) == 4
    finally:
        watch.close()


def _message(payload: bytes) -> LRMessageWithDestinations:
    return LRMessageWithDestinations(payload, ["b"])


def test_a_transmit_sends_no_notification_over_the_queues_limit(
    pg_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the notification queue's limit (here: any use at all) a transmit notifies
    nobody and still commits: a listener that stopped reading never fails the
    application's transaction."""
    rings: list[int] = []
    watch = pg_store.shipping.watch_sends(lambda: rings.append(1))
    assert watch is not None
    limit = f"< {watches.QUEUE_USAGE_LIMIT}) n)"
    for key in [(False, True), (True, True)]:  # (batch, notify): the notifying statements
        named, own = pg_append._STATEMENTS[key]
        assert limit in own and limit in named
        never = (named.replace(limit, "< 0) n)"), own.replace(limit, "< 0) n)"))
        monkeypatch.setitem(pg_append._STATEMENTS, key, never)
    client = RoutingQueueClient(pg_store, "a", "policy")
    try:
        wait_for(lambda: watch.listening and rings == [1], what="the watch started")
        monkeypatch.setattr(watches, "NOTIFY_INTERVAL", 0.0)  # each one would notify
        with Session(pg_store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, b"1", ["b"])
        with Session(pg_store.engine) as s, s.begin():
            client.transmit_log_entry_messages(s, [_message(b"2"), _message(b"3")])
        with pg_store.engine.begin() as conn:  # the marker, past the limit's reach
            conn.exec_driver_sql(f"NOTIFY {watches.SENDS_CHANNEL}")
        wait_for(lambda: len(rings) >= 2, what="the marker's wake-up", detail=lambda: rings)
        assert len(rings) == 2  # the start and the marker: the transmits sent none
        assert [e.payload for e in pg_store.shipping.read_log_entries("b", "policy", 0, 10)] == [
            b"1",
            b"2",
            b"3",
        ]
    finally:
        watch.close()
