"""SubscriberQueues: the sink's receive queues, read and emptied in the delivering transaction."""

from __future__ import annotations

from lr_client.records import ReplicationType
from lr_client.store.contract import QueueStore, SubscriberQueues
from tests.contract.calls import rolled_back, across_outage, log, refused_for_no_schema
from tests.contract.outage import Outage


def _queue_id(store: SubscriberQueues, client: str) -> int:
    (queue,) = store.list_queues(client)
    return queue.queue_id


def _positions(store: SubscriberQueues, queue_id: int) -> list[int]:
    with store.write() as conn:
        return [e.source_position for e in store.read_queue(conn, queue_id, 100)]


def test_queues_are_listed_in_registration_order(store: SubscriberQueues) -> None:
    assert store.list_queues() == []
    store.apply_log_batch("b", "policy", log(1))
    store.apply_log_batch("a", "policy", log(1))
    store.apply_log_batch("a", "other", log(1))
    got = [(q.source_id, q.client_name) for q in store.list_queues()]
    assert got == [("b", "policy"), ("a", "policy"), ("a", "other")]
    ids = [q.queue_id for q in store.list_queues()]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [q.source_id for q in store.list_queues("policy")] == ["b", "a"]
    assert store.list_queues("nobody") == []


def test_read_queue_gives_the_oldest_entries_of_one_queue(store: SubscriberQueues) -> None:
    store.apply_log_batch("a", "policy", log(2, 4, 6, 8))
    store.apply_log_batch("b", "policy", log(1))
    qid = [q.queue_id for q in store.list_queues("policy")]
    with store.write() as conn:
        first = store.read_queue(conn, qid[0], 3)
        other = store.read_queue(conn, qid[1], 10)
    assert [e.source_position for e in first] == [2, 4, 6]
    assert [e.seq for e in first] == sorted(e.seq for e in first)
    assert {(e.queue_id, e.source_id, e.client_name) for e in first} == {(qid[0], "a", "policy")}
    assert [(e.payload, e.type) for e in first] == [
        (b"2", ReplicationType.LOG_ENTRY_SYNC),
        (b"4", ReplicationType.LOG_ENTRY_SYNC),
        (b"6", ReplicationType.LOG_ENTRY_SYNC),
    ]
    assert [(e.source_id, e.source_position) for e in other] == [("b", 1)]


def test_delete_entries_commits_with_the_delivery(store: SubscriberQueues) -> None:
    store.apply_log_batch("a", "policy", log(1, 2, 3, 4, 5))
    qid = _queue_id(store, "policy")
    with rolled_back(store) as conn:
        seqs = [e.seq for e in store.read_queue(conn, qid, 2)]
        assert store.delete_entries(conn, seqs) == 2
    assert _positions(store, qid) == [1, 2, 3, 4, 5]
    with store.write() as conn:
        got = store.read_queue(conn, qid, 5)
        assert store.delete_entries(conn, [got[0].seq, got[1].seq]) == 2  # a range
        assert store.delete_entries(conn, [got[2].seq, got[4].seq]) == 2  # with a hole
        assert store.delete_entries(conn, []) == 0
    assert _positions(store, qid) == [4]


def test_queue_depth_follows_appends_and_deletes(store: SubscriberQueues) -> None:
    store.apply_log_batch("a", "policy", log(1, 2, 3))
    store.apply_log_batch("b", "policy", log(1))
    qid = store.list_queues("policy")[0].queue_id  # source a, registered first
    assert store.queue_depth(qid) == 3
    with store.write() as conn:
        store.delete_entries(conn, [store.read_queue(conn, qid, 1)[0].seq])
    assert store.queue_depth(qid) == 2
    assert _positions(store, qid) == [2, 3]
    assert store.queue_depth(qid + 1000) == 0


def test_a_queue_method_on_an_empty_database_is_a_schema_error(
    bare_store: SubscriberQueues,
) -> None:
    refused_for_no_schema(bare_store, bare_store.list_queues)
    refused_for_no_schema(bare_store, lambda: bare_store.queue_depth(1))


def test_a_lost_connection_is_transient(store: SubscriberQueues, outage: Outage) -> None:
    store.apply_log_batch("a", "policy", log(1, 2))
    got = across_outage(outage, store.list_queues)
    assert [(q.source_id, q.client_name) for q in got] == [("a", "policy")]
    assert across_outage(outage, lambda: store.queue_depth(got[0].queue_id)) == 2
