"""The replay role (:mod:`lr_client.store.recv.replay_contract`) on each backend: requests at the
source, replayed batches at the sink."""

from __future__ import annotations

import pytest

from lr_client.errors import InvalidInputError
from lr_client.records import ReplicationType, WireEntry
from lr_client.replayed import REPLAYED_MARK
from lr_client.store.contract import QueueStore

LOG = ReplicationType.LOG_ENTRY_SYNC


def test_a_request_is_recorded_listed_while_open_and_moved_along(store: QueueStore) -> None:
    first = store.replays.request_replay("b", "policy", 3)
    second = store.replays.request_replay("c", "policy", 1)
    assert (first.status, first.shipped_through, first.through_position) == ("pending", 2, None)
    assert [r.replay_id for r in store.replays.list_replays(open_only=True)] == [
        first.replay_id,
        second.replay_id,
    ]
    assert store.replays.list_replays("c") == [second]
    store.replays.update_replay(first.replay_id, status="running", through_position=9)
    store.replays.update_replay(first.replay_id, shipped_through=9, status="done")
    (done,) = store.replays.list_replays("b")
    assert (done.status, done.through_position, done.shipped_through) == ("done", 9, 9)
    assert store.replays.list_replays(open_only=True) == [second]
    for bad in (0, -1, True, "3"):
        with pytest.raises(InvalidInputError):
            store.replays.request_replay("b", "policy", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        store.replays.request_replay("B!", "policy", 1)
    with pytest.raises(InvalidInputError):
        store.replays.update_replay(first.replay_id, destination="x")
    assert len(store.replays.list_replays()) == 2  # nothing recorded by the bad calls


def test_a_replayed_batch_queues_again_what_the_sink_holds_flagged(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", [WireEntry(p, LOG, b"x") for p in (1, 2)])
    progress = store.recv.sink_progress("a", "policy")
    assert store.replays.apply_replay_batch(
        "a", "policy", [WireEntry(p, LOG, b"y") for p in (2, 3)]
    ) == (
        True,
        3,
    )
    assert store.recv.sink_progress("a", "policy") == progress  # the position stays
    (queue,) = store.queues.list_queues("policy")
    with store.read() as conn:
        head = store.heads.read_head(conn, queue.queue_id, 10)
    assert [(e.source_position, e.snapshot_id) for e in head] == [
        (1, ""),
        (2, ""),
        (2, REPLAYED_MARK),  # 3 is not held yet: it comes in its turn
    ]
    assert store.replays.apply_replay_batch("a", "policy", [WireEntry(5, LOG, b"z")]) == (False, 5)


def test_a_rewind_of_a_queue_that_delivered_nothing_is_refused(store: QueueStore) -> None:
    assert store.replays.rewind_receive_queue("a", "policy", 1).refused
    store.recv.apply_log_batch("a", "policy", [WireEntry(1, LOG, b"x")])
    done = store.replays.rewind_receive_queue("a", "policy", 1)
    assert done.refused and done.entries == 0
