"""Woken, not polling (I11): sender sessions wake on a commit that transmitted, and a
lost wake-up costs at most the safety poll, never an entry; an idle site's sessions,
upkeep and watches sleep until something happens, and the server's probe of the send
queue's head bounds what a lost wake-up costs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from lr_client import LRMessageWithDestinations, RoutingQueueClient, create_engine
from lr_client.records import Fence
from lr_client.store import SQLAlchemyQueueStore, open_store, watches
from lr_client.store.postgres import PostgresCore
from lr_client.store.send import pg_append
from lr_client.store.sqlite import SQLiteCore
from lr_server import Site, parse_config
from lr_server.cluster import upkeep
from lr_server.cluster.upkeep import Upkeep
from lr_server.sending import acks, send_probe
from lr_server.sending import session as session_module
from lr_server.sending.send_probe import STEADY_POLL_MAX, SendProbe
from lr_server.sending.streams import Mode
from tests.kit.rig import CLIENT, make_rig
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


def test_the_probe_wakes_at_its_first_read_and_when_the_head_moved() -> None:
    """The first read wakes too: entries that committed before it, after the sessions'
    first reads and with their wake-up lost, would otherwise wait for the safety poll."""
    heads = iter([5, 5, 6, 6, 9])
    rings: list[int] = []
    probe = SendProbe(lambda: next(heads), lambda: rings.append(1))
    assert [probe.check() for _ in range(5)] == [True, False, True, False, True]
    assert len(rings) == 3


def test_the_probe_sweeps_the_sessions_when_nothing_woke_them_for_a_sweep_interval() -> None:
    """The sessions' safety poll, taken by the probe for them all at once: a sweep after
    ``sweep_interval`` without a wake-up, none while the head moves."""
    heads = iter([5, 5, 5, 6, 6, 6, 6])
    calls: list[str] = []
    probe = SendProbe(
        lambda: next(heads),
        lambda: calls.append("wake"),
        lambda: calls.append("sweep"),
        sweep_interval=60.0,
    )
    for now in (0.0, 30.0, 61.0, 62.0, 100.0, 121.0, 122.0):
        probe.step(now)
    assert calls == ["wake", "sweep", "wake", "sweep"]


@pytest.mark.stop_calls_at_once
def test_the_probes_sweep_alone_shows_the_sessions_an_operators_request(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sessions never poll on their own and every wake-up is lost: the probe's sweep
    alone makes them look at requests (an operator's full sync is started)."""
    for backend in (SQLiteCore, PostgresCore):
        watch = backend.watch_sends
        monkeypatch.setattr(backend, "watch_sends", lambda self, wake, w=watch: w(self, _lost))
    monkeypatch.setattr(send_probe, "PROBE_INTERVAL", 0.1)
    monkeypatch.setattr(send_probe, "SWEEP_INTERVAL", 0.3)
    sink, source = _pair(tmp_path, db_url_factory, NEVER)
    with sink, source:
        sess = source.server.sessions["b"]
        sess.idle_poll_max = sess.steady_poll_max = NEVER
        wait_for(lambda: CLIENT in sess.shipper.read_at, what="the session's first read")
        # Written as `lr snapshot request` writes it, from another process: no wake-up.
        snapshot_id = source.store.snapshots.request_snapshot(None, "b", CLIENT, "operator")
        wait_for(
            lambda: _started(source, snapshot_id),
            timeout=30,
            what="the request seen by a swept session",
        )


def _started(site: Site, snapshot_id: str) -> bool:
    found = site.store.snapshots.get_snapshot(snapshot_id, "b")
    return found is not None and found.status.value != "requested"


@pytest.mark.stop_calls_at_once
def test_with_every_wakeup_of_the_watch_lost_the_probe_ships_everything_in_order(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch listens but its wake-ups are lost and the sessions never poll on their
    own: the server's probe of the head alone ships every entry, in order, once each."""
    for backend in (SQLiteCore, PostgresCore):
        watch = backend.watch_sends
        monkeypatch.setattr(backend, "watch_sends", lambda self, wake, w=watch: w(self, _lost))
    monkeypatch.setattr(send_probe, "PROBE_INTERVAL", 0.1)
    sink, source = _pair(tmp_path, db_url_factory, NEVER)
    with sink, source:
        sess = source.server.sessions["b"]
        sess.idle_poll_max = sess.steady_poll_max = NEVER
        assert source.server.send_watch is not None
        payloads = [b"p%03d" % i for i in range(30)]
        for i in range(0, 30, 10):  # three bursts, the session idle in between
            _transmit(source, payloads[i : i + 10])
            wait_for(lambda i=i: len(_received(sink)) == i + 10, timeout=30)
        assert _received(sink) == payloads


@pytest.mark.stop_calls_at_once
def test_entries_committed_before_the_probes_first_read_are_shipped(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's first read comes late (a busy machine): after the session's first read
    and after a burst committed with its wake-up lost. That read alone must wake it."""
    for backend in (SQLiteCore, PostgresCore):
        watch = backend.watch_sends
        monkeypatch.setattr(backend, "watch_sends", lambda self, wake, w=watch: w(self, _lost))
    monkeypatch.setattr(send_probe, "PROBE_INTERVAL", 0.1)
    gate = threading.Event()
    run = SendProbe.run

    def late(self: SendProbe, stop: threading.Event) -> None:
        gate.wait(scaled(30))
        run(self, stop)

    monkeypatch.setattr(SendProbe, "run", late)
    sink, source = _pair(tmp_path, db_url_factory, NEVER)
    with sink, source:
        sess = source.server.sessions["b"]
        sess.idle_poll_max = sess.steady_poll_max = NEVER
        wait_for(lambda: CLIENT in sess.shipper.read_at, what="the session's first read")
        payloads = [b"p%03d" % i for i in range(10)]
        _transmit(source, payloads)
        gate.set()
        wait_for(lambda: _received(sink) == payloads, timeout=30, what="the burst shipped")


def _lost() -> None:
    """A wake-up that never arrives."""


def _recorded_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeout of every wait for acknowledgements from now on, as it happens."""
    waits: list[float] = []
    drain = acks.Acknowledgements.drain

    def recorded(self: acks.Acknowledgements, stream: object, streams: object, t: float) -> int:
        waits.append(t)
        return drain(self, stream, streams, t)  # type: ignore[arg-type]

    monkeypatch.setattr(acks.Acknowledgements, "drain", recorded)
    return waits


@pytest.mark.stop_calls_at_once
def test_a_servers_idle_session_waits_whole_and_stops_when_told(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a server an idle session waits for acknowledgements in one wait, not in
    slices to look at its stop: the server's stop wakes it, and it ends."""
    waits = _recorded_waits(monkeypatch)
    sink, source = _pair(tmp_path, db_url_factory, NEVER)
    with sink:
        with source:
            sess = source.server.sessions["b"]
            assert sess.acks.stop_check is None and sess.steady_poll_max == STEADY_POLL_MAX
            thread = source.server._runs["b"][1]
            wait_for(lambda: any(t > acks.STOP_CHECK for t in waits), what="an idle wait")
        assert not thread.is_alive()  # the server's stop ended its wait


def _recorded_levels(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The back-off level of every idle wait of the sessions from now on (each wait ends
    on its grid); no probe, so no sweep but the test's."""
    levels: list[float] = []

    def recorded(wait: float) -> float:
        levels.append(wait)
        return send_probe.on_grid(wait)

    monkeypatch.setattr(session_module, "on_grid", recorded)
    monkeypatch.setattr(send_probe, "PROBE_INTERVAL", NEVER)
    return levels


@pytest.mark.stop_calls_at_once
def test_a_steady_session_backs_off_to_the_safety_poll_then_waits_the_steady_poll(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its waits double from ``poll_interval`` up to ``idle_poll_max``, then go straight to
    ``steady_poll_max``: under the probe no read in between. Each ends on the next
    multiple of itself, where the other sessions at its level or below wake too."""
    waits = _recorded_waits(monkeypatch)
    levels = _recorded_levels(monkeypatch)
    sink, source = _pair(tmp_path, db_url_factory, 0.01)
    with sink, source:
        sess = source.server.sessions["b"]
        sess.idle_poll_max, sess.steady_poll_max = 0.08, NEVER
        wait_for(lambda: steady(levels) == 1, what="the steady wait")
        seen = len(levels)
        sess.wake()  # back to fast polls, then the same again

        def since_wake() -> list[float]:
            # From the wake-up's first fast poll: the probe's first read (5 s after the
            # start, later on a busy machine) may sweep the steady wait before it.
            rest = [round(t, 2) for t in levels[seen:]]
            return rest[rest.index(0.01) :][:5] if 0.01 in rest else []

        wait_for(lambda: len(since_wake()) == 5, what="the fast polls and the steady wait")
    assert since_wake() == [0.01, 0.02, 0.04, 0.08, NEVER]
    assert waits and all(0 <= t <= NEVER for t in waits)  # on the grid: within each level


@pytest.mark.stop_calls_at_once
def test_a_head_the_probe_saw_move_is_read_at_once_at_the_sessions_back_off(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's wake-up is a sweep: the session reads now (its read gives positions to
    all that committed) and, finding nothing, goes back to its steady wait, not through
    the fast polls again; the watch's wake-up starts them over."""
    levels = _recorded_levels(monkeypatch)
    sink, source = _pair(tmp_path, db_url_factory, 0.01)
    with sink, source:
        sess = source.server.sessions["b"]
        sess.idle_poll_max, sess.steady_poll_max = 0.08, NEVER
        wait_for(lambda: steady(levels) >= 1, what="the steady wait")
        seen = len(levels)
        source.server.head_moved()
        wait_for(lambda: steady(levels[seen:]) >= 1, what="the read the probe asked for")
        assert levels[seen:] == [NEVER]
        seen = len(levels)
        source.server.wake_sessions()
        wait_for(
            lambda: steady(levels[seen:]) >= 1,
            what="the steady wait after the wake-up",
            detail=lambda: f"levels since the wake-up: {levels[seen:][:40]}",
        )
    assert levels[seen : seen + 2] == [0.01, 0.02]


@pytest.mark.stop_calls_at_once
def test_a_wake_up_too_soon_after_a_read_of_requests_is_owed_one_when_it_is_due(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests are read at most every REQUEST_CHECK s: a wake-up that comes sooner (a
    full sync requested just after the last read) gets its read when that is due, not
    at the next sweep."""
    checks: list[float] = []
    real = session_module.SenderSession._check_requests

    def recorded(self: session_module.SenderSession, *args: Any) -> None:
        checks.append(time.monotonic())
        real(self, *args)

    monkeypatch.setattr(session_module.SenderSession, "_check_requests", recorded)
    monkeypatch.setattr(session_module, "REQUEST_CHECK", 2.0)
    monkeypatch.setattr(send_probe, "PROBE_INTERVAL", NEVER)  # no sweep but the test's
    sink, source = _pair(tmp_path, db_url_factory, 0.01)
    with sink, source:
        sess = source.server.sessions["b"]
        sess.idle_poll_max, sess.steady_poll_max = 0.08, NEVER
        sess.wake()
        wait_for(lambda: checks and time.monotonic() - checks[-1] < 1.0, what="a read")
        seen = len(checks)
        sess.wake()  # within REQUEST_CHECK of that read
        wait_for(lambda: len(checks) > seen, what="the owed read of requests")
    assert checks[seen] - checks[seen - 1] >= 2.0


def test_a_wait_on_the_grid_ends_on_a_multiple_of_itself() -> None:
    for wait in (0.01, 0.32, 5.0, 300.0):
        timeout = send_probe.on_grid(wait)
        end = time.monotonic() + timeout
        assert 0 < timeout <= wait
        assert min(end % wait, wait - end % wait) < 0.005  # its end, as the clock went on
    assert send_probe.on_grid(0.0) == 0.0


def steady(waits: list[float]) -> int:
    """How many of ``waits`` were the steady poll's (NEVER)."""
    return sum(t > NEVER / 2 for t in waits)


def test_a_session_is_steady_only_in_log_entry_sync_with_nothing_in_flight(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    with make_rig(store, db_url_factory) as r:
        r.connect()
        assert r.session.steady(r.streams)
        r.transmit(2)
        assert r.stream is not None
        r.session._ship(r.stream, r.streams)  # sent, not acknowledged yet
        assert not r.session.steady(r.streams)
        r.session.acks.drain(r.stream, r.streams, 10.0)
        assert r.session.steady(r.streams)
        r.streams[CLIENT].mode = Mode.SNAPSHOT
        assert not r.session.steady(r.streams)


def test_an_idle_upkeep_comes_again_at_once_when_woken(
    store: SQLAlchemyQueueStore, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle rounds back off (here without end); a wake-up brings the next one at
    once: rounds go on only as long as something wakes the upkeep."""
    monkeypatch.setattr(upkeep, "IDLE_UPKEEP_MAX", NEVER)
    config = parse_config(
        {
            "site": {"id": "a", "database_url": db_url},
            "security": {"transport": "plaintext"},
            "clients": [{"name": "policy"}],
            "retention": {"trim_interval": 0.01},
        }
    )
    keeper = Upkeep(store, config, lambda: Fence("trim", "me", 1), lambda: None)
    rounds: list[int] = []
    monkeypatch.setattr(keeper, "round", lambda fence: rounds.append(1) and False)
    stop = threading.Event()
    worker = threading.Thread(target=keeper.run, args=(stop,))
    worker.start()
    try:
        # Unwoken, the 30th round would come after 0.01 * 2**29 s.
        wait_for(lambda: keeper.wake() or len(rounds) >= 30, what="rounds on wake-ups")
    finally:
        stop.set()
        keeper.wake()
        worker.join()


def _inotify_watches() -> list[tuple[int, str]]:
    """(inode, mask) of every inotify watch this process holds (``/proc`` fdinfo)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("inotify"):
                fields = dict(part.split(":", 1) for part in line.split()[1:])
                found.append((int(fields["ino"], 16), fields["mask"]))
    return found


@pytest.mark.skipif(watches.inotify_simple is None, reason="inotify: Linux")
def test_a_sqlite_watch_asks_for_the_writes_of_its_database_and_log_only(
    tmp_path: Path,
) -> None:
    """Other files of the folder (other databases, logs) written never wake the watch:
    the kernel is asked for the writes of the database file and its log, and for the
    folder's new files only."""
    store = open_store(create_engine(f"sqlite:///{tmp_path / 'w.db'}"))
    store.create_schema()
    before = set(_inotify_watches())
    watch = store.shipping.watch_sends(lambda: None)
    assert watch is not None
    try:
        wait_for(lambda: watch.listening, what="the watch started")
        mine = {ino: int(mask, 16) for ino, mask in set(_inotify_watches()) - before}
        modify, create = 0x2, 0x100
        inodes = {os.stat(tmp_path / n).st_ino: n for n in ("w.db", "w.db-wal", ".")}
        assert {inodes[i] for i in mine} == {"w.db", "w.db-wal", "."}
        assert all(mine[i] & modify for i, n in inodes.items() if n != ".")
        folder = next(i for i, n in inodes.items() if n == ".")
        assert mine[folder] & create and not mine[folder] & modify
    finally:
        watch.close()
        store.close()


def test_a_transmit_wakes_the_session_and_the_upkeep(
    tmp_path: Path, db_url_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send queue's wake-up reaches the upkeep too (its next round comes soon)."""
    woken: list[int] = []
    monkeypatch.setattr(Upkeep, "wake", lambda self: woken.append(1))
    sink, source = _pair(tmp_path, db_url_factory, 0.05)
    with sink, source:
        count = len(woken)
        client = RoutingQueueClient(source.store, "a", "policy")
        with Session(source.store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, b"x", ["b"])
        wait_for(lambda: len(woken) > count, what="the upkeep woken")
