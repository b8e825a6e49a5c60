"""Members: a site's servers, their heartbeats, and the leases and fences of its units."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from lr_client.errors import FencedError, InvalidInputError
from lr_client.records import SnapshotStatus
from lr_client.store.contract import QueueStore
from lr_client.store.schema import tables
from tests.contract.calls import append

TIMEOUT = 5.0


def test_a_member_joins_heartbeats_and_leaves(store: QueueStore) -> None:
    before = store.members.db_now()
    joined = store.members.join_member("m1", "i1", "127.0.0.1:7001", 2)
    assert joined.joined_at >= before - 1.0
    assert [
        (m.member_id, m.instance, m.address, m.weight, m.alive)
        for m in store.members.list_members(TIMEOUT)
    ] == [("m1", "i1", "127.0.0.1:7001", 2, True)]
    assert store.members.heartbeat_member("m1", "i1", TIMEOUT)
    assert store.members.heartbeat_member("m1", "other", TIMEOUT) is None  # another run's row
    assert store.members.list_members(TIMEOUT)[0].heartbeat_at >= joined.heartbeat_at
    assert store.members.leave_member("m1", "i1") == 0
    assert store.members.list_members(TIMEOUT) == []
    assert store.members.heartbeat_member("m1", "i1", TIMEOUT) is None


def test_a_heartbeat_reads_the_roster_it_recorded(store: QueueStore) -> None:
    """The members come from the heartbeat's own transaction, the member's new heartbeat
    in them, with how many units the heartbeating instance holds."""
    store.members.join_member("m1", "i1", "", 2)
    store.members.join_member("m2", "i2", "", 1)
    fence = store.members.acquire_unit("stream/x/policy", "m1", "i1", TIMEOUT)
    assert fence is not None
    assert store.members.acquire_unit("stream/x/other", "m2", "i2", TIMEOUT) is not None
    assert store.members.acquire_unit("trim", "m1", "i1", TIMEOUT) is not None
    before = store.members.list_members(TIMEOUT)[0].heartbeat_at
    roster = store.members.heartbeat_member("m1", "i1", TIMEOUT)
    assert roster is not None
    assert [(m.member_id, m.weight, m.alive) for m in roster.members] == [
        ("m1", 2, True),
        ("m2", 1, True),
    ]
    assert roster.members[0].heartbeat_at >= before
    assert roster.members == store.members.list_members(TIMEOUT)
    assert roster.held == 2
    assert store.members.release_unit(fence)
    after = store.members.heartbeat_member("m1", "i1", TIMEOUT)
    assert after is not None and after.held == 1
    gone = store.members.heartbeat_member("m1", "i1", -1.0)  # every heartbeat is too old
    assert gone is not None and not any(m.alive for m in gone.members)


def test_a_member_back_from_a_stall_reads_itself_alive(store: QueueStore) -> None:
    """A heartbeat after a stall longer than the timeout: the member's own row in the
    roster has the new stamp and is alive; another's old heartbeat is not."""
    store.members.join_member("m1", "i1", "", 1)
    store.members.join_member("m2", "i2", "", 1)
    m = tables.members
    with store.write() as conn:
        conn.execute(update(m).values(heartbeat_at=m.c.heartbeat_at - 100 * TIMEOUT))
    roster = store.members.heartbeat_member("m1", "i1", TIMEOUT)
    assert roster is not None
    mine, other = roster.members
    assert (mine.member_id, mine.alive, other.alive) == ("m1", True, False)
    assert mine.heartbeat_at == store.members.list_members(TIMEOUT)[0].heartbeat_at
    assert roster.members == store.members.list_members(TIMEOUT)


def test_a_member_whose_heartbeat_is_older_than_the_timeout_is_gone(store: QueueStore) -> None:
    store.members.join_member("m1", "i1", "", 1)
    assert store.members.list_members(TIMEOUT)[0].alive
    assert not store.members.list_members(-1.0)[0].alive  # any heartbeat is older than that


def test_weights_change_at_run_time_and_bad_values_change_nothing(store: QueueStore) -> None:
    store.members.join_member("m1", "i1", "", 1)
    assert store.members.set_member_weight("m1", 0)
    assert store.members.list_members(TIMEOUT)[0].weight == 0
    assert not store.members.set_member_weight("nobody", 3)
    with pytest.raises(InvalidInputError):
        store.members.set_member_weight("m1", -1)
    with pytest.raises(InvalidInputError):
        store.members.join_member("", "i2", "", 1)
    with pytest.raises(InvalidInputError):
        store.members.join_member("m2", "i2", "", -1)
    assert [(m.member_id, m.weight) for m in store.members.list_members(TIMEOUT)] == [("m1", 0)]


def test_a_unit_has_one_owner_and_each_new_owner_a_higher_token(store: QueueStore) -> None:
    store.members.join_member("a", "ia", "", 1)
    store.members.join_member("b", "ib", "", 1)
    fa = store.members.acquire_unit("stream/x/policy", "a", "ia", TIMEOUT)
    assert fa is not None and fa.owner == "ia"
    assert (
        store.members.acquire_unit("stream/x/policy", "a", "ia", TIMEOUT) == fa
    )  # kept, same token
    assert store.members.acquire_unit("stream/x/policy", "b", "ib", TIMEOUT) is None  # a is alive
    assert store.members.release_unit(fa)
    assert not store.members.release_unit(fa)
    fb = store.members.acquire_unit("stream/x/policy", "b", "ib", TIMEOUT)
    assert fb is not None and fb.token > fa.token
    store.members.check_fence(fb)
    with pytest.raises(FencedError):
        store.members.check_fence(fa)
    [lease] = store.members.list_leases()
    assert (lease.unit, lease.owner, lease.member_id, lease.token) == (
        "stream/x/policy",
        "ib",
        "b",
        fb.token,
    )


def test_a_unit_whose_owner_is_gone_or_replaced_is_taken_over(store: QueueStore) -> None:
    store.members.join_member("a", "ia", "", 1)
    store.members.join_member("b", "ib", "", 1)
    fa = store.members.acquire_unit("trim", "a", "ia", TIMEOUT)
    assert fa is not None
    # Heartbeats older than a negative timeout: a is gone for b.
    fb = store.members.acquire_unit("trim", "b", "ib", -1.0)
    assert fb is not None and fb.token == fa.token + 1
    # a restarted (a new instance of the same member): the old run's leases are free.
    store.members.join_member("b", "ib2", "", 1)
    fb2 = store.members.acquire_unit("trim", "b", "ib2", TIMEOUT)
    assert fb2 is not None and fb2.token == fb.token + 1


def test_leaving_or_being_removed_releases_every_lease(store: QueueStore) -> None:
    store.members.join_member("a", "ia", "", 1)
    store.members.join_member("b", "ib", "", 1)
    for unit in ("u1", "u2"):
        assert store.members.acquire_unit(unit, "a", "ia", TIMEOUT) is not None
    assert store.members.acquire_unit("u3", "b", "ib", TIMEOUT) is not None
    assert store.members.leave_member("a", "ia") == 2
    assert {lease.unit: lease.owner for lease in store.members.list_leases()} == {
        "u1": None,
        "u2": None,
        "u3": "ib",
    }
    assert store.members.remove_member("b")
    assert not store.members.remove_member("b")
    assert all(lease.owner is None for lease in store.members.list_leases())
    with pytest.raises(InvalidInputError):
        store.members.acquire_unit("", "a", "ia", TIMEOUT)


def test_a_cursor_moves_only_under_the_current_fence(store: QueueStore) -> None:
    append(store, "policy", (b"1", ["b"]), (b"2", ["b"]))
    store.members.join_member("a", "ia", "", 1)
    store.members.join_member("b", "ib", "", 1)
    fa = store.members.acquire_unit("stream/b/policy", "a", "ia", TIMEOUT)
    assert fa is not None
    store.shipping.set_cursor("b", "policy", 1, fence=fa)
    fb = store.members.acquire_unit("stream/b/policy", "b", "ib", -1.0)  # a's lease lapsed
    assert fb is not None
    with pytest.raises(FencedError):
        store.shipping.set_cursor("b", "policy", 2, fence=fa)  # the deposed owner's ack
    assert store.shipping.get_cursor("b", "policy").position == 1  # unchanged
    store.shipping.set_cursor("b", "policy", 2, fence=fb)
    assert store.shipping.get_cursor("b", "policy").position == 2


def test_completing_a_snapshot_and_trimming_need_the_current_fence(store: QueueStore) -> None:
    store.members.join_member("a", "ia", "", 1)
    fa = store.members.acquire_unit("stream/b/policy", "a", "ia", TIMEOUT)
    ta = store.members.acquire_unit("trim", "a", "ia", TIMEOUT)
    assert fa is not None and ta is not None
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    store.snapshots.start_snapshot(sid)
    store.snapshot_entries.finish_snapshot(sid)
    store.members.release_unit(fa)
    store.members.release_unit(ta)
    p = append(store, "policy", (b"1", ["b"]))
    store.shipping.set_cursor("b", "policy", p[0])
    with pytest.raises(FencedError):
        store.snapshots.complete_snapshot(sid, fence=fa)
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status is SnapshotStatus.READY
    with pytest.raises(FencedError):
        store.retention.trim(fence=ta)
    assert store.shipping.oldest_position("policy") == p[0]  # nothing trimmed
    fa2 = store.members.acquire_unit("stream/b/policy", "a", "ia", TIMEOUT)
    assert fa2 is not None and store.snapshots.complete_snapshot(sid, fence=fa2)
