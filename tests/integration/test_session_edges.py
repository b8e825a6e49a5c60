"""Edges where separately built parts of the sender session meet, driven step by step.

One session between a real source store and a real sink store (both
backends), no timing involved (:mod:`tests.kit.rig`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lr_client.records import ReplicationType, SnapshotStatus, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_server.config import ClientConfig
from lr_server.sending.streams import Mode
from tests.kit.rig import CLIENT, Rig, make_rig

LOG, SNAP, END, DROPPED = (
    ReplicationType.LOG_ENTRY_SYNC,
    ReplicationType.SNAPSHOT_SYNC,
    ReplicationType.LAST_FULL_SYNC_ENTRY,
    ReplicationType.STREAM_DROPPED,
)


@pytest.fixture
def rig(store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]) -> Iterator[Rig]:
    with make_rig(store, db_url_factory) as r:
        yield r


def test_a_request_for_a_client_without_provider_never_stops_its_log_entries(rig: Rig) -> None:
    rig.session.clients = {CLIENT: ClientConfig(CLIENT, snapshot="none")}
    first = rig.log_at_sink()
    rig.connect()
    # The library accepts the request (it cannot see the server's config) ...
    sid = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "asked by the application")
    more = rig.transmit(3)
    rig.step()  # ... and the very next round, before any periodic check, refuses it
    assert rig.log_at_sink() == first + more
    assert rig.streams[CLIENT].mode is Mode.LOG
    snap = rig.src.snapshots.get_snapshot(sid)
    assert snap is not None and snap.status is SnapshotStatus.CANCELLED
    assert "has no snapshot provider" in snap.reason
    later = rig.transmit(2)
    rig.session._check_requests(rig.streams)
    rig.step()
    assert rig.log_at_sink() == first + more + later


def test_a_dropped_stream_ships_nothing_past_the_hole_before_its_notice(rig: Rig) -> None:
    rig.connect()
    shipped = rig.transmit(3)
    rig.step()
    first = rig.log_at_sink()
    assert first[-3:] == shipped
    drop = rig.src.retention.drop_stream("b", CLIENT, "over max_entries")
    assert drop is not None and drop.first_dropped_position == shipped[-1] + 1
    rig.transmit(2)  # after the drop: the full sync will hold their effect
    rig.step()  # before the periodic check has seen the drop
    assert rig.log_at_sink() == first  # nothing past the hole

    rig.session._check_requests(rig.streams)  # requests the full sync, with the notice
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT
    sid = rig.streams[CLIENT].snapshot.snapshot_id  # type: ignore[union-attr]
    assert rig.src.snapshots.start_snapshot(sid) is not None
    rig.provide(sid, [b"row"])
    rig.until_complete(sid)
    kinds = [t for t, _ in rig.at_sink()]
    assert kinds == [LOG] * len(first) + [DROPPED, SNAP, END]
    assert rig.at_sink()[len(first)] == (DROPPED, drop.first_dropped_position)


def test_a_drop_found_with_an_open_request_is_still_told_before_the_full_sync(rig: Rig) -> None:
    rig.connect()
    rig.transmit(2)
    rig.step()
    first = rig.log_at_sink()
    sid = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator")
    drop = rig.src.retention.drop_stream("b", CLIENT, "over max_bytes")
    assert drop is not None
    rig.transmit(1)
    rig.step()  # the gate switches to the full sync before the periodic check runs
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT
    assert rig.src.snapshots.start_snapshot(sid) is not None
    rig.provide(sid, [b"row"])
    rig.until_complete(sid)
    assert [t for t, _ in rig.at_sink()] == [LOG] * len(first) + [DROPPED, SNAP, END]


def test_the_end_of_a_superseded_snapshot_does_not_complete_the_newer_one(rig: Rig) -> None:
    rig.connect()
    old = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator")
    assert rig.src.snapshots.start_snapshot(old) is not None
    rig.provide(old, [b"old"])
    rig.session._check_requests(rig.streams)
    assert rig.stream is not None
    rig.session._ship(rig.stream, rig.streams)  # the whole old snapshot, end included
    assert rig.streams[CLIENT].snap_done_sent
    new = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator again")  # cancels the old
    rig.session._check_requests(rig.streams)
    assert rig.streams[CLIENT].snapshot.snapshot_id == new  # type: ignore[union-attr]
    rig.session.acks.drain(rig.stream, rig.streams, 0.0)  # the old end's ack arrives

    snap = rig.src.snapshots.get_snapshot(new)
    assert snap is not None and snap.status is SnapshotStatus.REQUESTED  # not completed
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT
    assert rig.src.snapshots.start_snapshot(new) is not None
    rig.provide(new, [b"new"])
    rig.until_complete(new)
    events = rig.deliver()
    assert ("snapshot", (b"new",)) in events
    assert events[-1] == ("end", new)


def test_an_accepted_loss_clears_a_partial_snapshot_at_the_sink(
    store: SQLAlchemyQueueStore,
) -> None:
    """A drop notice ends an unfinished snapshot: nothing waits for its end forever."""
    snap = [
        WireEntry(1, SNAP, b"s1", snapshot_id="s1"),
        WireEntry(2, SNAP, b"s2", snapshot_id="s1"),
    ]
    store.recv.apply_log_batch("a", CLIENT, [WireEntry(1, LOG, b"e1")], 0)
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", snap, 0)
    assert store.recv.apply_drop_notice("a", CLIENT, "a1", 2, "loss accepted") is True
    progress = store.recv.sink_progress("a", CLIENT)
    assert (progress.snapshot_id, progress.last_position) == ("", 1)
    store.recv.apply_log_batch("a", CLIENT, [WireEntry(5, LOG, b"e5")], 1)
    (queue,) = store.queues.list_queues(CLIENT)
    with store.read() as conn:
        queued = store.queues.read_queue(conn, queue.queue_id, 10)
    assert [(e.type, e.source_position) for e in queued] == [(LOG, 1), (DROPPED, 2), (LOG, 5)]


def test_a_read_of_requests_begun_before_a_full_sync_completed_does_not_reopen_it(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    """The sessions share their reads of requests (request_board.py); one begun before
    this session completed a full sync still shows it open: the stream stays in log
    entry sync rather than shipping the snapshot again."""
    with make_rig(store, db_url_factory) as r:
        r.connect()
        sid = store.snapshots.request_snapshot(None, "b", CLIENT, "test")
        assert store.snapshots.start_snapshot(sid) is not None
        r.provide(sid, [b"s1", b"s2"])
        stale = r.session.board.read()
        assert stale.open_snapshot("b", CLIENT) is not None
        r.until_complete(sid)
        assert r.streams[CLIENT].mode is Mode.LOG
        r.session.requests.check(r.streams, stale)
        assert r.streams[CLIENT].mode is Mode.LOG and r.streams[CLIENT].snapshot is None
