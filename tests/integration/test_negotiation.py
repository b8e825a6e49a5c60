"""A sink that lacks entries the source no longer holds is never skipped silently.

In-process sites (real gRPC on loopback) on both backends. A sink "restored
from a backup" is simulated by stopping its server and setting its recorded
position (and the listener's table) back; trim runs only when a test calls it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY
from sqlalchemy import Column, Integer, MetaData, String, Table, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient, RoutingQueueListener, RoutingQueueMessage
from lr_client.records import SnapshotRequest, SnapshotStatus, StreamStop
from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.postgres import PostgresCore
from lr_client.store.retention import slots
from lr_client.store.schema import tables as s
from lr_client.store.sqlite import SQLiteCore
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.cli import cli
from lr_server.ops.status import collect_status
from lr_server.ops.status_records import StreamState
from tests.kit import kvapp
from tests.kit.positions import new_slot
from tests.kit.sites import Sites, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


NO_AUTO_TRIM = "[retention]\ntrim_interval = 3600\n"

meta = MetaData()
events = Table(
    "test_events",
    meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),
    Column("position", Integer, nullable=False),
    Column("detail", String(500), nullable=False, default=""),
)


class EventListener(RoutingQueueListener):
    """Records every callback in the sink's database, in the delivery transaction."""

    def __init__(self, fail_first_drop: bool = False) -> None:
        self.fail_first_drop = fail_first_drop
        self.drop_calls = 0

    def _event(self, session: Session, kind: str, position: int = 0, detail: str = "") -> None:
        session.execute(insert(events).values(kind=kind, position=position, detail=detail))

    def on_stream_dropped(
        self, session: Session, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        self.drop_calls += 1
        self._event(session, "dropped", first_dropped_position, reason)
        if self.fail_first_drop and self.drop_calls == 1:
            raise RuntimeError("crash inside the delivery")

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._event(session, "start")

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._event(session, "end")

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        for m in messages:
            kvapp.upsert(session, *_kv(m.payload))
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        for m in messages:
            kvapp.upsert(session, *_kv(m.payload))
            self._event(session, "log", m.source_position)
        return True

    def on_error(self, error: BaseException) -> None:
        pass


def _kv(payload: bytes) -> tuple[str, int]:
    import json

    d = json.loads(payload)
    return d["k"], d["v"]


@contextmanager
def running(*loops: object) -> Iterator[None]:
    stop = threading.Event()
    threads = [threading.Thread(target=x.run, args=(stop,), daemon=True) for x in loops]  # type: ignore[attr-defined]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)


def seen(sink: SQLAlchemyQueueStore) -> list[tuple[str, int]]:
    with sink.read() as conn:
        rows = conn.execute(select(events.c.kind, events.c.position).order_by(events.c.id))
        return [(r.kind, r.position) for r in rows]


def logs(sink: SQLAlchemyQueueStore) -> list[int]:
    return [p for k, p in seen(sink) if k == "log"]


def resumed(stop: StreamStop | None) -> bool:
    return stop is not None and stop.resumed_at is not None


def stopped_gauge() -> float | None:
    return REGISTRY.get_sample_value("lr_stream_stopped", {"destination": "b", "client": "policy"})


class Pair:
    """Source a -> sink b, one client, a subscriber on b."""

    def __init__(
        self, sites: Sites, snapshot: str, listener: EventListener, dests: Sequence[str] = ("b",)
    ) -> None:
        self.sites = sites
        self.dests = list(dests)
        self.snapshot = snapshot
        self.src = sites.store("a")
        kvapp.meta.create_all(self.src.engine)
        self.client = RoutingQueueClient(
            self.src, source_id="a", client_name="policy", backpressure="ignore"
        )
        self.client.register_destinations(self.dests)
        self.sink = sites.store("b")
        kvapp.meta.create_all(self.sink.engine)
        meta.create_all(self.sink.engine)
        self.sub = RoutingQueueSubscriber(self.sink, "policy", listener, poll_interval=0.02)
        self.runner = SnapshotProviderRunner(self.src, "policy", kvapp.provider(self.src.engine))
        self.n = 0

    def start_source(self) -> None:
        self.sites.start("a", dests=["b"], snapshot=self.snapshot, extra=NO_AUTO_TRIM)

    def start_sink(self) -> None:
        self.sites.start("b", sources=["a"])

    def wait_first_contact(self) -> None:
        """With a provider, the first contact is a full sync: let it complete."""

        def done() -> bool:
            snaps = self.src.snapshots.list_snapshots("b", "policy")
            return any(x.status is SnapshotStatus.COMPLETED for x in snaps)

        wait_for(done, timeout=60)

    def write(self, count: int) -> None:
        for _ in range(count):
            self.n += 1
            kvapp.write(self.src.engine, self.client, {f"k{self.n % 7}": self.n}, self.dests)

    def loops(self) -> list[object]:
        return [self.sub, self.runner] if self.snapshot != "none" else [self.sub]

    def restore_sink(self, position: int) -> None:
        """The sink's database as a backup taken when it held ``position`` had it."""
        self.sites.stop("b")
        with self.sink.write() as conn:
            conn.execute(update(s.sink_progress).values(last_position=position))
            conn.execute(delete(events).where(events.c.kind == "log", events.c.position > position))

    def config_path(self) -> str:
        return str(self.sites.tmp_path / "a.toml")


def wait_stopped(pair: Pair, reason: str) -> None:
    def session_says_stopped() -> bool:
        rows = pair.src.inspection.list_session_status()
        return (
            bool(rows) and rows[0]["state"] == "stream_stopped" and reason in rows[0]["last_error"]
        )

    wait_for(session_says_stopped, timeout=60)


@pytest.mark.parametrize("case", ["behind the trim point", "ahead of the source"])
def test_a_stream_the_source_cannot_complete_stops_until_the_loss_is_accepted(
    sites: Sites, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr.session")
    pair = Pair(sites, "none", EventListener())
    pair.start_sink()
    pair.start_source()
    with running(*pair.loops()):
        pair.write(20)
        wait_for(lambda: logs(pair.sink) == list(range(1, 21)), timeout=60)
        wait_for(lambda: pair.src.shipping.get_cursor("b", "policy").position == 20)
    if case == "behind the trim point":
        pair.restore_sink(5)
        assert pair.src.retention.trim() == 20
        assert pair.src.retention.trimmed_through("b", "policy") == 20
        first_missing, reason = 6, "behind what this source still holds"
    else:  # the source's database is older than the sink's
        pair.restore_sink(1000)
        first_missing, reason = 21, "this source's head is 30"
    before = seen(pair.sink)
    pair.write(10)  # positions 21..30
    pair.start_sink()
    with running(*pair.loops()):
        wait_stopped(pair, reason)
        # Stopped: nothing after the hole reached the sink, status and metric say so.
        assert seen(pair.sink) == before
        assert pair.sink.recv.sink_progress("a", "policy").last_position in (5, 1000)
        assert stopped_gauge() == 1.0
        report = collect_status(sites.running["a"].config, pair.src)
        (stream,) = report.send
        assert stream.state == StreamState.STOPPED and stream.stop is not None
        assert reason in stream.stop.reason
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "stopped" in r.msg]
        assert len(errors) == 1, errors

        result = CliRunner().invoke(
            cli, ["accept-loss", "--config", pair.config_path(), "-d", "b", "--client", "policy"]
        )
        assert result.exit_code == 0, result.output
        wait_for(lambda: logs(pair.sink)[-1:] == [30], timeout=60)
        # The notice's acknowledgement may come back after the entries behind it.
        wait_for(lambda: resumed(pair.src.retention.get_stream_stop("b", "policy")))
        wait_for(lambda: stopped_gauge() == 0.0)
    after = seen(pair.sink)[len(before) :]
    assert after == [("dropped", first_missing)] + [("log", p) for p in range(21, 31)]
    record = pair.src.retention.get_stream_stop("b", "policy")
    assert record is not None and not record.is_stopped
    (notice,) = pair.sink.recv.list_sink_drops()
    assert notice.first_dropped_position == first_missing
    assert "accepted" in notice.reason
    (sink_stream,) = collect_status(sites.running["b"].config, pair.sink).sink
    assert sink_stream.drop is not None
    assert sink_stream.drop.first_dropped_position == first_missing
    # A reconnection with nothing shipped since does not stop the stream again.
    pair.sites.stop("b")
    pair.start_sink()
    pair.write(3)
    with running(*pair.loops()):
        wait_for(lambda: logs(pair.sink)[-1:] == [33], timeout=60)
    assert seen(pair.sink)[len(before) + 11 :] == [("log", 31), ("log", 32), ("log", 33)]
    assert pair.src.inspection.list_session_status()[0]["state"] != "stream_stopped"
    again = CliRunner().invoke(
        cli, ["accept-loss", "--config", pair.config_path(), "-d", "b", "--client", "policy"]
    )
    assert again.exit_code == 1 and "not stopped" in again.stderr


def test_behind_the_trim_point_with_a_provider_gets_one_notice_then_a_full_sync(
    sites: Sites,
) -> None:
    listener = EventListener(fail_first_drop=True)
    pair = Pair(sites, "app", listener)
    pair.start_sink()
    pair.start_source()
    with running(*pair.loops()):
        pair.wait_first_contact()
        pair.write(20)
        wait_for(lambda: len(logs(pair.sink)) == 20, timeout=60)
        wait_for(lambda: pair.src.shipping.get_cursor("b", "policy").position == pair.n)
    cursor = pair.src.shipping.get_cursor("b", "policy").position
    sink_at = cursor - 15
    pair.restore_sink(sink_at)
    assert pair.src.retention.trim() > 0
    before = seen(pair.sink)
    pair.write(10)
    pair.start_sink()
    with running(*pair.loops()):

        def synced() -> bool:
            snaps = pair.src.snapshots.list_snapshots("b", "policy")
            return any(x.status is SnapshotStatus.COMPLETED and "behind" in x.reason for x in snaps)

        wait_for(synced, timeout=60)
        pair.write(3)
        wait_for(lambda: logs(pair.sink)[-1:] == [pair.n], timeout=60)
        wait_for(lambda: kvapp.table(pair.sink.engine) == kvapp.table(pair.src.engine))
    after = seen(pair.sink)[len(before) :]
    # The notice first (exactly once, although its first delivery was rolled back),
    # then the full sync, then log entries after its base.
    assert after[0] == ("dropped", sink_at + 1)
    assert [k for k, _ in after].count("dropped") == 1
    assert listener.drop_calls == 2
    assert after[1] == ("start", 0) and ("end", 0) in after
    assert [k for k, _ in after[after.index(("end", 0)) + 1 :]] == ["log"] * (
        len(after) - after.index(("end", 0)) - 1
    )
    (snap,) = [x for x in pair.src.snapshots.list_snapshots("b", "policy") if "behind" in x.reason]
    assert snap.status is SnapshotStatus.COMPLETED
    assert (
        pair.src.retention.list_drops() == []
        and pair.src.retention.get_stream_stop("b", "policy") is None
    )


def test_behind_the_cursor_with_nothing_trimmed_replays_without_a_full_sync(
    sites: Sites,
) -> None:
    pair = Pair(sites, "app", EventListener())
    pair.start_sink()
    pair.start_source()
    with running(*pair.loops()):
        pair.wait_first_contact()
        pair.write(20)
        wait_for(lambda: len(logs(pair.sink)) == 20, timeout=60)
        wait_for(lambda: pair.src.shipping.get_cursor("b", "policy").position == pair.n)
    delivered = logs(pair.sink)
    syncs = [k for k, _ in seen(pair.sink)].count("start")
    pair.restore_sink(delivered[4])
    pair.write(10)
    pair.start_sink()
    with running(*pair.loops()):
        wait_for(lambda: logs(pair.sink)[-1:] == [pair.n], timeout=60)
        wait_for(lambda: kvapp.table(pair.sink.engine) == kvapp.table(pair.src.engine))
    final = logs(pair.sink)
    # Every entry once, in order, and no second full sync.
    assert final == sorted(set(final)) and final[:20] == delivered
    assert len(final) == 30
    assert [k for k, _ in seen(pair.sink)].count("start") == syncs
    assert "dropped" not in [k for k, _ in seen(pair.sink)]


def test_a_full_sync_request_for_a_client_without_provider_is_cancelled(sites: Sites) -> None:
    pair = Pair(sites, "none", EventListener())
    pair.start_sink()
    pair.start_source()
    with running(*pair.loops()):
        pair.write(5)
        wait_for(lambda: logs(pair.sink) == [1, 2, 3, 4, 5], timeout=60)
        sid = pair.src.snapshots.request_snapshot(None, "b", "policy", "by the library")

        def cancelled() -> bool:
            req = pair.src.snapshots.get_snapshot(sid)
            return req is not None and req.status is SnapshotStatus.CANCELLED

        wait_for(cancelled, timeout=60)
        req = pair.src.snapshots.get_snapshot(sid)
        assert req is not None and "no snapshot provider" in req.reason
        pair.write(5)
        wait_for(lambda: logs(pair.sink) == list(range(1, 11)), timeout=60)
    assert pair.src.snapshots.list_snapshots("b", "policy") == [req]
    assert [k for k, _ in seen(pair.sink)] == ["log"] * 10


def test_trim_marks_follow_each_destination(store: SQLAlchemyQueueStore) -> None:
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b", "c"])
    for dests in (["b"], ["b", "c"], ["c"], ["b"], ["c"]):  # positions 1..5
        new_slot(store)  # PostgreSQL: each apart, so a trim retires entry by entry
        with store.engine.begin() as conn:
            client.transmit_log_entry_message(conn, b"x", dests)
    store.shipping.set_cursor("b", "policy", 4)
    store.shipping.set_cursor("c", "policy", 2)
    assert store.retention.trim() == 3  # 1, 2 and 4 (3 and 5 wait for c)
    assert store.retention.trimmed_through("b", "policy") == 4
    assert store.retention.trimmed_through("c", "policy") == 2
    assert store.retention.trimmed_through("b", "other") == 0
    store.shipping.set_cursor("c", "policy", 5)
    assert store.retention.trim() == 2
    assert store.retention.trimmed_through("c", "policy") == 5
    assert store.retention.trimmed_through("b", "policy") == 4


def test_a_drop_notice_is_queued_once_and_moves_a_sink_back(store: SQLAlchemyQueueStore) -> None:
    from lr_client.records import ReplicationType, WireEntry

    entries = [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"x") for p in (3, 9, 12)]
    store.recv.apply_log_batch("a", "policy", entries, 0)
    assert store.recv.apply_drop_notice("a", "policy", "d1", 10, "why") is True
    assert store.recv.sink_progress("a", "policy").last_position == 9
    assert store.recv.apply_drop_notice("a", "policy", "d1", 10, "why") is False  # a re-send
    (queue,) = store.queues.list_queues("policy")
    with store.read() as conn:
        queued = store.queues.read_queue(conn, queue.queue_id, 10)
    assert [(e.type, e.source_position) for e in queued] == [
        (ReplicationType.LOG_ENTRY_SYNC, 3),
        (ReplicationType.LOG_ENTRY_SYNC, 9),
        (ReplicationType.LOG_ENTRY_SYNC, 12),
        (ReplicationType.STREAM_DROPPED, 10),
    ]
    assert queued[-1].payload == b"why" and queued[-1].snapshot_id == "d1"
    # Behind the notice's position already: the sink's position stays.
    assert store.recv.apply_drop_notice("a", "policy", "d2", 20, "again") is True
    assert store.recv.sink_progress("a", "policy").last_position == 9
    (notice,) = store.recv.list_sink_drops()
    assert (notice.notice_id, notice.first_dropped_position) == ("d2", 20)


def test_the_receiver_checks_drop_notices(store: SQLAlchemyQueueStore) -> None:
    from lr_client._proto import replication_pb2 as pb
    from lr_client.errors import ProtocolError
    from lr_server.receiving.receiver import Receiver

    receiver = Receiver(store, "b", ["a"])
    assert receiver.negotiate("a", pb.NegotiateRequest(clients=["policy"])).drop_notices

    def notice(sid: str, kind: str = "STREAM_DROPPED", n: int = 1) -> pb.ReplicationBatch:
        entry = pb.RoutingTableEntryMsg(type=kind, position=6, opaque_payload=b"lost")  # type: ignore[arg-type]
        return pb.ReplicationBatch(
            batch_id=1,
            client_name="policy",
            kind=pb.BATCH_DROP_NOTICE,
            snapshot_id=sid,
            entries=[entry] * n,
        )

    for bad in (notice("d1", "LOG_ENTRY_SYNC"), notice("d1", n=2), notice("not-alnum")):
        with pytest.raises(ProtocolError):
            receiver.apply("a", bad)
    assert store.recv.list_sink_drops() == []
    assert receiver.apply("a", notice("d1")).duplicate is False
    assert receiver.apply("a", notice("d1")).duplicate is True
    (queue,) = store.queues.list_queues("policy")
    assert store.queues.queue_depth(queue.queue_id) == 1


@pytest.mark.parametrize("action", ["sink made whole", "provider configured"])
def test_a_stopped_stream_resumes_when_the_operator_fixes_the_cause(
    sites: Sites, action: str
) -> None:
    listener = EventListener()
    pair = Pair(sites, "none", listener)
    pair.start_sink()
    pair.start_source()
    with running(*pair.loops()):
        pair.write(20)
        wait_for(lambda: logs(pair.sink) == list(range(1, 21)), timeout=60)
        wait_for(lambda: pair.src.shipping.get_cursor("b", "policy").position == 20)
    pair.restore_sink(5)
    assert pair.src.retention.trim() == 20
    pair.start_sink()
    with running(*pair.loops()):
        wait_stopped(pair, "behind what this source still holds")
    if action == "sink made whole":
        pair.restore_sink(20)  # a newer backup: everything it acknowledged
        with pair.sink.write() as conn:
            conn.execute(insert(events), [{"kind": "log", "position": p} for p in range(6, 21)])
        pair.write(5)
        pair.start_sink()
        with running(*pair.loops()):
            wait_for(lambda: logs(pair.sink)[-1:] == [25], timeout=60)
        assert logs(pair.sink) == list(range(1, 26))
        assert "dropped" not in [k for k, _ in seen(pair.sink)]
    else:
        pair.sites.stop("a")
        pair.snapshot = "app"
        pair.start_source()
        with running(*pair.loops()):

            def synced() -> bool:
                snaps = pair.src.snapshots.list_snapshots("b", "policy")
                return any(x.status is SnapshotStatus.COMPLETED for x in snaps)

            wait_for(synced, timeout=60)
            # The snapshot is delivered once whole at the sink: wait for its end callback.
            wait_for(lambda: [k for k, _ in seen(pair.sink)][-1:] == ["end"], timeout=60)
            assert kvapp.table(pair.sink.engine) == kvapp.table(pair.src.engine)
        kinds = [k for k, _ in seen(pair.sink)]
        assert kinds == ["log"] * 5 + ["dropped", "start", "end"]
        assert seen(pair.sink)[5] == ("dropped", 6)
    assert pair.src.retention.get_stream_stop("b", "policy") is None
    assert stopped_gauge() == 0.0
    assert pair.src.inspection.list_session_status()[0]["last_error"] == ""


def test_a_destination_dropped_by_retention_is_told_before_its_full_sync(
    sites: Sites,
) -> None:
    listener = EventListener(fail_first_drop=True)
    pair = Pair(sites, "app", listener, dests=("b", "c", "d"))
    pair.start_sink()
    for healthy in ("c", "d"):  # a majority keeps up: b is dropped, not throttled
        sites.store(healthy)
        sites.start(healthy, sources=["a"])
    pair.sites.start(
        "a",
        dests=pair.dests,
        snapshot="app",
        extra="[retention]\nmax_entries = 10\ntrim_interval = 0.1\nrotation_period = 0.5\n",
    )
    with running(*pair.loops()):
        pair.wait_first_contact()
        pair.write(3)
        wait_for(lambda: logs(pair.sink)[-1:] == [pair.n], timeout=60)
        pair.sites.stop("b")
        before = seen(pair.sink)
        pair.write(30)
        wait_for(lambda: bool(pair.src.retention.list_drops()), timeout=60)
        (drop,) = pair.src.retention.list_drops()
        pair.start_sink()

        def since_drop() -> list[SnapshotRequest]:  # oldest first
            snaps = pair.src.snapshots.list_snapshots("b", "policy")
            return sorted(
                (x for x in snaps if x.created_at >= drop.dropped_at), key=lambda x: x.created_at
            )

        def resynced() -> bool:  # a retry (a provider judged stalled on a busy machine) counts
            return any(x.status is SnapshotStatus.COMPLETED for x in since_drop())

        def state() -> str:  # where it stopped, if it does
            snaps = [
                (x.snapshot_id, x.status.value, x.reason)
                for x in pair.src.snapshots.list_snapshots("b", "policy")
            ]
            return (
                f"snapshots of b: {snaps}; the sink's events since the stop:"
                f" {seen(pair.sink)[len(before) :][-10:]}; drop calls {listener.drop_calls}"
            )

        wait_for(resynced, timeout=60, what="b's full sync after its drop", detail=state)
        assert "dropped" in since_drop()[0].reason, state()
        wait_for(lambda: kvapp.table(pair.sink.engine) == kvapp.table(pair.src.engine))
    after = seen(pair.sink)[len(before) :]
    assert after[:2] == [("dropped", drop.first_dropped_position), ("start", 0)]
    assert [k for k, _ in after].count("dropped") == 1 and listener.drop_calls == 2
    assert pair.sink.recv.list_sink_drops()[0].reason == drop.reason


def test_a_sink_without_drop_notices_gets_none_and_the_stream_still_resumes(
    sites: Sites, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lr_server.receiving.receiver import Receiver

    plain = Receiver.negotiate

    def older_sink(self: Receiver, source_id: str, request: object) -> object:
        response = plain(self, source_id, request)  # type: ignore[arg-type]
        response.drop_notices = False  # what a sink of an older version answers
        return response

    monkeypatch.setattr(Receiver, "negotiate", older_sink)
    pair = Pair(sites, "none", EventListener())
    pair.start_sink()
    pair.start_source()
    with running(*pair.loops()):
        pair.write(20)
        wait_for(lambda: logs(pair.sink) == list(range(1, 21)), timeout=60)
        wait_for(lambda: pair.src.shipping.get_cursor("b", "policy").position == 20)
    pair.restore_sink(5)
    assert pair.src.retention.trim() == 20
    pair.write(10)
    pair.start_sink()
    with running(*pair.loops()):
        wait_stopped(pair, "behind what this source still holds")
        assert logs(pair.sink) == [1, 2, 3, 4, 5]
        assert pair.src.retention.accept_stream_loss("b", "policy") is not None
        wait_for(lambda: logs(pair.sink)[-1:] == [30], timeout=60)
    assert seen(pair.sink) == [("log", p) for p in [1, 2, 3, 4, 5, *range(21, 31)]]
    assert pair.sink.recv.list_sink_drops() == []
    record = pair.src.retention.get_stream_stop("b", "policy")
    assert record is not None and record.resumed_at is not None


def test_a_cursor_lowered_during_a_trim_waits_for_its_trim_marks(
    store: SQLAlchemyQueueStore,
) -> None:
    """The replay's cursor write and its trim mark read never straddle a trim."""
    from sqlalchemy import text

    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    with store.engine.begin() as conn:
        refs = [client.transmit_log_entry_message(conn, b"x", ["b"]) for _ in range(5)]
    assert client.positions_of(refs) == [1, 2, 3, 4, 5]
    store.shipping.set_cursor("b", "policy", 5)
    marks: list[int] = []

    def session_replays_after_2() -> None:
        store.shipping.set_cursor("b", "policy", 2)
        marks.append(store.retention.trimmed_through("b", "policy"))

    def trim_in(conn: Connection) -> int:
        """The trim's own transaction, left open: how many entries it retires."""
        if isinstance(store.core, PostgresCore):
            key = store.core._tick_lock(conn)
            acked, record = store.retention.acked_positions, store.retention.record_trim_marks
            return slots.retire(conn, key, acked, record, period=0.0).entries
        assert isinstance(store.core, SQLiteCore)
        return store.core._trim_log(conn, 100, store.retention)

    replay = threading.Thread(target=session_replays_after_2)
    with store.write(consistent=store.dialect == "sqlite") as conn:
        assert trim_in(conn) == 5  # judged by cursor 5, not yet committed
        replay.start()
        if store.dialect == "postgresql":  # the cursor write waits for this trim

            def waiting() -> bool:
                with store.engine.connect() as probe:
                    return bool(
                        probe.execute(
                            text(
                                "SELECT count(*) FROM pg_locks l JOIN pg_class c "
                                "ON c.oid = l.relation WHERE NOT l.granted "
                                "AND c.relname = 'lrq_cursors'"
                            )
                        ).scalar()
                    )

            wait_for(waiting, timeout=30)
    replay.join(timeout=60)
    # The session saw the deletion's mark, so it knows 3..5 are gone.
    assert marks == [5]
