"""The sessions' shared reads of requests (lr_server/sending/request_board.py)."""

from __future__ import annotations

import time

from lr_client.records import SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore
from lr_server.sending.request_board import RequestBoard, read_requests
from lr_server.sending.send_checks import SendChecks


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


def test_a_look_up_before_a_send_is_served_by_a_board_read_begun_after_the_entries_state(
    store: SQLAlchemyQueueStore,
) -> None:
    """Entries of the shared reader are checked against a board read begun after their
    state was read (and after the session's own writes), else against a new one."""
    store.sites.register_sites(["b"])
    board = RequestBoard(store)
    wrote = [float("-inf")]
    checks = SendChecks(store, "b", board, lambda: wrote[0])
    first = board.read()
    state = time.monotonic()  # the entries' state: read after the board's read began
    sid = store.snapshots.request_snapshot(None, "b", "policy", "made after the board read")
    store.retention.drop_stream("b", "other", "too slow", first_dropped_position=4)
    requests, drops = checks.checks(["policy", "other"], state)
    assert board.reads == 2 and checks.shared == 1  # the earlier read does not serve
    assert requests["policy"].snapshot_id == sid and set(requests) == {"policy"}
    assert drops["other"].first_dropped_position == 4
    second = board._view
    assert checks.checks(["policy"], state)[0]["policy"].snapshot_id == sid
    assert board._view is second and board.reads == 2  # begun after the state: shared
    store.snapshots.cancel_snapshot(sid, "done here", "b")
    wrote[0] = time.monotonic()  # the session's own write: older reads still have it
    assert checks.checks(["policy"], state)[0] == {} and board.reads == 3
    assert first is not second


def test_a_look_up_for_entries_read_on_their_own_is_its_own(
    store: SQLAlchemyQueueStore,
) -> None:
    store.sites.register_sites(["b"])
    board = RequestBoard(store)
    checks = SendChecks(store, "b", board)
    store.snapshots.request_snapshot(None, "b", "policy", "operator")
    requests, _drops = checks.checks(["policy"], None)
    assert set(requests) == {"policy"} and board.reads == 0 and checks.shared == 0
