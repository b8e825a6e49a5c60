"""A sender session's steps without a transport, on SQLite and PostgreSQL.

The negotiation response goes to :meth:`SenderSession._plan` as the transport
would hand it over; acknowledgements go to its :meth:`Acknowledgements.on_ack` for
batches placed in its window. What the session then holds per client (its
streams) and what the store holds (cursors, requests, drops, stops) is compared
field by field.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest
from prometheus_client import REGISTRY

from lr_client._proto import replication_pb2 as pb
from lr_client.cascade_roles import CascadeRole
from lr_client.errors import FencedError, IncompatibleVersionError
from lr_client.records import (
    OPEN_SNAPSHOT_STATUSES,
    CascadeNode,
    ReplicationType,
    SnapshotRequest,
    SnapshotStatus,
    WireEntry,
)
from lr_client.store import SQLAlchemyQueueStore
from lr_server.config import ClientConfig, ReplicationConfig, SnapshotProvider
from lr_server.protocol import versions as protocol
from lr_server.sending.request_board import read_requests
from lr_server.sending.session import SenderSession
from lr_server.sending.streams import ClientStream, Lanes, Mode, Notice, SessionState
from lr_server.sending.window import FLUSH_INTERVAL, InFlight, Window
from lr_server.transport.base import BatchStream, Transport
from tests.kit import leases
from tests.kit.positions import new_slot
from tests.kit.snapshots import ready_snapshot

DEST = "b"
APP, NONE = SnapshotProvider.APP, SnapshotProvider.NONE


def _no_transport() -> Transport:
    raise AssertionError("these tests call the session's steps directly")


def session(store: SQLAlchemyQueueStore, **clients: SnapshotProvider) -> SenderSession:
    store.sites.register_sites([DEST, "c"])
    configs = [ClientConfig(name, provider) for name, provider in clients.items()]
    return SenderSession(
        store, "a", DEST, configs, _no_transport, ReplicationConfig(window_batches=8)
    )


def sink(notices: bool = True, **clients: tuple[int, int, str, int]) -> pb.NegotiateResponse:
    """The sink's answer: per client (last position, snapshot state, snapshot id, ordinal)."""
    return pb.NegotiateResponse(
        sink_id=DEST,
        drop_notices=notices,
        protocol_version=2,
        clients=[
            pb.ClientState(
                client_name=name,
                last_position=last,
                snapshot_state=state,  # type: ignore[arg-type]
                snapshot_id=sid,
                snapshot_position=ordinal,
            )
            for name, (last, state, sid, ordinal) in clients.items()
        ],
    )


def log_at(position: int) -> tuple[int, int, str, int]:
    return (position, pb.SNAPSHOT_NONE, "", 0)


def _write(store: SQLAlchemyQueueStore, n: int, client: str = "policy") -> None:
    """``n`` log entries of ``client`` for b, each apart (PostgreSQL: in a slot of its own)."""
    nums = store.sites.site_numbers()
    for _ in range(n):
        new_slot(store)
        with store.write() as conn:
            store.send.append_log_entries(conn, client, [(b"x", [nums[DEST]])])


def _ready(store: SQLAlchemyQueueStore, client: str = "policy", rows: int = 2) -> SnapshotRequest:
    return ready_snapshot(
        store, store.snapshots.request_snapshot(None, DEST, client, "asked"), rows
    )


def _lease(store: SQLAlchemyQueueStore, s: SenderSession, *clients: str) -> None:
    """This member holds the streams of ``clients`` (the session writes under their fences)."""
    s.fences = {c: leases.hold(store, f"stream/{DEST}/{c}") for c in clients}


def _state(cs: ClientStream) -> tuple[object, ...]:
    return (cs.mode, cs.sent, cs.snapshot, cs.snap_sent, cs.notice, cs.stop_reason)


# -- negotiation ---------------------------------------------------------------------------
def test_log_streams_resume_where_the_sink_is_and_cursors_follow_it(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE, orders=NONE, audit=NONE)
    _write(store, 9)
    _write(store, 4, "orders")
    store.shipping.set_cursor(DEST, "policy", 3)
    store.shipping.set_cursor(DEST, "orders", 12)
    store.shipping.set_cursor("c", "audit", 2)
    streams = s._plan(sink(policy=log_at(5), orders=log_at(11), audit=log_at(0)))
    assert list(streams) == ["policy", "orders", "audit"]
    assert _state(streams["policy"]) == (Mode.LOG, 5, None, 0, None, "")
    assert _state(streams["orders"]) == (Mode.LOG, 11, None, 0, None, "")
    assert _state(streams["audit"]) == (Mode.LOG, 0, None, 0, None, "")
    assert streams["policy"].config == ClientConfig("policy", NONE)
    cursors = {(c.destination, c.client_name): c.position for c in store.shipping.list_cursors()}
    # Raised to an ack that was lost; lowered to replay what the sink lacks; c's untouched.
    assert cursors == {(DEST, "policy"): 5, (DEST, "orders"): 11, ("c", "audit"): 2}
    assert s.stops.notices is True
    s._plan(sink(notices=False, policy=log_at(5)))
    assert s.stops.notices is False
    assert store.snapshots.list_snapshots() == [] and store.retention.list_drops() == []


@pytest.mark.parametrize(("cursor", "sink_at"), [(3, 5), (5, 2)], ids=["raised", "lowered"])
def test_a_cursor_moved_by_negotiation_is_written_under_the_streams_lease(
    store: SQLAlchemyQueueStore, cursor: int, sink_at: int
) -> None:
    s = session(store, policy=NONE, orders=NONE)
    _lease(store, s, "policy", "orders")
    _write(store, 9)
    store.shipping.set_cursor(DEST, "policy", cursor)
    streams = s._plan(sink(policy=log_at(sink_at), orders=log_at(0)))
    assert streams["policy"].sent == sink_at
    assert store.shipping.get_cursor(DEST, "policy").position == sink_at


@pytest.mark.parametrize(("cursor", "sink_at"), [(3, 5), (5, 2)], ids=["raised", "lowered"])
def test_a_cursor_moved_by_negotiation_needs_the_streams_current_lease(
    store: SQLAlchemyQueueStore, cursor: int, sink_at: int
) -> None:
    """Another member took the stream over while this one negotiated: its plan's cursor
    writes are refused and the cursor stays where the owner left it."""
    s = session(store, policy=NONE)
    _write(store, 9)
    store.shipping.set_cursor(DEST, "policy", cursor)
    _lease(store, s, "policy")
    leases.take_over(store, "stream/b/policy")
    with pytest.raises(FencedError):
        s._plan(sink(policy=log_at(sink_at)))
    assert store.shipping.get_cursor(DEST, "policy").position == cursor


@pytest.mark.parametrize("child_at", [5, 9])
def test_a_relayed_stream_resumes_where_the_child_is_within_what_the_branch_received(
    store: SQLAlchemyQueueStore, child_at: int
) -> None:
    """A branch relays ``policy`` of the root: the stream's head is the last entry it
    received, or the child's if higher (entries it forwarded before storing them)."""
    store.sites.register_sites([DEST, "c"])
    node = CascadeNode("policy", "root", CascadeRole.BRANCH, provider_id="root")
    s = SenderSession(
        store,
        "a",
        DEST,
        [ClientConfig("policy", NONE)],
        _no_transport,
        ReplicationConfig(window_batches=8),
        cascade={"policy": node},
    )
    entries = [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"x") for p in range(1, 8)]
    store.recv.apply_log_batch("root", "policy", entries)
    streams = s._plan(sink(policy=log_at(child_at)))
    assert _state(streams["policy"]) == (Mode.LOG, child_at, None, 0, None, "")
    assert store.retention.get_stream_stop(DEST, "policy") is None
    assert store.retention.list_drops(DEST) == []


def test_a_sink_behind_the_trim_point_is_dropped_to_a_full_sync_with_a_notice_first(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    _write(store, 9)
    store.shipping.set_cursor(DEST, "policy", 6)
    assert store.retention.trim() == 6
    streams = s._plan(sink(policy=log_at(2)))
    reason = (
        "the sink is at position 2, behind what this source still holds "
        "(entries of the stream up to 6 were trimmed)"
    )
    (drop,) = store.retention.list_drops()
    assert (drop.destination, drop.client_name, drop.first_dropped_position, drop.reason) == (
        DEST,
        "policy",
        3,
        reason,
    )
    (req,) = store.snapshots.list_snapshots(DEST, "policy")
    assert (req.status, req.reason) == (SnapshotStatus.REQUESTED, reason)
    notice = Notice(f"d{int(drop.dropped_at * 1e6)}", 3, reason)
    assert _state(streams["policy"]) == (Mode.SNAPSHOT, 0, req, 0, notice, "")
    assert store.shipping.get_cursor(DEST, "policy").position == 2  # lowered before the trim mark


def test_a_sink_behind_the_trim_point_without_provider_stops_its_stream(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    _write(store, 9)
    store.shipping.set_cursor(DEST, "policy", 6)
    store.retention.trim()
    streams = s._plan(sink(policy=log_at(2)))
    reason = (
        "the sink is at position 2, behind what this source still holds "
        "(entries of the stream up to 6 were trimmed)"
    )
    assert _state(streams["policy"]) == (Mode.STOPPED, 0, None, 0, None, f"policy: {reason}")
    stop = store.retention.get_stream_stop(DEST, "policy")
    assert stop is not None and (stop.reason, stop.resume_after) == (reason, 2)
    assert store.snapshots.list_snapshots() == [] and store.retention.list_drops() == []


def test_first_contact_with_a_provider_requests_a_full_sync(
    store: SQLAlchemyQueueStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr.session")
    s = session(store, policy=APP, orders=NONE)
    _write(store, 3)
    streams = s._plan(sink(policy=log_at(0), orders=log_at(0)))
    (req,) = store.snapshots.list_snapshots(DEST, "policy")
    assert (req.status, req.reason) == (SnapshotStatus.REQUESTED, "first contact")
    assert _state(streams["policy"]) == (Mode.SNAPSHOT, 0, req, 0, None, "")
    assert _state(streams["orders"]) == (Mode.LOG, 0, None, 0, None, "")  # checked, then log
    assert f"b/policy: full sync {req.snapshot_id} (first contact)" in [
        r.getMessage() for r in caplog.records
    ]


def test_a_full_sync_asked_at_resume_is_not_asked_again_from_an_older_shared_read(
    store: SQLAlchemyQueueStore,
) -> None:
    """The sessions share reads of the requests (the board): one begun before this
    session asked for its full sync at resume does not hold it. Taken for this
    session's, its request would seem gone ("previous snapshot did not complete")
    and be made again, leaving the one it shares with other destinations."""
    s = session(store, policy=APP)
    store.snapshots.request_snapshot(None, "c", "policy", "c's first contact")
    older = read_requests(store)  # another session's read, begun before b asked
    streams = s._plan(sink(policy=log_at(0)))
    shared = streams["policy"].snapshot
    assert shared is not None and older.open_snapshot(DEST, "policy") is None
    s.requests.check(streams, older)
    assert streams["policy"].snapshot == store.snapshots.get_snapshot(shared.snapshot_id, DEST)
    assert [x.snapshot_id for x in store.snapshots.list_snapshots(DEST, "policy")] == [
        shared.snapshot_id
    ]
    assert sorted(
        x.destination
        for x in store.snapshots.list_snapshots(
            client_name="policy", statuses=OPEN_SNAPSHOT_STATUSES
        )
    ) == [DEST, "c"]


def test_first_contact_joining_another_destinations_full_sync_holds_its_own_view(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    sid = store.snapshots.request_snapshot(None, "c", "policy", "c's first contact")
    streams = s._plan(sink(policy=log_at(0)))
    req = streams["policy"].snapshot
    assert req is not None and req.snapshot_id == sid
    assert req == store.snapshots.get_snapshot(sid, DEST)
    assert (req.destination, req.reason) == (DEST, "first contact")


def test_a_dropped_stream_is_told_of_its_drop_before_its_full_sync(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    _write(store, 9)
    store.shipping.set_cursor(DEST, "policy", 4)
    drop = store.retention.drop_stream(DEST, "policy", "too far behind")
    assert drop is not None
    streams = s._plan(sink(policy=log_at(4)))
    (req,) = store.snapshots.list_snapshots(DEST, "policy")
    assert (req.status, req.reason) == (SnapshotStatus.REQUESTED, "dropped for falling behind")
    notice = Notice(f"d{int(drop.dropped_at * 1e6)}", 5, "too far behind")
    assert _state(streams["policy"]) == (Mode.SNAPSHOT, 0, req, 0, notice, "")
    assert store.retention.list_drops() == [drop]


def test_a_sink_past_a_restored_sources_head_is_dropped_from_the_head(
    store: SQLAlchemyQueueStore,
) -> None:
    """The cursor (35) is past the head (30) too: the drop starts after the head."""
    s = session(store, policy=APP)
    _write(store, 30)
    store.shipping.set_cursor(DEST, "policy", 35)
    s._plan(sink(policy=log_at(40)))
    (drop,) = store.retention.list_drops()
    assert drop.first_dropped_position == 31
    assert drop.reason.startswith("the sink is at position 40 but this source's head is 30")


def test_a_transfer_in_progress_continues_after_what_the_sink_holds(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    req = _ready(store, rows=5)
    streams = s._plan(sink(policy=(7, pb.SNAPSHOT_ONGOING, req.snapshot_id, 3)))
    assert _state(streams["policy"]) == (Mode.SNAPSHOT, 0, req, 3, None, "")
    assert store.snapshots.list_snapshots(DEST) == [req]


def test_a_snapshot_the_sink_completed_is_finished_when_its_ack_was_lost(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    _lease(store, s, "policy")
    _write(store, 4)
    store.shipping.set_cursor(DEST, "policy", 1, needs_snapshot=True)
    store.retention.drop_stream(DEST, "policy", "behind")
    req = _ready(store)
    assert req.base_position == 4
    _write(store, 2)
    # The sink has the snapshot and the log entry after its base: both acks were lost.
    streams = s._plan(sink(policy=(5, pb.SNAPSHOT_COMPLETED, req.snapshot_id, 3)))
    done = store.snapshots.get_snapshot(req.snapshot_id)
    assert done is not None and done.status is SnapshotStatus.COMPLETED
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (5, False)
    assert store.retention.list_drops() == []
    assert _state(streams["policy"]) == (Mode.LOG, 5, None, 0, None, "")


def test_a_lease_lost_while_finishing_a_completed_snapshot_keeps_the_new_owners_cursor(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = session(store, policy=APP)
    _lease(store, s, "policy")
    _write(store, 4)
    store.shipping.set_cursor(DEST, "policy", 1, needs_snapshot=True)
    req = _ready(store)
    _write(store, 2)
    finish = s.requests.finish

    def finish_then_lose_the_lease(client: str, done: SnapshotRequest) -> None:
        finish(client, done)
        leases.take_over(store, "stream/b/policy")

    monkeypatch.setattr(s.requests, "finish", finish_then_lose_the_lease)
    with pytest.raises(FencedError):
        s._plan(sink(policy=(5, pb.SNAPSHOT_COMPLETED, req.snapshot_id, 3)))
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (4, False)  # the base, not 5


def test_an_open_request_of_a_client_without_provider_is_refused(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    _write(store, 2)
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "asked")
    streams = s._plan(sink(policy=log_at(2)))
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status is SnapshotStatus.CANCELLED
    assert _state(streams["policy"]) == (Mode.LOG, 2, None, 0, None, "")


def test_a_provider_configured_since_a_stop_clears_it_and_syncs(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    _write(store, 3)
    store.shipping.set_cursor(DEST, "policy", 3)
    store.retention.stop_stream(DEST, "policy", "needs a full sync", 1)
    streams = s._plan(sink(policy=log_at(1)))
    assert store.retention.get_stream_stop(DEST, "policy") is None
    assert streams["policy"].mode is Mode.LOG and streams["policy"].sent == 1


def test_a_stop_whose_loss_was_accepted_resumes_with_a_notice(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    _write(store, 3)
    store.retention.stop_stream(DEST, "policy", "needs a full sync", 2)
    stop = store.retention.accept_stream_loss(DEST, "policy")
    assert stop is not None and stop.accepted_at is not None
    streams = s._plan(sink(policy=log_at(1)))
    notice = Notice(
        f"a{int(stop.accepted_at * 1e6)}", 3, "loss accepted by an operator: needs a full sync"
    )
    assert _state(streams["policy"]) == (Mode.LOG, 2, None, 0, notice, "")
    assert (
        store.retention.get_stream_stop(DEST, "policy") == stop
    )  # resumed once the sink has the notice


def test_the_record_of_a_resumed_loss_is_kept(store: SQLAlchemyQueueStore) -> None:
    """It says what the operator accepted: a later negotiation needs it."""
    s = session(store, policy=NONE)
    _write(store, 3)
    store.retention.stop_stream(DEST, "policy", "lost", 1)
    store.retention.accept_stream_loss(DEST, "policy")
    store.retention.mark_stream_resumed(DEST, "policy")
    record = store.retention.get_stream_stop(DEST, "policy")
    assert record is not None and record.resumed_at is not None
    streams = s._plan(sink(policy=log_at(3)))
    assert _state(streams["policy"]) == (Mode.LOG, 3, None, 0, None, "")
    assert store.retention.get_stream_stop(DEST, "policy") == record


def test_a_stopped_stream_whose_sink_holds_what_it_needs_runs_again(
    store: SQLAlchemyQueueStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr.session")
    s = session(store, policy=NONE)
    _write(store, 3)
    store.retention.stop_stream(DEST, "policy", "was behind", 1)
    streams = s._plan(sink(policy=log_at(3)))
    assert _state(streams["policy"]) == (Mode.LOG, 3, None, 0, None, "")
    assert store.retention.get_stream_stop(DEST, "policy") is None
    assert "b/policy: no longer stopped: was behind" in [r.getMessage() for r in caplog.records]


def test_a_sink_too_old_is_refused_by_name(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = session(store, policy=NONE)
    monkeypatch.setattr(protocol, "MIN_PEER_VERSION", 2)
    old = sink(policy=log_at(0))
    old.protocol_version = 1
    with pytest.raises(IncompatibleVersionError) as caught:
        s._plan(old)
    assert str(caught.value).startswith("sink 'b' speaks wire protocol 1;")
    assert s._plan(sink(policy=log_at(0)))["policy"].mode is Mode.LOG


# -- acknowledgements ----------------------------------------------------------------------
def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def save_not_due(s: SenderSession) -> None:
    """No cursor save due, however slow the machine: as if one was just made."""
    s.window.flushed_at = time.monotonic() + 3600.0


def save_due(s: SenderSession) -> None:
    """A cursor save due: as if the last was made long ago."""
    s.window.flushed_at = time.monotonic() - 3600.0


def _inflight(
    s: SenderSession,
    client: str,
    kind: int,
    last: int,
    *,
    entries: int = 1,
    nbytes: int = 10,
    snapshot_id: str = "",
    is_end: bool = False,
    age: float = 0.0,
) -> int:
    bid = s.window.next_batch_id()
    s.window.add(
        InFlight(
            bid,
            client,
            kind,
            last,
            entries,
            nbytes,
            time.monotonic() - age,
            snapshot_id,
            is_end,
        )
    )
    return bid


def test_log_acks_move_cursors_and_count_what_was_shipped(store: SQLAlchemyQueueStore) -> None:
    s = session(store, policy=NONE, orders=NONE)
    streams = s._plan(sink(policy=log_at(0), orders=log_at(0)))
    labels = {"destination": DEST, "client": "policy"}
    before = (
        _sample("lr_entries_shipped_total", **labels),
        _sample("lr_bytes_shipped_total", **labels),
        _sample("lr_batches_acked_total", destination=DEST),
        _sample("lr_batch_latency_seconds_count", destination=DEST),
        _sample("lr_batch_latency_seconds_sum", destination=DEST),
    )
    first = _inflight(s, "policy", pb.BATCH_LOG_ENTRY, 4, entries=3, nbytes=30, age=0.5)
    _inflight(s, "orders", pb.BATCH_LOG_ENTRY, 9, entries=2, nbytes=7, age=0.5)
    third = _inflight(s, "policy", pb.BATCH_LOG_ENTRY, 12, entries=1, nbytes=5, age=0.5)
    s.acks.on_ack(pb.ReplicationAck(batch_id=first - 1), streams)  # settles nothing
    assert len(s.window) == 3 and store.shipping.list_cursors() == []
    s.acks.on_ack(pb.ReplicationAck(batch_id=first + 1), streams)
    assert _sample("lr_inflight_batches", destination=DEST) == 1
    # The first flush of a connection is due at once; the window is not empty.
    positions = {c.client_name: c.position for c in store.shipping.list_cursors()}
    assert positions == {"policy": 4, "orders": 9}
    assert s.window.cursors == {}
    save_not_due(s)  # as if just saved
    s.acks.on_ack(pb.ReplicationAck(batch_id=third), streams)
    assert s.window.cursors == {"policy": 12}  # the window is empty; saved when due
    save_due(s)  # a while later
    s.acks.on_ack(pb.ReplicationAck(batch_id=third), streams)  # a repeated ack: settles nothing
    assert {c.client_name: c.position for c in store.shipping.list_cursors()} == {
        "policy": 12,
        "orders": 9,
    }
    assert _sample("lr_inflight_batches", destination=DEST) == 0
    after = (
        _sample("lr_entries_shipped_total", **labels),
        _sample("lr_bytes_shipped_total", **labels),
        _sample("lr_batches_acked_total", destination=DEST),
        _sample("lr_batch_latency_seconds_count", destination=DEST),
        _sample("lr_batch_latency_seconds_sum", destination=DEST),
    )
    delta = [a - b for a, b in zip(after, before, strict=True)]
    assert delta[:4] == [4.0, 35.0, 3.0, 3.0]
    assert 1.5 <= delta[4] < 1.5 + 60  # three batches, each sent 0.5 s before its ack
    assert _sample("lr_entries_shipped_total", destination=DEST, client="orders") >= 2.0


def test_cursors_wait_while_batches_are_in_flight_and_a_flush_is_not_due(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    streams = s._plan(sink(policy=log_at(0)))
    save_not_due(s)  # just saved
    first = _inflight(s, "policy", pb.BATCH_LOG_ENTRY, 4)
    _inflight(s, "policy", pb.BATCH_LOG_ENTRY, 8)
    s.acks.on_ack(pb.ReplicationAck(batch_id=first), streams)
    assert s.window.cursors == {"policy": 4} and store.shipping.list_cursors() == []
    save_due(s)  # a while later
    before = time.monotonic()
    s.acks.flush_cursors()
    assert [(c.client_name, c.position) for c in store.shipping.list_cursors()] == [("policy", 4)]
    assert s.window.cursors == {} and before <= s.window.flushed_at <= time.monotonic()


def test_a_cursor_is_saved_only_under_the_streams_current_lease(
    store: SQLAlchemyQueueStore,
) -> None:
    """Another member took the stream over: the deposed owner's acks save nothing."""
    s = session(store, policy=NONE)
    streams = s._plan(sink(policy=log_at(0)))
    _lease(store, s, "policy")
    save_due(s)
    s.acks.on_ack(
        pb.ReplicationAck(batch_id=_inflight(s, "policy", pb.BATCH_LOG_ENTRY, 4)), streams
    )
    assert [(c.client_name, c.position) for c in store.shipping.list_cursors()] == [("policy", 4)]
    leases.take_over(store, "stream/b/policy")
    save_not_due(s)
    s.acks.on_ack(
        pb.ReplicationAck(batch_id=_inflight(s, "policy", pb.BATCH_LOG_ENTRY, 8)), streams
    )
    assert s.window.cursors == {"policy": 8}
    with pytest.raises(FencedError):
        s.acks.flush_cursors()
    assert [(c.client_name, c.position) for c in store.shipping.list_cursors()] == [("policy", 4)]


def test_lane_acks_move_the_cursor_to_what_every_lane_acknowledged(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    streams = s._plan(sink(policy=log_at(0)))
    streams["policy"].lanes = Lanes.at(2, 0)
    s.window = s.acks.window = Window(8, 1 << 20, streams=2)  # a stream per lane
    save_not_due(s)  # just saved: cursors wait in the window

    def lane_batch(lane: int, last: int, low_water: int) -> int:
        bid = s.window.next_batch_id()
        s.window.add(
            InFlight(
                bid,
                "policy",
                pb.BATCH_LOG_ENTRY,
                last,
                2,
                20,
                time.monotonic(),
                lane=lane,
                low_water=low_water,
            )
        )
        return bid

    before = _sample("lr_entries_shipped_total", destination=DEST, client="policy")
    ls = streams["policy"].lanes
    assert ls is not None
    first, second = lane_batch(1, 10, 0), lane_batch(2, 20, 10)
    ls.chunks.extend([(10, {first}), (20, {second})])
    ls.barrier = second
    s.acks.on_ack(pb.ReplicationAck(batch_id=first), streams)
    assert s.window.cursors == {}  # lane 2 may still lack entries below 10
    assert (ls.acked, ls.barrier) == (10, second)
    s.acks.on_ack(pb.ReplicationAck(batch_id=second), streams, 1)
    assert s.window.cursors == {"policy": 10}  # up to 10 acknowledged on every lane
    assert (ls.acked, ls.barrier, len(ls.chunks)) == (20, 0, 0)
    assert _sample("lr_entries_shipped_total", destination=DEST, client="policy") - before == 4.0


def test_the_ack_of_a_replayed_batch_moves_no_cursor_and_counts_no_shipment(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    streams = s._plan(sink(policy=log_at(0)))
    labels = {"destination": DEST, "client": "policy"}
    before = (
        _sample("lr_entries_shipped_total", **labels),
        _sample("lr_batches_acked_total", destination=DEST),
    )
    save_due(s)
    bid = s.window.next_batch_id()
    s.window.add(
        InFlight(bid, "policy", pb.BATCH_LOG_ENTRY, 20, 5, 50, time.monotonic(), replay=True)
    )
    first = _inflight(s, "policy", pb.BATCH_LOG_ENTRY, 3)
    s.acks.on_ack(pb.ReplicationAck(batch_id=first), streams)  # settles both
    assert len(s.window) == 0
    assert [(c.client_name, c.position) for c in store.shipping.list_cursors()] == [("policy", 3)]
    after = (
        _sample("lr_entries_shipped_total", **labels),
        _sample("lr_batches_acked_total", destination=DEST),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [1.0, 1.0]


class _Quiet(BatchStream):
    """A stream that acknowledges nothing (more): keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[pb.ReplicationBatch] = []

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.sent.append(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        time.sleep(timeout)
        return None

    def close(self) -> None:
        pass


def test_a_cursor_moved_by_the_last_ack_is_saved_by_the_wait_once_due(
    store: SQLAlchemyQueueStore,
) -> None:
    """At live rates each batch is alone in the window: its ack does not save the cursor
    at once (a write per batch); the wait for the next one saves it when it is due."""
    s = session(store, policy=NONE)
    streams = s._plan(sink(policy=log_at(0)))
    save_not_due(s)  # just saved
    s.acks.on_ack(
        pb.ReplicationAck(batch_id=_inflight(s, "policy", pb.BATCH_LOG_ENTRY, 4)), streams
    )
    assert len(s.window) == 0 and s.window.cursors == {"policy": 4}
    assert store.shipping.list_cursors() == []  # too soon after the last save
    s.window.flushed_at = time.monotonic()  # the next save due within the wait
    assert s.acks.wait(threading.Event(), _Quiet(), streams, 10 * FLUSH_INTERVAL) == 0
    assert [(c.client_name, c.position) for c in store.shipping.list_cursors()] == [("policy", 4)]
    assert s.window.cursors == {}


def test_a_stream_caught_up_since_the_last_wake_up_is_read_again_only_when_polled_or_woken(
    store: SQLAlchemyQueueStore,
) -> None:
    """After the ack of a caught-up read's batch, a round with no wake-up since that read
    skips the read (at live rates it would find nothing); a poll or a wake-up reads. Not
    where some transmits ring no one (PostgreSQL's notifications are rationed)."""
    s = session(store, policy=NONE)
    streams, stream = s._plan(sink(policy=log_at(0))), _Quiet()
    _write(store, 2)

    def ship(rung: float | None) -> list[int]:
        for f in list(s.window.batches):  # the sink acknowledges what it got
            s.acks.on_ack(pb.ReplicationAck(batch_id=f.batch_id), streams)
        before = len(stream.sent)
        s._ship(stream, streams, None, rung)
        return [e.position for b in stream.sent[before:] for e in b.entries]

    assert ship(None) == [1, 2]  # caught up
    _write(store, 1)  # its wake-up lost, or never rung
    if not store.shipping.every_send_wakes:
        assert ship(s._rung_at) == [3]  # read after each acknowledgement
        return
    assert ship(s._rung_at) == []  # an acknowledgement ended the wait: not read
    assert ship(None) == [3]  # the safety poll reads it
    _write(store, 1)
    s.wake()
    assert ship(s._rung_at) == [4]  # rung after the read: read
    assert ship(s._rung_at) == []
    streams["policy"].sent = 2  # sent back (a full sync's base): what it read is not sent
    assert ship(s._rung_at) == [3, 4]


def test_a_read_cut_by_its_bytes_is_not_taken_for_a_caught_up_one(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE)
    # Two entries of 1 byte: over half of 100 bytes, not of 140 (ENTRY_OVERHEAD: 32).
    s.shipper.cfg = dataclasses.replace(s.cfg, batch_max_bytes=100)
    streams, stream = s._plan(sink(policy=log_at(0))), _Quiet()
    _write(store, 2)
    s._ship(stream, streams, None, s._rung_at)
    assert [e.position for e in stream.sent[0].entries] == [1, 2]
    assert streams["policy"].caught_up is None
    s.shipper.cfg = dataclasses.replace(s.cfg, batch_max_bytes=140)
    streams["policy"].sent = 0  # read again (its batch acknowledged)
    s.acks.on_ack(pb.ReplicationAck(batch_id=stream.sent[0].batch_id), streams)
    s._ship(stream, streams, None, None)
    assert [e.position for e in stream.sent[1].entries] == [1, 2]
    assert streams["policy"].caught_up is not None


def test_acks_of_snapshot_batches_record_what_was_shipped(store: SQLAlchemyQueueStore) -> None:
    s = session(store, policy=APP)
    store.snapshots.request_snapshot(None, "c", "policy", "c's")  # shared with c
    req = _ready(store, rows=5)
    streams = s._plan(sink(policy=(0, pb.SNAPSHOT_ONGOING, req.snapshot_id, 0)))
    bid = _inflight(s, "policy", pb.BATCH_SNAPSHOT, 3, snapshot_id=req.snapshot_id)
    s.acks.on_ack(pb.ReplicationAck(batch_id=bid), streams)
    got = store.snapshots.get_snapshot(req.snapshot_id, DEST)
    assert got is not None and (got.status, got.shipped_position) == (SnapshotStatus.READY, 3)
    theirs = store.snapshots.get_snapshot(req.snapshot_id, "c")
    assert theirs is not None and theirs.shipped_position == 0
    assert _sample("lr_snapshot_rows", destination=DEST, client="policy") == 3
    assert store.shipping.list_cursors() == []


def test_the_ack_of_a_snapshots_end_completes_it_and_discards_earlier_log_cursors(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    _write(store, 6)
    req = _ready(store, rows=2)
    streams = s._plan(sink(policy=(0, pb.SNAPSHOT_ONGOING, req.snapshot_id, 0)))
    _inflight(s, "policy", pb.BATCH_LOG_ENTRY, 9)  # an old log batch still in flight
    end = _inflight(s, "policy", pb.BATCH_SNAPSHOT, 3, snapshot_id=req.snapshot_id, is_end=True)
    s.acks.on_ack(pb.ReplicationAck(batch_id=end), streams)
    got = store.snapshots.get_snapshot(req.snapshot_id)
    assert got is not None and got.status is SnapshotStatus.COMPLETED
    assert got.shipped_position == 0  # an end is not a shipped-rows update
    cs = streams["policy"]
    assert (cs.mode, cs.snapshot, cs.sent) == (Mode.LOG, None, 6)
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (6, False)


def test_the_full_sync_gauge_follows_each_streams_mode(store: SQLAlchemyQueueStore) -> None:
    s = session(store, policy=APP, orders=NONE)
    req = _ready(store, rows=2)
    streams = s._plan(sink(policy=(0, pb.SNAPSHOT_ONGOING, req.snapshot_id, 0), orders=log_at(0)))

    def active(client: str) -> float | None:
        return REGISTRY.get_sample_value(
            "lr_snapshot_active", {"destination": DEST, "client": client}
        )

    s._report(streams)
    assert (active("policy"), active("orders")) == (1.0, 0.0)
    assert s.state is SessionState.SNAPSHOT_SYNC
    end = _inflight(s, "policy", pb.BATCH_SNAPSHOT, 3, snapshot_id=req.snapshot_id, is_end=True)
    s.acks.on_ack(pb.ReplicationAck(batch_id=end), streams)
    s._report(streams)
    assert (active("policy"), active("orders")) == (0.0, 0.0)
    assert s.state is SessionState.LOG_ENTRY_SYNC


def test_the_end_of_a_superseded_snapshot_leaves_the_newer_one(
    store: SQLAlchemyQueueStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr.session")
    s = session(store, policy=APP)
    old = _ready(store, rows=2)
    streams = s._plan(sink(policy=(0, pb.SNAPSHOT_ONGOING, old.snapshot_id, 0)))
    newer = store.snapshots.request_snapshot(None, DEST, "policy", "again")
    streams["policy"].snapshot = store.snapshots.get_snapshot(newer)
    end = _inflight(s, "policy", pb.BATCH_SNAPSHOT, 3, snapshot_id=old.snapshot_id, is_end=True)
    s.acks.on_ack(pb.ReplicationAck(batch_id=end), streams)
    cs = streams["policy"]
    assert (cs.mode, cs.snapshot) == (Mode.SNAPSHOT, store.snapshots.get_snapshot(newer))
    assert [(r.snapshot_id, r.status) for r in store.snapshots.list_snapshots(DEST)] == [
        (newer, SnapshotStatus.REQUESTED),
        (old.snapshot_id, SnapshotStatus.CANCELLED),
    ]
    assert f"b/policy: end of superseded full sync {old.snapshot_id} acknowledged" in [
        r.getMessage() for r in caplog.records
    ]


def test_the_ack_of_an_accepted_loss_notice_resumes_the_stream(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=NONE, orders=NONE)
    _write(store, 3)
    streams = s._plan(sink(policy=log_at(0), orders=log_at(0)))
    store.retention.stop_stream(DEST, "policy", "lost", 2)
    store.retention.accept_stream_loss(DEST, "policy")
    store.retention.drop_stream(DEST, "orders", "behind")
    accepted = _inflight(s, "policy", pb.BATCH_DROP_NOTICE, 3, snapshot_id="a17")
    dropped = _inflight(s, "orders", pb.BATCH_DROP_NOTICE, 5, snapshot_id="d18")
    s.acks.on_ack(pb.ReplicationAck(batch_id=dropped), streams)
    assert accepted < dropped
    stop = store.retention.get_stream_stop(DEST, "policy")
    assert stop is not None and stop.resumed_at is not None
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (2, False)
    # A drop's notice moves nothing: its full sync follows.
    orders = store.shipping.get_cursor(DEST, "orders")
    assert (orders.position, orders.needs_snapshot) == (0, True)
    assert [d.client_name for d in store.retention.list_drops()] == ["orders"]
    assert store.snapshots.list_snapshots() == []


def test_the_ack_of_a_batch_of_a_snapshot_no_longer_ready_changes_nothing(
    store: SQLAlchemyQueueStore,
) -> None:
    s = session(store, policy=APP)
    req = _ready(store, rows=5)
    streams = s._plan(sink(policy=(0, pb.SNAPSHOT_ONGOING, req.snapshot_id, 0)))
    bid = _inflight(s, "policy", pb.BATCH_SNAPSHOT, 3, snapshot_id=req.snapshot_id)
    assert store.snapshots.cancel_snapshot(req.snapshot_id, "by an operator")
    cancelled = store.snapshots.get_snapshot(req.snapshot_id)
    s.acks.on_ack(pb.ReplicationAck(batch_id=bid), streams)
    assert store.snapshots.get_snapshot(req.snapshot_id) == cancelled
    assert cancelled is not None and cancelled.shipped_position == 0
