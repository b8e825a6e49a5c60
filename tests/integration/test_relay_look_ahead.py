"""A branch forwarding batches as received checks them against its last look-up of the
client's full syncs and drops while that is under ``relay_checks_ttl`` old, and looks
up again after a forward once it is half that old, rather than between a batch's
arrival and its forward (:meth:`lr_server.sending.send_checks.SendChecks.checks`); a batch read
from the receive queue is looked up at once. The session's steps are called directly (no
transport, the look-ups' clock set by the test), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.records import ReplicationType, SnapshotStatus, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_server.config import ClientConfig, ReplicationConfig, SnapshotProvider
from lr_server.protocol.versions import PROTOCOL_VERSION
from lr_server.receiving.receiver import Receiver
from lr_server.sending.arrivals import Arrivals
from lr_server.sending.session import SenderSession
from lr_server.sending.streams import ClientStream, Mode
from tests.kit.relayed import Sent, from_root, no_transport


class Branch:
    """The branch ``s3`` (``policy`` from the root ``s1``) holding entries 1 and 2, its
    session to its child ``s4`` (which holds them too), and its receiver, which hands
    each batch to the session's relay inbox before storing it. ``events`` lists the
    session's look-ups (``("look-up", 0)``) and sends in order."""

    def __init__(self, store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch) -> None:
        node = store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
        self.store = store
        self.storing = Receiver(store, "s3", ["s1"])  # stores only: nothing forwarded
        for position in (1, 2):
            self.storing.apply("s1", from_root(position))
        self.session = SenderSession(
            store,
            "s3",
            "s4",
            [ClientConfig("policy", SnapshotProvider.APP)],
            no_transport,
            ReplicationConfig(),
            cascade={"policy": node},
            arrivals=Arrivals(),
        )
        self.receiver = Receiver(store, "s3", ["s1"], on_received=self._offer)
        self.events: list[tuple[str, int]] = []
        self.stream = Sent(lambda batch: self.events.append(("sent", batch.entries[-1].position)))
        self.streams = self.session._plan(
            pb.NegotiateResponse(
                sink_id="s4",
                protocol_version=PROTOCOL_VERSION,
                clients=[pb.ClientState(client_name="policy", last_position=2, origin_id="s1")],
            )
        )
        checks = store.snapshots.send_checks

        def logged(*args: Any, **kwargs: Any) -> Any:
            self.events.append(("look-up", 0))
            return checks(*args, **kwargs)

        monkeypatch.setattr(store.snapshots, "send_checks", logged)
        self.now = 0.0
        self.session.shipper.lookup.clock = lambda: self.now

    def _offer(self, origin: str, client: str, previous: int, entries: Sequence[WireEntry]) -> None:
        inbox = self.session.inbox
        assert inbox is not None
        inbox.put(client, previous, entries)

    @property
    def policy(self) -> ClientStream:
        return self.streams["policy"]

    def ship(self) -> bool:
        return self.session._ship(self.stream, self.streams)

    def forward(self, position: int, at: float) -> None:
        """Entry ``position`` received (and stored), then a round of the session at
        ``at`` on its shipper's clock; ``events`` holds that round's only."""
        self.receiver.apply("s1", from_root(position))
        self.events.clear()
        self.now = at
        self.ship()


def test_forwarded_batches_go_on_with_a_recent_look_up_made_again_after_them(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = Branch(store, monkeypatch)  # relay_checks_ttl 1 s
    b.forward(3, at=0.0)
    assert b.events == [("look-up", 0), ("sent", 3)]  # none yet: looked up at once
    b.forward(4, at=0.4)
    assert b.events == [("sent", 4)]  # nothing between its arrival and its send
    b.forward(5, at=0.6)  # the look-up is half its ttl old: made again, once sent
    assert b.events == [("sent", 5), ("look-up", 0)]
    b.forward(6, at=1.5)  # 0.9 s old: still serves, and is made again
    assert b.events == [("sent", 6), ("look-up", 0)]
    b.forward(7, at=2.6)  # 1.1 s old: made again before the batch goes
    assert b.events == [("look-up", 0), ("sent", 7)]
    assert b.policy.sent == 7


def test_a_batch_read_from_the_receive_queue_is_looked_up_at_once(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = Branch(store, monkeypatch)
    b.forward(3, at=0.0)
    b.events.clear()
    b.storing.apply("s1", from_root(4))  # stored, not forwarded: read from the queue
    b.now = 0.1
    assert b.ship()
    assert b.events == [("look-up", 0), ("sent", 4)]


def test_a_full_sync_asked_after_the_look_up_stops_the_stream_within_its_ttl(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look-up made with entry 3's forward predates the request: entry 4 goes on, as
    it would had the request come a moment later. Once it is older than its ttl, the
    next look-up finds the request, so entry 5 does not go, and the stream turns to
    the full sync, whose base (what the branch stored) is at or past every entry
    sent, so none comes twice."""
    b = Branch(store, monkeypatch)
    b.forward(3, at=0.0)
    sid = store.snapshots.request_snapshot(None, "s4", "policy", "asked")
    b.forward(4, at=0.1)
    assert b.events == [("sent", 4)] and b.policy.sent == 4
    b.forward(5, at=1.1)
    assert b.events == [("look-up", 0)]  # nothing sent
    assert b.policy.mode is Mode.SNAPSHOT and b.policy.snapshot.snapshot_id == sid
    started = store.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == 5
    assert store.snapshots.get_snapshot(sid, "s4").status is SnapshotStatus.RUNNING


def test_a_drop_recorded_after_the_look_up_stops_the_stream_within_its_ttl(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.sites.register_sites(["s4"])
    b = Branch(store, monkeypatch)
    b.forward(3, at=0.0)
    assert store.retention.drop_stream("s4", "policy", "asked") is not None
    b.forward(4, at=0.1)
    assert b.events == [("sent", 4)]  # the look-up predates the drop
    b.forward(5, at=1.1)
    assert b.events == [("look-up", 0)]  # nothing sent
    assert b.policy.sent == 4


def test_a_look_up_that_found_a_full_sync_is_not_used_again_once_it_ended(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a clear look-up serves later batches: one that found a full sync would
    otherwise turn the stream back to it after it ended, and ship it again."""
    b = Branch(store, monkeypatch)
    sid = store.snapshots.request_snapshot(None, "s4", "policy", "asked")
    b.forward(3, at=0.0)
    assert b.events == [("look-up", 0)]  # found: nothing sent, the stream turns to it
    assert b.policy.mode is Mode.SNAPSHOT
    assert store.snapshots.cancel_snapshot(
        sid, "ended", "s4"
    )  # and the stream went back to its log
    b.policy.mode, b.policy.snapshot = Mode.LOG, None
    b.events.clear()
    b.now = 0.1
    b._offer("s1", "policy", 2, [WireEntry(3, ReplicationType.LOG_ENTRY_SYNC, b"x3")])
    assert b.ship()  # entry 3 again, as received: it follows the stream
    assert b.events == [("look-up", 0), ("sent", 3)]
    assert b.policy.mode is Mode.LOG
