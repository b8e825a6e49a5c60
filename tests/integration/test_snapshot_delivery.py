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
from lr_server.streams import Mode
from tests.kit.rig import CLIENT, Rig, make_rig


@pytest.fixture
def rig(store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]) -> Iterator[Rig]:
    with make_rig(store, db_url_factory, batch_max_entries=10) as r:
        yield r


def test_a_snapshot_superseded_mid_transfer_never_reaches_the_listener(rig: Rig) -> None:
    logs = rig.log_at_sink() + rig.transmit(3)
    rig.connect()
    rig.step()
    assert rig.log_at_sink() == logs

    old = rig.src.request_snapshot(None, "b", CLIENT, "operator")
    assert rig.src.start_snapshot(old) is not None
    rig.provide(old, [b"old-%d" % i for i in range(30)])
    rig.session._check_requests(rig.streams)
    assert rig.streams[CLIENT].mode is Mode.SNAPSHOT
    rig.step()  # one batch of the old snapshot: a third of it, no end marker
    snapshot = [p for t, p in rig.at_sink() if t is ReplicationType.SNAPSHOT_SYNC]
    assert snapshot == list(range(1, 11))
    # The log entries before it were delivered: the subscriber ran past it.
    assert rig.deliver() == [("log", tuple(logs))]

    new = rig.src.request_snapshot(None, "b", CLIENT, "operator")  # supersedes the old one
    assert rig.src.start_snapshot(new) is not None
    rig.provide(new, [b"new-1", b"new-2"])
    rig.until_complete(new)
    assert rig.deliver() == [
        ("start", new),
        ("snapshot", (b"new-1", b"new-2")),
        ("end", new),
    ]
