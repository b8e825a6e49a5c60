"""Cascading: a node's cascade rows, and relaying a cascaded client from the receive queue."""

from __future__ import annotations

import pytest

from lr_client.errors import InvalidNameError
from lr_client.records import ReplicationType, WireEntry
from lr_client.store.contract import QueueStore
from tests.contract.calls import log

SNAP = ReplicationType.SNAPSHOT_SYNC
END = ReplicationType.LAST_FULL_SYNC_ENTRY
LOG = ReplicationType.LOG_ENTRY_SYNC


def _branch(store: QueueStore, children: tuple[str, ...] = ("s4",)) -> None:
    """This node is s3, a branch of ``policy`` (origin s1), below s1, above ``children``."""
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", children)


def _deliver(store: QueueStore, through_position: int, seq: int | None = None) -> None:
    """Deliver the relayed queue up to the entry of ``through_position`` (or of ``seq``:
    a subscriber's commit, the lease, then the state)."""
    (queue,) = store.queues.list_queues("policy")
    with store.write() as conn:
        assert store.queues.acquire_lease(conn, queue.queue_id, "sub", 100.0, 60.0) is not None
        state = store.queues.load_state(conn, queue.queue_id)
        entries = store.queues.read_queue(conn, queue.queue_id, 1000)
        if seq is None:
            seq = max(e.seq for e in entries if e.source_position <= through_position)
        assert store.queues.save_state(
            conn,
            queue.queue_id,
            "sub",
            snapshot_id="",
            in_snapshot=False,
            delivered=state.delivered + 1,
            lease_expires=160.0,
            previous_seq=state.delivered_seq,
            delivered_seq=seq,
        )


def test_config_is_applied_once_and_a_changed_provider_is_a_switch(store: QueueStore) -> None:
    first = store.cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
    assert (first.origin_id, first.role, first.provider_id, first.epoch) == ("s1", "leaf", "s3", 1)
    assert first.config_provider == "s3"
    # The same configuration again: the database's provider stays (a run-time switch survives).
    assert store.cascade.apply_cascade_config("policy", "s1", "leaf", "s3").epoch == 1
    switched = store.cascade.apply_cascade_config("policy", "s1", "leaf", "s2")
    assert (switched.provider_id, switched.epoch, switched.config_provider) == ("s2", 2, "s2")
    assert store.cascade.cascade_node("policy") == switched
    assert store.cascade.cascade_node("other") is None
    root = store.cascade.apply_cascade_config("orders", "s1", "root", "", ("s2", "s3"))
    assert (root.provider_id, root.epoch) == ("", 0)
    assert [n.client_name for n in store.cascade.list_cascade_nodes()] == ["orders", "policy"]
    assert [c.child_id for c in store.cascade.cascade_children("orders")] == ["s2", "s3"]
    assert store.cascade.cascade_children("policy") == []


def test_bad_names_and_roles_change_nothing(store: QueueStore) -> None:
    with pytest.raises(InvalidNameError):
        store.cascade.apply_cascade_config("Policy", "s1", "leaf", "s3")
    with pytest.raises(InvalidNameError):
        store.cascade.apply_cascade_config("policy", "s1", "branch", "s3", ("S 4",))
    with pytest.raises(InvalidNameError):
        store.cascade.apply_cascade_config("policy", "s1", "root", "", (), nodes=("s2", "S3"))
    with pytest.raises(ValueError, match="role"):
        store.cascade.apply_cascade_config("policy", "s1", "trunk", "s3")
    assert store.cascade.list_cascade_nodes() == []


def test_a_child_is_marked_dropped_and_back(store: QueueStore) -> None:
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ("s4", "s5"))
    assert store.cascade.mark_child_dropped("policy", "s4")
    assert [(c.child_id, c.dropped) for c in store.cascade.cascade_children("policy")] == [
        ("s4", True),
        ("s5", False),
    ]
    assert store.cascade.mark_child_dropped("policy", "s4", dropped=False)
    assert not any(c.dropped for c in store.cascade.cascade_children("policy"))
    assert not store.cascade.mark_child_dropped("policy", "s9")


def test_the_relay_reads_log_entries_in_order_after_an_origin_position(store: QueueStore) -> None:
    _branch(store)
    store.recv.apply_log_batch("s1", "policy", log(3, 5, 9, 11))
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 0, 10)] == [3, 5, 9, 11]
    got = store.cascade.read_relay("policy", "s1", 5, 10)
    assert [(e.position, e.payload) for e in got] == [(9, b"9"), (11, b"11")]
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 0, 2)] == [3, 5]
    # Byte bounds: past the first entry no more than max_bytes (the first always goes).
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 0, 10, max_bytes=1)] == [3]
    assert store.cascade.read_relay("policy", "s2", 0, 10) == []  # no such queue


def test_after_a_full_sync_the_relay_starts_at_its_base(store: QueueStore) -> None:
    _branch(store)
    store.recv.apply_log_batch("s1", "policy", log(1, 2, 8))
    store.recv.apply_snapshot_batch("s1", "policy", "snap1", [WireEntry(1, SNAP, b"row", "snap1")])
    end = WireEntry(2, END, b"1", "snap1", 1, base_position=6)
    store.recv.apply_snapshot_batch("s1", "policy", "snap1", [end])
    store.recv.apply_log_batch("s1", "policy", log(7, 8, 10), previous_position=6)
    # Entry 8 received before the snapshot is not relayed; the log resumes after base 6.
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 0, 10)] == [7, 8, 10]
    assert store.cascade.relay_resume_floor("policy", "s1") == 6


def _full_sync(store: QueueStore, snapshot_id: str, base: int) -> None:
    store.recv.apply_snapshot_batch(
        "s1", "policy", snapshot_id, [WireEntry(1, SNAP, b"row", snapshot_id)]
    )
    end = WireEntry(2, END, b"1", snapshot_id, 1, base_position=base)
    store.recv.apply_snapshot_batch("s1", "policy", snapshot_id, [end])


def test_what_was_delivered_is_the_last_log_entry_after_the_full_sync_it_follows(
    store: QueueStore,
) -> None:
    _branch(store)
    store.recv.apply_log_batch("s1", "policy", log(1, 2, 8))
    _full_sync(store, "snap1", base=6)
    store.recv.apply_log_batch("s1", "policy", log(7), previous_position=6)
    _full_sync(store, "snap2", base=9)  # stored, not delivered yet
    (queue,) = store.queues.list_queues("policy")
    with store.read() as conn:
        entries = store.queues.read_queue(conn, queue.queue_id, 1000)
    (seven,) = [e.seq for e in entries if e.type == LOG and e.source_position == 7]
    _deliver(store, 7, seq=seven)
    # Entry 8, received before the first full sync, was replaced by it: 7 is the last
    # entry this node delivered, not the highest position it ever received.
    assert store.cascade.relay_delivered_position("policy", "s1") == 7


def test_delivery_keeps_relayed_entries_until_the_children_have_them(store: QueueStore) -> None:
    _branch(store)
    store.recv.apply_log_batch("s1", "policy", log(1, 2, 3, 4))
    _deliver(store, 4)
    assert store.cascade.relay_delivered_position("policy", "s1") == 4
    # Delivered here, but s4 acknowledged nothing: every entry stays for it.
    assert store.cascade.relay_floor("policy", "s1") == 0
    store.cascade.trim_relay("policy", "s1")
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 0, 10)] == [1, 2, 3, 4]
    assert store.cascade.relay_resume_floor("policy", "s1") == 0
    store.shipping.set_cursor("s4", "policy", 2)
    assert store.cascade.relay_floor("policy", "s1") == 2
    assert store.cascade.relay_floor("policy", "s1", extra_floor=1) == 1  # the global watermark
    store.cascade.trim_relay("policy", "s1")
    # Every entry above the floor is still held; a child can resume from 2 on.
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 2, 10)] == [3, 4]
    assert store.cascade.relay_resume_floor("policy", "s1") == 2


def test_a_dropped_child_leaves_the_floor(store: QueueStore) -> None:
    _branch(store, ("s4", "s5"))
    store.recv.apply_log_batch("s1", "policy", log(1, 2, 3))
    _deliver(store, 2)
    store.shipping.set_cursor("s5", "policy", 3)
    assert store.cascade.relay_floor("policy", "s1") == 0  # s4 never acknowledged
    store.cascade.mark_child_dropped("policy", "s4")
    assert store.cascade.relay_floor("policy", "s1") == 3
    # Never above what this node delivered itself.
    store.cascade.trim_relay("policy", "s1")
    assert store.cascade.relay_resume_floor("policy", "s1") == 2
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 2, 10)] == [3]


def test_a_leaf_delivers_as_before(store: QueueStore) -> None:
    store.cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
    store.recv.apply_log_batch("s1", "policy", log(1, 2))
    _deliver(store, 2)
    (queue,) = store.queues.list_queues("policy")
    assert store.queues.queue_depth(queue.queue_id) == 0


def test_the_relay_carries_the_origin_time_unchanged(store: QueueStore) -> None:
    _branch(store)
    entries = [
        WireEntry(1, ReplicationType.LOG_ENTRY_SYNC, b"a", origin_time=1234.5),
        WireEntry(2, ReplicationType.LOG_ENTRY_SYNC, b"b", origin_time=1240.25),
    ]
    store.recv.apply_log_batch("s1", "policy", entries)
    got = store.cascade.read_relay("policy", "s1", 0, 10)
    assert [e.created_at for e in got] == [1234.5, 1240.25]
