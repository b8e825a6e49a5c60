"""SubscriberQueues: the sink's receive queues, read and passed in the delivering transaction."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from lr_client.errors import PartitionCountError
from lr_client.records import ReplicationType, SubscriberState, WireEntry
from lr_client.store.contract import QueueStore
from tests.contract.calls import (
    across_outage,
    log,
    pass_entries,
    refused_for_no_schema,
    rolled_back,
)
from tests.contract.outage import Outage
from tests.kit.wait import wait_for

#: The client of the wake-up tests: notifications are per database, and no other test
#: (in another schema of it) sends one for this name.
WATCHED = "watched-" + uuid.uuid4().hex[:8]


def _queue_id(store: QueueStore, client: str) -> int:
    (queue,) = store.queues.list_queues(client)
    return queue.queue_id


def _positions(store: QueueStore, queue_id: int) -> list[int]:
    with store.write() as conn:
        return [e.source_position for e in store.queues.read_queue(conn, queue_id, 100)]


def test_queues_are_listed_in_registration_order(store: QueueStore) -> None:
    assert store.queues.list_queues() == []
    store.recv.apply_log_batch("b", "policy", log(1))
    store.recv.apply_log_batch("a", "policy", log(1))
    store.recv.apply_log_batch("a", "other", log(1))
    got = [(q.source_id, q.client_name) for q in store.queues.list_queues()]
    assert got == [("b", "policy"), ("a", "policy"), ("a", "other")]
    ids = [q.queue_id for q in store.queues.list_queues()]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [q.source_id for q in store.queues.list_queues("policy")] == ["b", "a"]
    assert store.queues.list_queues("nobody") == []


def test_read_queue_gives_the_oldest_entries_of_one_queue(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(2, 4, 6, 8))
    store.recv.apply_log_batch("b", "policy", log(1))
    qid = [q.queue_id for q in store.queues.list_queues("policy")]
    with store.write() as conn:
        first = store.queues.read_queue(conn, qid[0], 3)
        other = store.queues.read_queue(conn, qid[1], 10)
    assert [e.source_position for e in first] == [2, 4, 6]
    assert [e.seq for e in first] == sorted(e.seq for e in first)
    assert {(e.queue_id, e.source_id, e.client_name) for e in first} == {(qid[0], "a", "policy")}
    assert [(e.payload, e.type) for e in first] == [
        (b"2", ReplicationType.LOG_ENTRY_SYNC),
        (b"4", ReplicationType.LOG_ENTRY_SYNC),
        (b"6", ReplicationType.LOG_ENTRY_SYNC),
    ]
    assert [(e.source_id, e.source_position) for e in other] == [("b", 1)]


def test_passed_entries_are_gone_when_the_delivery_commits(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3, 4, 5))
    qid = _queue_id(store, "policy")
    _lease(store, qid, "s1", 100.0)
    with rolled_back(store) as conn:
        seqs = [e.seq for e in store.queues.read_queue(conn, qid, 2)]
        assert store.queues.save_state(
            conn,
            qid,
            "s1",
            snapshot_id="",
            in_snapshot=False,
            delivered=2,
            lease_expires=150.0,
            previous_seq=0,
            delivered_seq=seqs[-1],
        )
        assert [e.source_position for e in store.queues.read_queue(conn, qid, 10)] == [3, 4, 5]
    assert _positions(store, qid) == [1, 2, 3, 4, 5]
    assert pass_entries(store, qid, 2) == [1, 2]
    assert _positions(store, qid) == [3, 4, 5]
    with store.read() as conn:
        state = store.queues.load_state(conn, qid)
        head = store.heads.peek_head(conn, qid)
        assert head is not None and head.source_position == 3
        assert state.delivered_seq == seqs[-1] < head.seq
    assert pass_entries(store, qid, 10) == [3, 4, 5]
    assert _positions(store, qid) == []
    store.recv.apply_log_batch("a", "policy", log(6))
    assert _positions(store, qid) == [6]


def test_a_delivery_from_a_passed_point_is_refused(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3))
    qid = _queue_id(store, "policy")
    _lease(store, qid, "s1", 100.0)
    with store.read() as conn:
        seqs = [e.seq for e in store.heads.read_head(conn, qid, 3)]

    def save(previous: int, to: int) -> bool:
        with store.write() as conn:
            return store.queues.save_state(
                conn,
                qid,
                "s1",
                snapshot_id="",
                in_snapshot=False,
                delivered=1,
                lease_expires=150.0,
                previous_seq=previous,
                delivered_seq=to,
            )

    assert save(0, seqs[0])
    assert not save(0, seqs[1])  # another delivery committed from 0 first: roll back
    assert _positions(store, qid) == [2, 3]
    assert save(seqs[0], seqs[0])  # state only: nothing passed
    with pytest.raises(ValueError):
        save(seqs[0], seqs[0] - 1)  # never backwards
    assert _state(store, qid).delivered_seq == seqs[0]


def test_queue_depth_follows_appends_and_deliveries(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2, 3))
    store.recv.apply_log_batch("b", "policy", log(1))
    qid = store.queues.list_queues("policy")[0].queue_id  # source a, registered first
    assert store.queues.queue_depth(qid) == 3
    pass_entries(store, qid, 1)
    assert store.queues.queue_depth(qid) == 2
    assert _positions(store, qid) == [2, 3]
    assert store.queues.queue_depth(qid + 1000) == 0
    # (entries, payload bytes) waiting, by source and client
    assert store.heads.receive_queue_size("a", "policy") == (
        2,
        sum(len(e.payload) for e in log(2, 3)),
    )
    assert store.heads.receive_queue_size("b", "policy") == (1, len(log(1)[0].payload))
    assert store.heads.receive_queue_size("a", "other") == (0, 0)


def test_rotation_keeps_every_undelivered_entry(store: QueueStore) -> None:
    """Rotating as often as it may (period 0) between appends and deliveries loses nothing.

    PostgreSQL moves new entries to a retired slot; SQLite has nothing to rotate.
    """
    qa = qb = 0
    got: dict[str, list[int]] = {"a": [], "b": []}
    rotated = []
    for round_ in range(6):
        store.recv.apply_log_batch(
            "a", "policy", log(3 * round_ + 1, 3 * round_ + 2, 3 * round_ + 3)
        )
        store.recv.apply_log_batch("b", "policy", log(round_ + 1))
        qa, qb = (q.queue_id for q in store.queues.list_queues("policy"))
        rotated.append(store.queues.rotate_receive_queues(period=0.0))
        got["a"] += pass_entries(store, qa, 2)
        rotated.append(store.queues.rotate_receive_queues(period=0.0))
        if round_ % 2:
            got["b"] += pass_entries(store, qb, 10)
    assert store.queues.rotate_receive_queues(period=3600.0) is None  # not due
    got["a"] += pass_entries(store, qa, 100)
    got["b"] += pass_entries(store, qb, 100)
    assert got == {"a": list(range(1, 19)), "b": list(range(1, 7))}
    assert store.inspection.queue_depths() == {}
    if store.dialect == "sqlite":
        assert rotated == [None] * 12
    else:
        assert {r for r in rotated if r is not None}, rotated  # it did rotate


def test_a_queue_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(bare_store, bare_store.queues.list_queues)
    refused_for_no_schema(bare_store, lambda: bare_store.queues.queue_depth(1))


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2))
    got = across_outage(outage, store.queues.list_queues)
    assert [(q.source_id, q.client_name) for q in got] == [("a", "policy")]
    assert across_outage(outage, lambda: store.queues.queue_depth(got[0].queue_id)) == 2


def _lease(store: QueueStore, qid: int, owner: str, now: float) -> float | None:
    with store.write() as conn:
        return store.queues.acquire_lease(conn, qid, owner, now, 30.0)


def _state(store: QueueStore, qid: int) -> SubscriberState:
    with store.read() as conn:
        return store.queues.load_state(conn, qid)


def _save(store: QueueStore, qid: int, owner: str, delivered: int) -> bool:
    with store.write() as conn:
        return store.queues.save_state(
            conn,
            qid,
            owner,
            snapshot_id="s1",
            in_snapshot=True,
            delivered=delivered,
            lease_expires=1000.0,
            previous_seq=0,
            delivered_seq=0,
        )


def test_a_queue_without_state_has_the_defaults(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1))
    qid = _queue_id(store, "policy")
    assert _state(store, qid) == SubscriberState(qid)
    assert _state(store, qid + 1000) == SubscriberState(qid + 1000)
    assert not _save(store, qid, "s1", 5)  # no lease, no state
    assert _state(store, qid) == SubscriberState(qid)


def test_one_owner_holds_a_lease_until_it_expires(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1))
    qid = _queue_id(store, "policy")
    assert _lease(store, qid, "s1", 100.0) == 130.0
    assert _state(store, qid) == SubscriberState(qid, lease_owner="s1", lease_expires=130.0)
    assert _lease(store, qid, "s2", 110.0) is None  # a live lease of another
    assert _lease(store, qid, "s1", 120.0) == 150.0  # renewed by its owner
    assert _lease(store, qid, "s2", 149.0) is None
    assert _lease(store, qid, "s2", 151.0) == 181.0  # an expired one is taken over
    assert _state(store, qid).lease_owner == "s2"
    assert _lease(store, qid, "s1", 160.0) is None


def test_a_stale_owner_cannot_save_its_state(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1))
    qid = _queue_id(store, "policy")
    _lease(store, qid, "s1", 100.0)
    assert _save(store, qid, "s1", 3)
    assert _state(store, qid) == SubscriberState(qid, "s1", True, 3, "s1", 1000.0)
    with store.write() as conn:  # the lease expires and s2 takes it
        taken = store.queues.acquire_lease(conn, qid, "s2", 2000.0, 30.0)
    assert taken == 2030.0
    assert not _save(store, qid, "s1", 9)  # fenced: s1 must roll back
    assert _state(store, qid) == SubscriberState(qid, "s1", True, 3, "s2", 2030.0)
    assert _save(store, qid, "s2", 4)
    assert _state(store, qid) == SubscriberState(qid, "s1", True, 4, "s2", 1000.0)


def test_a_save_commits_or_rolls_back_with_the_delivery(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2))
    qid = _queue_id(store, "policy")
    _lease(store, qid, "s1", 100.0)
    with rolled_back(store) as conn:
        seq = store.heads.read_head(conn, qid, 10)[-1].seq
        assert store.queues.save_state(
            conn,
            qid,
            "s1",
            snapshot_id="",
            in_snapshot=False,
            delivered=2,
            lease_expires=150.0,
            previous_seq=0,
            delivered_seq=seq,
        )
    assert _state(store, qid) == SubscriberState(qid, lease_owner="s1", lease_expires=130.0)
    assert _positions(store, qid) == [1, 2]


def test_release_leases_gives_up_an_owners_leases(store: QueueStore) -> None:
    for source in ("a", "b", "c"):
        store.recv.apply_log_batch(source, "policy", log(1))
    qa, qb, qc = (q.queue_id for q in store.queues.list_queues("policy"))
    for qid in (qa, qb):
        _lease(store, qid, "s1", 100.0)
    _lease(store, qc, "s2", 100.0)
    with store.write() as conn:
        assert store.queues.release_leases(conn, "s1", [qa, qc]) == 1  # qc is not s1's
    assert [_state(store, q).lease_owner for q in (qa, qb, qc)] == ["", "s1", "s2"]
    assert _lease(store, qa, "s2", 101.0) == 131.0  # released: free at once
    with store.write() as conn:
        assert store.queues.release_leases(conn, "s1") == 1
        assert store.queues.release_leases(conn, "s1") == 0
        assert store.queues.release_leases(conn, "nobody", []) == 0
    assert [_state(store, q).lease_owner for q in (qa, qb, qc)] == ["s2", "", "s2"]
    assert _state(store, qb).lease_expires == 0.0
    with rolled_back(store) as conn:
        assert store.queues.release_leases(conn, "s2") == 2
    assert [_state(store, q).lease_owner for q in (qa, qb, qc)] == ["s2", "", "s2"]


def test_read_head_is_bounded_by_count_and_bytes(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(10, 11, 12, 13))
    store.recv.apply_log_batch("b", "policy", log(1))
    qa, qb = (q.queue_id for q in store.queues.list_queues("policy"))
    with store.read() as conn:
        head = store.heads.read_head(conn, qa, 3)
        assert [(e.source_position, e.payload, e.type) for e in head] == [
            (10, b"10", ReplicationType.LOG_ENTRY_SYNC),
            (11, b"11", ReplicationType.LOG_ENTRY_SYNC),
            (12, b"12", ReplicationType.LOG_ENTRY_SYNC),
        ]
        assert [e.seq for e in head] == sorted(e.seq for e in head)
        assert [e.source_position for e in store.heads.read_head(conn, qb, 10)] == [1]
        # Past the first entry, no more than max_bytes: the first always comes.
        assert [e.source_position for e in store.heads.read_head(conn, qa, 10, max_bytes=1)] == [10]
        whole = store.heads.read_head(conn, qa, 10, max_bytes=10**6)
        assert [e.source_position for e in whole] == [10, 11, 12, 13]
        assert store.heads.read_head(conn, qa + 1000, 10) == []


def test_peek_head_and_has_entries_probe_the_oldest_entry(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(7, 8))
    qid = _queue_id(store, "policy")
    with store.read() as conn:
        head = store.heads.peek_head(conn, qid)
        assert head is not None
        assert (head.source_position, head.type, head.payload) == (
            7,
            ReplicationType.LOG_ENTRY_SYNC,
            b"",  # without its payload
        )
        assert head.seq == store.heads.read_head(conn, qid, 1)[0].seq
        assert store.heads.has_entries(conn, qid)
        assert store.heads.peek_head(conn, qid + 1000) is None
        assert not store.heads.has_entries(conn, qid + 1000)
    pass_entries(store, qid, 10)
    with store.read() as conn:
        assert store.heads.peek_head(conn, qid) is None
        assert not store.heads.has_entries(conn, qid)


def test_has_snapshot_end_finds_the_end_marker_of_one_snapshot(store: QueueStore) -> None:
    snap = ReplicationType.SNAPSHOT_SYNC
    store.recv.apply_snapshot_batch("a", "policy", "s1", [WireEntry(1, snap, b"x", "s1")])
    qid = _queue_id(store, "policy")
    with store.read() as conn:
        assert not store.heads.has_snapshot_end(conn, qid, "s1")
        head = store.heads.peek_head(conn, qid)
        assert head is not None and (head.type, head.snapshot_id) == (snap, "s1")
    end = WireEntry(2, ReplicationType.LAST_FULL_SYNC_ENTRY, b"1", "s1", 1, base_position=5)
    store.recv.apply_snapshot_batch("a", "policy", "s1", [end])
    with store.read() as conn:
        assert store.heads.has_snapshot_end(conn, qid, "s1")
        assert not store.heads.has_snapshot_end(conn, qid, "s2")
        assert not store.heads.has_snapshot_end(conn, qid + 1000, "s1")
        assert [(e.type, e.snapshot_id) for e in store.heads.read_head(conn, qid, 10)] == [
            (snap, "s1"),
            (ReplicationType.LAST_FULL_SYNC_ENTRY, "s1"),
        ]
    pass_entries(store, qid, 10)  # delivered: an end marker passed is not in the queue
    with store.read() as conn:
        assert not store.heads.has_snapshot_end(conn, qid, "s1")
        assert store.heads.snapshot_base(conn, qid, "s1") is None


def test_the_base_position_is_kept_with_snapshot_entries_and_their_end(store: QueueStore) -> None:
    snap, end = ReplicationType.SNAPSHOT_SYNC, ReplicationType.LAST_FULL_SYNC_ENTRY
    store.recv.apply_log_batch("a", "policy", log(3))
    store.recv.apply_snapshot_batch(
        "a",
        "policy",
        "s1",
        [WireEntry(1, snap, b"x", "s1", base_position=9), WireEntry(2, snap, b"y", "s1")],
    )
    qid = _queue_id(store, "policy")
    with store.read() as conn:
        assert store.heads.snapshot_base(conn, qid, "s1") is None  # no end marker yet
        head = store.heads.read_head(conn, qid, 10)
        # a log entry has none; a snapshot entry sent without it (0) has none either
        assert [e.base_position for e in head] == [None, 9, None]
    store.recv.apply_snapshot_batch("a", "policy", "s1", [WireEntry(3, end, b"2", "s1", 2, 9)])
    store.recv.apply_snapshot_batch("b", "policy", "s0", [WireEntry(1, end, b"0", "s0", 0, 0)])
    qb = next(q.queue_id for q in store.queues.list_queues("policy") if q.source_id == "b")
    with store.read() as conn:
        assert store.heads.snapshot_base(conn, qid, "s1") == 9
        assert store.heads.read_head(conn, qid, 10)[-1].base_position == 9
        assert store.heads.snapshot_base(conn, qb, "s0") == 0  # an end marker's base may be 0
        assert store.heads.snapshot_base(conn, qid, "s0") is None  # another queue's snapshot
        peeked = store.heads.peek_head(conn, qb)
        assert peeked is not None and peeked.base_position == 0


def test_the_delivery_methods_on_an_empty_database_are_schema_errors(
    bare_store: QueueStore,
) -> None:
    def in_transaction(call: Callable[[Connection], object]) -> Callable[[], object]:
        def run() -> object:
            with bare_store.write() as conn:
                return call(conn)

        return run

    calls: list[Callable[[Connection], object]] = [
        lambda c: bare_store.queues.load_state(c, 1),
        lambda c: bare_store.queues.acquire_lease(c, 1, "s1", 100.0, 30.0),
        lambda c: bare_store.queues.save_state(
            c,
            1,
            "s1",
            snapshot_id="",
            in_snapshot=False,
            delivered=0,
            lease_expires=1.0,
            previous_seq=0,
            delivered_seq=1,
        ),
        lambda c: bare_store.queues.release_leases(c, "s1"),
        lambda c: bare_store.heads.read_head(c, 1, 10),
        lambda c: bare_store.heads.peek_head(c, 1),
        lambda c: bare_store.heads.has_snapshot_end(c, 1, "s1"),
        lambda c: bare_store.heads.has_entries(c, 1),
        lambda c: bare_store.queues.read_queue(c, 1, 10),
    ]
    for call in calls:
        refused_for_no_schema(bare_store, in_transaction(call))


def test_delivery_survives_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2))
    qid = _queue_id(store, "policy")
    assert across_outage(outage, lambda: _lease(store, qid, "s1", 100.0)) == 130.0
    assert across_outage(outage, lambda: _save(store, qid, "s1", 1))

    def head() -> list[int]:
        with store.read() as conn:
            assert store.heads.has_entries(conn, qid) and not store.heads.has_snapshot_end(
                conn, qid, "s1"
            )
            peeked = store.heads.peek_head(conn, qid)
            assert peeked is not None
            return [peeked.source_position] + [
                e.source_position for e in store.heads.read_head(conn, qid, 10)
            ]

    assert across_outage(outage, head) == [1, 1, 2]
    assert across_outage(outage, lambda: _state(store, qid)).delivered == 1

    def release() -> int:
        with store.write() as conn:
            return store.queues.release_leases(conn, "s1")

    assert across_outage(outage, release) in (0, 1)  # 0: an earlier attempt committed
    assert _state(store, qid).lease_owner == ""


def _keyed(*positions: int) -> list[WireEntry]:
    return [
        WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p, key=b"k%d" % p) for p in positions
    ]


def test_partitions_are_claimed_and_their_progress_is_compare_and_set(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", _keyed(1, 2, 3))
    qid = _queue_id(store, "policy")
    with store.write() as conn:
        assert store.queues.acquire_lease(conn, qid, "s1", 1000.0, 1e9) is not None
        store.partitions.claim_partitions(conn, qid, 3)
        scanned = store.partitions.scan_entries(conn, qid, 0, 10)
        marks = store.partitions.load_partitions(conn, qid)
    assert [(e.source_position, e.key, e.payload) for e in scanned] == [
        (1, b"k1", b""),
        (2, b"k2", b""),
        (3, b"k3", b""),
    ]
    start = marks[0]
    assert marks == {0: start, 1: start, 2: start} and start < scanned[0].seq
    with store.read() as conn:  # small payloads come with the scan when asked
        assert [
            e.payload for e in store.partitions.scan_entries(conn, qid, 0, 3, inline_bytes=3)
        ] == [
            b"1",
            b"2",
            b"3",
        ]
        assert [
            e.payload for e in store.partitions.scan_entries(conn, qid, 0, 3, inline_bytes=2)
        ] == [
            b"",
            b"",
            b"",
        ]
    seqs = [e.seq for e in scanned]
    with store.write() as conn:
        assert store.partitions.read_payloads(conn, qid, seqs[:2]) == {seqs[0]: b"1", seqs[1]: b"2"}
        assert store.queues.load_state(conn, qid).partitions == 3
        assert store.partitions.save_partition(
            conn, qid, "s1", 1, previous_seq=start, delivered_seq=seqs[1], delivered_seqs=[seqs[0]]
        )
    with rolled_back(store) as conn:  # from a stale point: refused (the caller rolls back)
        assert not store.partitions.save_partition(
            conn, qid, "s1", 1, previous_seq=start, delivered_seq=seqs[2], delivered_seqs=[]
        )
    with rolled_back(store) as conn:  # not the lease holder: refused
        assert not store.partitions.save_partition(
            conn, qid, "s2", 0, previous_seq=start, delivered_seq=seqs[2], delivered_seqs=[]
        )
    with store.write() as conn:
        assert store.partitions.load_partitions(conn, qid) == {0: start, 1: seqs[1], 2: start}
        assert store.queues.load_state(conn, qid).delivered_seq == start  # the minimum
        with pytest.raises(PartitionCountError):
            store.partitions.claim_partitions(conn, qid, 2)  # its partitions stand apart
        assert store.queues.load_state(conn, qid).partitions == 3


def test_only_sqlite_has_a_single_writer(store: QueueStore) -> None:
    assert store.single_writer is (store.dialect == "sqlite")


def test_a_late_write_takes_the_writers_turn_at_its_first_statement(store: QueueStore) -> None:
    """SQLite: the turn (and the database's write lock) from the transaction's first
    statement to its end, none before; it commits, or rolls back on an error."""
    turn = threading.Lock()
    store.recv.apply_log_batch("a", "policy", log(1, 2))
    qid = _queue_id(store, "policy")
    with store.write() as conn:
        assert store.queues.acquire_lease(conn, qid, "me", 100.0, 1e9) is not None

    def pass_head(conn: Connection) -> None:
        state = store.queues.load_state(conn, qid)
        assert turn.locked() is store.single_writer
        (head,) = store.heads.read_head(conn, qid, 1)
        assert store.queues.save_state(
            conn,
            qid,
            "me",
            snapshot_id="",
            in_snapshot=False,
            delivered=state.delivered + 1,
            lease_expires=1e9,
            previous_seq=state.delivered_seq,
            delivered_seq=head.seq,
        )

    with store.late_write(turn) as conn:
        assert not turn.locked()
        pass_head(conn)
    assert not turn.locked()
    with pytest.raises(RuntimeError), store.late_write(turn) as conn:
        pass_head(conn)
        raise RuntimeError
    assert not turn.locked()
    assert _positions(store, qid) == [2]  # the first passed, the second's pass rolled back


def test_a_pinned_thread_runs_its_transactions_on_one_connection(store: QueueStore) -> None:
    """One connection for the thread's transactions (another for one begun inside one),
    each with its own options: a read after a write takes no write lock (SQLite)."""
    store.recv.apply_log_batch("a", "policy", log(1))
    qid = _queue_id(store, "policy")

    def driver(conn: Connection) -> object:
        return conn.connection.driver_connection

    with store.pinned():
        with store.write() as conn:
            first = driver(conn)
            with store.read() as inner:
                assert driver(inner) is not first  # the pinned one is in a transaction
        with store.read() as conn:
            assert driver(conn) is first
            assert conn.get_execution_options().get("lr_immediate") is False
            assert store.queues.read_queue(conn, qid, 10)[0].source_position == 1
        with store.late_write(threading.Lock()) as conn:
            assert driver(conn) is first
    with store.read() as conn:
        assert driver(conn) is not None  # from the pool again


def test_the_queue_mark_is_raised_to_the_lowest_partition_by_the_lease_holder(
    store: QueueStore,
) -> None:
    store.recv.apply_log_batch("a", "policy", _keyed(1, 2, 3, 4))
    qid = _queue_id(store, "policy")
    with store.write() as conn:
        store.queues.acquire_lease(conn, qid, "s1", 1000.0, 1e9)
        store.partitions.claim_partitions(conn, qid, 2)
        start = store.partitions.load_partitions(conn, qid)[0]
        seqs = [e.seq for e in store.partitions.scan_entries(conn, qid, start, 10)]
    with store.write() as conn:  # a partition's delivery leaves the queue's mark as it is
        assert store.partitions.save_partition(
            conn, qid, "s1", 0, previous_seq=start, delivered_seq=seqs[2], delivered_seqs=seqs[:1]
        )
        assert store.partitions.save_partition(
            conn, qid, "s1", 1, previous_seq=start, delivered_seq=seqs[1], delivered_seqs=seqs[1:2]
        )
        assert store.queues.load_state(conn, qid).delivered_seq == start
    with store.write() as conn:
        assert not store.partitions.raise_queue_mark(conn, qid, "s2")  # not the lease holder
        assert store.queues.load_state(conn, qid).delivered_seq == start
        assert store.partitions.raise_queue_mark(conn, qid, "s1")
        assert store.queues.load_state(conn, qid).delivered_seq == seqs[1]  # the lowest partition
        assert not store.partitions.raise_queue_mark(conn, qid, "s1")  # already there
    assert store.queues.queue_depth(qid) == 2


def test_a_barrier_passes_every_partition_at_once(store: QueueStore) -> None:
    store.recv.apply_log_batch("a", "policy", log(1, 2))
    qid = _queue_id(store, "policy")
    with store.write() as conn:
        store.queues.acquire_lease(conn, qid, "s1", 1000.0, 1e9)
        store.partitions.claim_partitions(conn, qid, 2)
        start = store.partitions.load_partitions(conn, qid)[0]
        head = store.heads.read_head(conn, qid, 10, after=start)
        assert store.heads.peek_head(conn, qid, after=head[0].seq) == head[1]._replace(payload=b"")
    last = head[-1].seq
    barrier = dict(snapshot_id="", in_snapshot=False, delivered=2, lease_expires=1e9)
    with rolled_back(store) as conn:
        assert not store.partitions.save_barrier(
            conn,
            qid,
            "s1",
            count=2,
            previous_seq=start - 1,
            delivered_seq=last,
            **barrier,  # type: ignore[arg-type]
        )
    with store.write() as conn:
        assert store.partitions.save_barrier(
            conn,
            qid,
            "s1",
            count=2,
            previous_seq=start,
            delivered_seq=last,
            **barrier,  # type: ignore[arg-type]
        )
    with store.write() as conn:
        assert store.partitions.load_partitions(conn, qid) == {0: last, 1: last}
        assert store.queues.load_state(conn, qid).delivered_seq == last
        assert not store.heads.has_entries(conn, qid)
        store.partitions.claim_partitions(conn, qid, 1)  # they stand together: taken
        assert store.queues.load_state(conn, qid).partitions == 0
        assert store.partitions.load_partitions(conn, qid) == {}


# -- wake-ups on arrival -----------------------------------------------------------------


class _Wakes:
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.count += 1


def test_watch_arrivals_is_woken_by_its_clients_committed_batches(store: QueueStore) -> None:
    wakes = _Wakes()
    watch = store.queues.watch_arrivals(WATCHED, wakes)
    assert watch is not None
    try:
        wait_for(lambda: watch.connections == 1, what="the watch listening")
        assert watch.listening
        wait_for(lambda: wakes.count == 1, what="the wake-up after LISTEN")  # a first poll
        store.recv.apply_log_batch("a", WATCHED, log(1, 2))
        wait_for(lambda: wakes.count == 2, what="a wake-up for a stored batch")
        store.recv.apply_lane_batch("a", WATCHED, 1, 1, log(3), 2, 2)
        wait_for(lambda: wakes.count == 3, what="a wake-up for a lane batch")
        if store.dialect == "postgresql":
            # Another client's batch wakes nobody: notifications arrive in commit order,
            # so by the time the next one of ours woke it, the other's was passed over.
            # (SQLite's watch sees the receive queues' head: any client's batch.)
            store.recv.apply_log_batch("a", "other", log(1))
        store.recv.apply_log_batch("b", WATCHED, log(1))
        wait_for(lambda: wakes.count >= 4, what="the next wake-up")
        assert wakes.count == 4
        # A repeat stores nothing and announces nothing.
        store.recv.apply_log_batch("a", WATCHED, log(1, 2))
        store.recv.apply_log_batch("a", WATCHED, log(4))
        wait_for(lambda: wakes.count >= 5, what="the wake-up for position 4")
        assert wakes.count == 5
    finally:
        watch.close()


def test_watch_arrivals_listens_again_after_its_connection_is_cut(
    store: QueueStore, app_transaction: Callable[[], AbstractContextManager[Connection]]
) -> None:
    wakes = _Wakes()
    watch = store.queues.watch_arrivals(WATCHED, wakes)
    assert watch is not None
    if store.dialect == "sqlite":  # it watches a file: no connection to cut
        watch.close()
        return
    try:
        wait_for(lambda: watch.connections == 1, what="the watch listening")
        with app_transaction() as conn:  # an operator's pg_terminate_backend
            cut = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE query = 'LISTEN lrq_arrivals' AND pid <> pg_backend_pid() "
                    "AND application_name = current_setting('application_name')"
                )
            ).scalar()
        assert cut == 1
        wait_for(lambda: watch.connections == 2, what="the watch listening again")
        assert watch.listening
        before = wakes.count
        store.recv.apply_log_batch("a", WATCHED, log(1))
        wait_for(lambda: wakes.count > before, what="a wake-up on the new connection")
    finally:
        watch.close()
    assert not watch.listening


def test_read_statements_see_what_was_committed_before_them(store: QueueStore) -> None:
    """Every statement of the block sees what was committed before the block; on
    PostgreSQL (no transaction) a later statement also sees a commit made since."""
    store.recv.apply_log_batch("a", "policy", log(1))
    qid = _queue_id(store, "policy")
    with store.read_statements() as conn:
        assert store.heads.has_entries(conn, qid)
        assert [q.queue_id for q in store.queues.list_queues("other")] == []
        store.recv.apply_log_batch("a", "other", log(1))  # committed while the block is open
        other = _queue_id(store, "other")
        assert store.heads.has_entries(conn, other) is (store.dialect == "postgresql")
        assert store.heads.has_entries(conn, qid)
    with store.read_statements() as conn:
        assert store.heads.has_entries(conn, other)


def test_a_locked_state_read_waits_for_a_writer_and_sees_its_commit(store: QueueStore) -> None:
    """``load_state(lock=True)`` in a write transaction returns only once a transaction
    that wrote the state committed, and with what it wrote (PostgreSQL: the row lock;
    SQLite: its one writer)."""
    store.recv.apply_log_batch("a", "policy", log(1))
    qid = _queue_id(store, "policy")
    assert _lease(store, qid, "s1", 100.0) is not None
    written, release = threading.Event(), threading.Event()
    seen: list[SubscriberState] = []

    def writer() -> None:
        with store.write() as conn:
            assert store.queues.acquire_lease(conn, qid, "s1", 100.0, 60.0) == 160.0
            written.set()
            assert release.wait(30)

    def reader() -> None:
        with store.write() as conn:
            seen.append(store.queues.load_state(conn, qid, lock=True))

    first = threading.Thread(target=writer)
    first.start()
    assert written.wait(30)
    second = threading.Thread(target=reader)
    second.start()
    second.join(0.5)  # a bound: it must still be waiting for the writer
    blocked = second.is_alive()
    release.set()
    first.join(30)
    second.join(30)
    assert blocked and not second.is_alive()
    assert [s.lease_expires for s in seen] == [160.0]
