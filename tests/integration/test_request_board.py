"""The sessions' shared reads of requests (lr_server/sending/request_board.py)."""

from __future__ import annotations

import time

from lr_client.records import SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore
from lr_server.sending.request_board import RequestBoard, read_requests


def test_the_board_holds_every_destinations_open_requests(store: SQLAlchemyQueueStore) -> None:
    store.sites.register_sites(["b", "c"])
    old = store.snapshots.request_snapshot(None, "b", "policy", "first")
    store.snapshots.cancel_snapshot(old, "superseded", "b")
    sid = store.snapshots.request_snapshot(None, "b", "policy", "operator")
    store.retention.drop_stream("c", "policy", "too slow", first_dropped_position=4)
    first = store.replays.request_replay("c", "policy", 3)
    second = store.replays.request_replay("c", "other", 1)
    seen = read_requests(store)
    req = seen.open_snapshot("b", "policy")
    assert req is not None and req.snapshot_id == sid and req.status is SnapshotStatus.REQUESTED
    assert seen.open_snapshot("c", "policy") is None
    assert seen.drops_of("b") == {}
    assert seen.drops_of("c")["policy"].first_dropped_position == 4
    assert [r.replay_id for r in seen.replays_of("c")] == [first.replay_id, second.replay_id]
    assert seen.replays_of("b") == []


def test_a_read_begun_after_a_session_asked_serves_it_and_no_earlier_one(
    store: SQLAlchemyQueueStore,
) -> None:
    board = RequestBoard(store)
    asked = time.monotonic()
    first = board.read()
    assert board.read(asked) is first  # begun after it asked: shared
    assert (board.reads, board.shared) == (1, 1)
    sid = store.snapshots.request_snapshot(None, "b", "policy", "operator")
    seen = board.read(time.monotonic())  # asked after the request committed: read again
    assert seen is not first and board.reads == 2
    req = seen.open_snapshot("b", "policy")
    assert req is not None and req.snapshot_id == sid
