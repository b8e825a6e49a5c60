"""A full sync reaches the listener only once the sink has all of it, through the whole chain.

A sender session (driven step by step, :mod:`tests.kit.rig`) ships part of a
snapshot, the snapshot is superseded at the source, and its successor is
shipped: the sink's listener sees the successor whole and nothing of the
first, not even the part that reached the sink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lr_client.records import ReplicationType
from lr_client.store import SQLAlchemyQueueStore
from lr_server.sending.streams import Mode
from tests.kit.rig import CLIENT, Rig, make_rig

SNAP = ReplicationType.SNAPSHOT_SYNC


@pytest.fixture
def rig(store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]) -> Iterator[Rig]:
    with make_rig(store, db_url_factory, batch_max_entries=10) as r:
        yield r


def test_a_snapshot_superseded_mid_transfer_never_reaches_the_listener(rig: Rig) -> None:
    logs = rig.log_at_sink() + rig.transmit(3)
    rig.connect()
    rig.step()
    assert rig.log_at_sink() == logs

    old = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator")
    assert rig.src.snapshots.start_snapshot(old) is not None
    rig.provide(old, [b"old-%d" % i for i in range(30)])
    rig.session._check_requests(rig.streams)
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT
    rig.step()  # one batch of the old snapshot: a third of it, no end marker
    snapshot = [p for t, p in rig.at_sink() if t is ReplicationType.SNAPSHOT_SYNC]
    assert snapshot == list(range(1, 11))
    # The log entries before it were delivered: the subscriber ran past it.
    assert rig.deliver() == [("log", tuple(logs))]

    new = rig.src.snapshots.request_snapshot(
        None, "b", CLIENT, "operator"
    )  # supersedes the old one
    assert rig.src.snapshots.start_snapshot(new) is not None
    rig.provide(new, [b"new-1", b"new-2"])
    rig.until_complete(new)
    assert rig.deliver() == [
        ("start", new),
        ("snapshot", (b"new-1", b"new-2")),
        ("end", new),
    ]


def test_a_snapshot_travels_and_is_delivered_in_snapshot_sized_batches(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    """Snapshot batches have their own size, at the sender and at the subscriber;
    log entries keep theirs, before and after the snapshot."""
    with make_rig(
        store, db_url_factory, batch_max_entries=10, snapshot_batch_max_entries=25
    ) as rig:
        rig.connect()
        rig.step()
        before = rig.log_at_sink()
        assert rig.deliver() == [("log", tuple(before))]
        sid = rig.src.snapshots.request_snapshot(None, "b", CLIENT, "operator")
        assert rig.src.snapshots.start_snapshot(sid) is not None
        after = rig.transmit(30)  # past the snapshot's base: replayed after it
        rig.provide(sid, [b"row-%d" % i for i in range(60)])
        rig.session._check_requests(rig.streams)
        rig.step()  # one snapshot batch: 25 entries, not the log's 10
        assert [p for t, p in rig.at_sink() if t is SNAP] == list(range(1, 26))
        rig.until_complete(sid)
        rig.drain(after[-1])

        events = rig.deliver(batch_size=10, snapshot_batch_size=25)
    rows = [b"row-%d" % i for i in range(60)]
    # The first full sync batch is read before the subscriber knows it is in one.
    assert events[:5] == [
        ("start", sid),
        ("snapshot", tuple(rows[:10])),
        ("snapshot", tuple(rows[10:35])),
        ("snapshot", tuple(rows[35:60])),
        ("end", sid),
    ]
    logs = [e for e in events[5:] if e[0] == "log"]
    assert logs == [("log", tuple(after[i : i + 10])) for i in range(0, 30, 10)]
    assert len(events) == 5 + len(logs)
