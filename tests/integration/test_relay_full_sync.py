"""A full sync a branch serves never brings a node below an entry it already holds: its
base is the last entry the branch stored, its provider reads once the branch's own
application has applied that far, and a stream that holds entries past a base all the
same (forwarded before they were stored, or a node that came from a provider further
ahead) asks for a new snapshot rather than ship that one. The session's steps are
called directly (no transport), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import SnapshotError
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotProviderRunner, wait_for_base
from lr_client.store import SQLAlchemyQueueStore
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.config import ClientConfig, ReplicationConfig, SnapshotProvider
from lr_server.protocol.versions import PROTOCOL_VERSION
from lr_server.receiving.receiver import Receiver
from lr_server.sending.session import SenderSession
from lr_server.sending.streams import Mode
from tests.kit.relayed import Sent, TakesAll, from_root, no_transport


def _branch(store: SQLAlchemyQueueStore, stored: int) -> SenderSession:
    """The branch ``s3`` (``policy`` from the root ``s1``), holding entries 1..``stored``
    of it, and its session to its child ``s4``."""
    node = store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    receiver = Receiver(store, "s3", ["s1"])
    for position in range(1, stored + 1):
        receiver.apply("s1", from_root(position))
    return SenderSession(
        store,
        "s3",
        "s4",
        [ClientConfig("policy", SnapshotProvider.APP)],
        no_transport,
        ReplicationConfig(),
        cascade={"policy": node},
    )


def _at(position: int) -> pb.NegotiateResponse:
    """The child's answer: it holds ``policy`` of ``s1`` up to ``position``."""
    return pb.NegotiateResponse(
        sink_id="s4",
        protocol_version=PROTOCOL_VERSION,
        clients=[pb.ClientState(client_name="policy", last_position=position, origin_id="s1")],
    )


def test_a_branchs_full_sync_is_based_on_what_it_stored_and_read_once_its_application_has_it(
    store: SQLAlchemyQueueStore,
) -> None:
    _branch(store, stored=6)
    assert (
        store.cascade.relay_delivered_position("policy", "s1") == 0
    )  # its application applied none
    sid = store.snapshots.request_snapshot(None, "s4", "policy", "asked")
    read: list[int] = []
    runner = SnapshotProviderRunner(store, "policy", lambda ctx: read.append(ctx.base_position))
    assert runner.poll_once() == 0  # started, and waiting for the branch's application
    started = store.snapshots.get_snapshot(sid)
    assert (started.status, started.base_position, read) == (SnapshotStatus.RUNNING, 6, [])
    assert not store.snapshots.snapshot_base_applied(sid)
    app = RoutingQueueSubscriber(store, "policy", TakesAll(), batch_size=5, max_batches=1)
    assert app.poll_once() == 5
    assert runner.poll_once() == 0 and read == []  # 5 of the 6: still waiting
    assert app.poll_once() == 1
    assert store.snapshots.snapshot_base_applied(sid)
    assert runner.poll_once() == 1 and read == [6]
    assert store.snapshots.get_snapshot(sid).status is SnapshotStatus.READY


def test_a_stream_past_its_snapshots_base_asks_for_a_new_one_rather_than_repeat_entries(
    store: SQLAlchemyQueueStore,
) -> None:
    """The child holds entry 8 (from a provider further ahead), the branch stored up to 6:
    a snapshot based on 6 would bring 7 and 8 to its listener again."""
    s = _branch(store, stored=6)
    streams = s._plan(_at(8))
    cs = streams["policy"]
    assert (cs.mode, cs.sent) == (Mode.LOG, 8)
    first = store.snapshots.request_snapshot(None, "s4", "policy", "asked")
    store.snapshots.start_snapshot(first)
    s.requests.check(streams)
    assert cs.mode is Mode.SNAPSHOT and cs.snapshot.base_position == 6
    stream = Sent()
    assert not s._ship(stream, streams)
    assert stream.batches == []
    old = store.snapshots.get_snapshot(first, "s4")
    assert old.status is SnapshotStatus.CANCELLED and old.reason.startswith("superseded by")
    (new,) = store.snapshots.list_snapshots("s4", "policy", [SnapshotStatus.REQUESTED])
    assert new.reason == f"the stream holds entries up to 8, past base 6 of full sync {first}"
    assert cs.snapshot == new and cs.sent == 8
    # Based as low again (nothing stored since): not asked again before the backoff.
    store.snapshots.start_snapshot(new.snapshot_id)
    s.requests.check(streams)
    assert not s._ship(stream, streams)
    views = {r.snapshot_id: r.status for r in store.snapshots.list_snapshots("s4", "policy")}
    assert views == {first: SnapshotStatus.CANCELLED, new.snapshot_id: SnapshotStatus.RUNNING}
    assert cs.snapshot.snapshot_id == new.snapshot_id


def test_waiting_for_a_branchs_base_keeps_the_snapshot_alive_and_ends_with_it(
    store: SQLAlchemyQueueStore,
) -> None:
    _branch(store, stored=2)
    sid = store.snapshots.request_snapshot(None, "s4", "policy", "asked")
    started = store.snapshots.start_snapshot(sid)
    assert started is not None
    stop = threading.Event()
    stop.set()
    with pytest.raises(SnapshotError, match="stopped waiting for its base"):
        wait_for_base(store, sid, stop)
    assert store.snapshots.get_snapshot(sid).updated_at > started.updated_at  # kept alive
    store.snapshots.cancel_snapshot(sid, "operator")
    with pytest.raises(SnapshotError, match="is no longer running"):
        wait_for_base(store, sid)
    other = store.snapshots.request_snapshot(None, "s4", "policy", "asked")
    store.snapshots.start_snapshot(other)
    app = RoutingQueueSubscriber(store, "policy", TakesAll())
    assert app.poll_once() == 2
    wait_for_base(store, other, stop)  # applied already: returns at once
