"""Trim and retention on SQLite and PostgreSQL: the exact shapes where data is lost.

Each test names its positions and checks which entries remain, by position, after
an unbounded trim: what a destination still needs stays, the rest goes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy.engine import Connection

from lr_client.records import EntryRef
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.retention.store import RetentionStore
from tests.conftest import PgSchema
from tests.kit.pglocks import waiting_for_a_lock
from tests.kit.positions import new_slot, positions
from tests.kit.wait import join, wait_for

CLIENT = "policy"


def send(store: SQLAlchemyQueueStore, *destinations: list[str]) -> list[int]:
    """Transmit one entry per list of destinations, each apart; their positions."""
    nums = store.sites.register_sites(sorted({d for ds in destinations for d in ds}))
    refs = []
    for i, ds in enumerate(destinations):  # each in a slot of its own (see new_slot)
        new_slot(store)
        with store.write() as conn:
            refs += store.send.append_log_entries(
                conn, CLIENT, [(b"%d" % i, [nums[d] for d in ds])]
            )
    return positions(store, refs)


def left(store: SQLAlchemyQueueStore) -> list[int]:
    return [e.position for e in store.shipping.read_client_log(CLIENT, 0, 1000)]


def reads(store: SQLAlchemyQueueStore, destination: str, after: int) -> list[int]:
    return [e.position for e in store.shipping.read_log_entries(destination, CLIENT, after, 1000)]


def test_the_first_unacknowledged_entry_survives_the_trim(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b"], ["b"], ["b"])
    store.shipping.set_cursor("b", CLIENT, p[0])  # b has the first; the next one is b's too
    store.retention.trim()
    assert left(store) == p[1:]
    assert reads(store, "b", p[0]) == p[1:]
    store.shipping.set_cursor("b", CLIENT, p[1])
    store.retention.trim(batch_size=1)
    assert left(store) == p[2:]


def test_an_entry_is_trimmed_only_once_every_destination_acknowledged_it(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b", "c"], ["b", "c"], ["c"], ["b"])
    store.shipping.set_cursor("b", CLIENT, p[0])
    store.shipping.set_cursor("c", CLIENT, p[1])
    store.retention.trim()
    assert left(store) == p[1:]  # p1 waits for b, p2 for c, p3 for b
    assert reads(store, "b", p[0]) == [p[1], p[3]]
    assert reads(store, "c", p[1]) == [p[2]]
    store.shipping.set_cursor("b", CLIENT, p[3])
    store.retention.trim()
    assert left(store) == [p[2]]
    store.shipping.set_cursor("c", CLIENT, p[2])
    store.retention.trim()
    assert left(store) == []


def test_each_streams_trim_mark_is_the_last_of_its_own_entries_trimmed(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b", "c"], ["b"], ["c"], ["b", "c"], ["d"])
    store.shipping.set_cursor("b", CLIENT, p[3])
    store.shipping.set_cursor("c", CLIENT, p[2])
    store.shipping.set_cursor("d", CLIENT, p[4])
    store.retention.trim()  # in one range: b, c and d are past p[2]
    assert left(store) == [p[3]]
    assert store.retention.trimmed_through("b", CLIENT) == p[1]
    assert store.retention.trimmed_through("c", CLIENT) == p[2]
    assert store.retention.trimmed_through("d", CLIENT) == p[4]


def test_a_destination_without_a_cursor_keeps_everything_it_was_sent(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b"], ["b", "c"], ["c"])
    store.shipping.set_cursor("b", CLIENT, p[1])
    store.retention.trim()
    assert left(store) == p[1:]
    assert reads(store, "c", 0) == p[1:]


def test_trim_keeps_what_an_open_snapshots_base_needs(store: SQLAlchemyQueueStore) -> None:
    before = send(store, ["b"], ["b"])
    sid = store.snapshots.request_snapshot(None, "b", CLIENT, "test")
    store.shipping.set_cursor("b", CLIENT, before[-1])
    store.retention.trim()
    assert left(store) == []  # a request without a base pins nothing
    started = store.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == before[-1]
    after = send(store, ["b"], ["b"], ["b"])
    store.shipping.set_cursor("b", CLIENT, after[-1])  # the sink acknowledges them meanwhile
    store.retention.trim()
    # After the snapshot, log entries resume from its base: they must still be there.
    assert left(store) == after
    assert reads(store, "b", before[-1]) == after
    store.snapshot_entries.finish_snapshot(sid)  # READY: still open
    store.retention.trim()
    assert left(store) == after
    store.snapshots.complete_snapshot(sid)  # done: the cursor alone counts again
    store.retention.trim()
    assert left(store) == []


def test_an_open_snapshots_base_pins_only_its_own_stream(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b", "c"], ["b", "c"])
    sid = store.snapshots.request_snapshot(None, "b", CLIENT, "test")
    started = store.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == p[1]
    q = send(store, ["b", "c"], ["c"])
    store.shipping.set_cursor("b", CLIENT, q[0])
    store.shipping.set_cursor("c", CLIENT, q[1])
    store.retention.trim()
    assert left(store) == [q[0]]  # b needs what follows its base; c needs nothing more


def test_a_dropped_stream_releases_its_retention(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b", "c"], ["c"], ["c"])
    store.shipping.set_cursor("b", CLIENT, p[0])
    assert store.retention.drop_stream("c", CLIENT, "too far behind") is not None
    store.retention.trim()
    assert left(store) == []  # only c needed them
    # What is sent to the dropped stream afterwards waits for nobody either,
    q = send(store, ["c"], ["b", "c"])
    store.shipping.set_cursor("b", CLIENT, q[1])
    store.retention.trim()
    assert left(store) == []
    # until its full sync fixes a base: from there the stream needs its entries again.
    sid = store.snapshots.request_snapshot(None, "c", CLIENT, "dropped")
    started = store.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == q[1]
    r = send(store, ["c"], ["b"])
    store.shipping.set_cursor("b", CLIENT, r[1])
    store.retention.trim()
    assert left(store) == [r[0]]
    assert reads(store, "c", q[1]) == [r[0]]


def test_a_drop_during_an_open_snapshot_keeps_what_follows_its_base(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b"])
    sid = store.snapshots.request_snapshot(None, "b", CLIENT, "test")
    started = store.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == p[0]
    q = send(store, ["b"], ["b", "c"])
    assert store.retention.drop_stream("b", CLIENT, "over retention") is not None
    store.shipping.set_cursor("c", CLIENT, q[1])
    store.retention.trim()
    # The snapshot still resumes log entries after its base: nothing after it is lost.
    assert reads(store, "b", p[0]) == q
    assert left(store) == q


def whole_slots(store: SQLAlchemyQueueStore) -> bool:
    """PostgreSQL retires whole slots: the batch bounds are SQLite's, for its row deletes."""
    return store.dialect == "postgresql"


def test_trim_works_in_bounded_batches_oldest_first(store: SQLAlchemyQueueStore) -> None:
    p = send(store, *[["b"]] * 6)
    store.shipping.set_cursor("b", CLIENT, p[-1])
    if whole_slots(store):
        assert store.retention.trim(batch_size=1, max_batches=1) == 6
        assert left(store) == []
        return
    assert store.retention.trim(batch_size=1, max_batches=1) == 1
    assert left(store) == p[1:]
    assert store.retention.trim(batch_size=2, max_batches=2) == 4
    assert left(store) == p[5:]
    assert store.retention.trim(batch_size=2) == 1  # unbounded: until a batch is not full
    assert left(store) == []


def test_a_bounded_batch_counts_across_acknowledgement_ranges(
    store: SQLAlchemyQueueStore,
) -> None:
    """b acknowledged 2, c 6: two ranges, (0, 2] and (2, 6]; one batch of 3 deletes 3."""
    p = send(store, ["b"], ["b"], ["c"], ["c"], ["c"], ["c"])
    store.shipping.set_cursor("b", CLIENT, p[1])
    store.shipping.set_cursor("c", CLIENT, p[5])
    if whole_slots(store):
        assert store.retention.trim(batch_size=3, max_batches=1) == 6
        return
    assert store.retention.trim(batch_size=3, max_batches=1) == 3
    assert left(store) == p[3:]
    assert store.retention.trim() == 3
    assert left(store) == []


def test_a_bounded_batch_counts_across_clients(store: SQLAlchemyQueueStore) -> None:
    nums = store.sites.register_sites(["b"])
    with store.write() as conn:
        refs = {
            client: store.send.append_log_entries(conn, client, [(b"x", [nums["b"]])] * 3)
            for client in ("alpha", "beta")
        }
    alpha, beta = positions(store, refs["alpha"]), positions(store, refs["beta"])
    store.shipping.set_cursor("b", "alpha", alpha[-1])
    store.shipping.set_cursor("b", "beta", beta[-1])
    if whole_slots(store):  # both clients' entries share one slot
        assert store.retention.trim(batch_size=4, max_batches=1) == 6
        assert store.shipping.read_client_log("beta", 0, 10) == []
        return
    assert store.retention.trim(batch_size=4, max_batches=1) == 4  # alpha's 3, then one of beta's
    assert [e.position for e in store.shipping.read_client_log("alpha", 0, 10)] == []
    assert [e.position for e in store.shipping.read_client_log("beta", 0, 10)] == beta[1:]
    assert store.retention.trim(batch_size=10) == 2  # the rest of beta's
    with store.write() as conn:
        more = {
            client: store.send.append_log_entries(conn, client, [(b"y", [nums["b"]])] * 2)
            for client in ("alpha", "beta")
        }
    store.shipping.set_cursor("b", "alpha", positions(store, more["alpha"])[-1])
    store.shipping.set_cursor("b", "beta", positions(store, more["beta"])[-1])
    assert store.retention.trim(batch_size=10) == 4  # both clients' deletions counted in one batch


def test_a_bounded_batch_counts_what_it_deletes_and_stops_once_full(
    store: SQLAlchemyQueueStore,
) -> None:
    """b acknowledged 5, c 0: ranges (0, 0] and (0, 5]. Row by row (SQLite), a batch
    counts the entries it deletes, not c's it passes over, and a batch filled at a
    range's end goes no further."""
    p = send(store, ["b"], ["c"], ["b"], ["c"], ["b"], ["b"])
    store.shipping.set_cursor("b", CLIENT, p[5])
    store.shipping.set_cursor("c", CLIENT, p[0])
    if not whole_slots(store):
        assert store.retention.trim(batch_size=1, max_batches=1) == 1
        assert left(store) == p[1:]
        assert store.retention.trim(batch_size=2, max_batches=1) == 2
        assert left(store) == [p[1], p[3], p[5]]
    store.retention.trim()
    assert left(store) == [p[1], p[3]]


def test_a_bounded_batch_counts_only_its_clients_entries_among_others(
    store: SQLAlchemyQueueStore,
) -> None:
    nums = store.sites.register_sites(["b"])
    refs: dict[str, list[EntryRef]] = {"alpha": [], "beta": []}
    for _ in range(3):  # interleaved: alpha, beta, alpha, beta, ...
        for client in ("alpha", "beta"):
            new_slot(store)
            with store.write() as conn:
                refs[client] += store.send.append_log_entries(conn, client, [(b"x", [nums["b"]])])
    alpha, beta = positions(store, refs["alpha"]), positions(store, refs["beta"])
    store.shipping.set_cursor("b", "alpha", alpha[-1])
    store.shipping.set_cursor("b", "beta", beta[-1])
    if not whole_slots(store):
        assert store.retention.trim(batch_size=2, max_batches=1) == 2  # alpha's first two
        assert [e.position for e in store.shipping.read_client_log("alpha", 0, 10)] == alpha[2:]
        assert [e.position for e in store.shipping.read_client_log("beta", 0, 10)] == beta
    store.retention.trim()
    assert store.shipping.read_client_log("alpha", 0, 10) == []
    assert store.shipping.read_client_log("beta", 0, 10) == []


def test_one_clients_acknowledgement_trims_nothing_of_another(
    store: SQLAlchemyQueueStore,
) -> None:
    nums = store.sites.register_sites(["b"])
    refs = []
    for client in ("policy", "inventory", "policy", "inventory"):
        new_slot(store)
        with store.write() as conn:
            refs += store.send.append_log_entries(conn, client, [(b"x", [nums["b"]])])
    mixed = positions(store, refs)
    store.shipping.set_cursor("b", "policy", mixed[2])
    store.retention.trim()
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 10)] == []
    kept = [mixed[1], mixed[3]]
    assert [e.position for e in store.shipping.read_client_log("inventory", 0, 10)] == kept
    assert [e.position for e in store.shipping.read_log_entries("b", "inventory", 0, 10)] == kept


def test_a_store_that_never_read_its_sites_trims_too(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b"], ["b"])
    store.shipping.set_cursor("b", CLIENT, p[0])
    fresh = open_store(store.engine)  # a new process: no cached site numbers
    fresh.retention.rotation_period = 0.0
    assert fresh.retention.trim() == 1
    assert left(store) == p[1:]


def test_drop_records_its_own_stream(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b", "c"], ["b", "c"], ["c"])
    store.shipping.set_cursor("b", CLIENT, p[0])
    store.shipping.set_cursor("c", CLIENT, p[1])
    drop = store.retention.drop_stream("c", CLIENT, "over retention")
    assert drop is not None
    assert (drop.destination, drop.client_name, drop.first_dropped_position, drop.reason) == (
        "c",
        CLIENT,
        p[1] + 1,
        "over retention",
    )
    assert store.retention.list_drops() == [drop]
    assert store.retention.drop_stream("c", CLIENT, "again") == drop  # one record per stream
    cursor = store.shipping.get_cursor("c", CLIENT)
    assert (cursor.position, cursor.needs_snapshot) == (p[1], True)
    other = store.shipping.get_cursor("b", CLIENT)
    assert (other.position, other.needs_snapshot) == (p[0], False)
    # The other destination still reads all it has not acknowledged.
    assert reads(store, "b", p[0]) == [p[1]]
    # Other streams get their own records; clearing one keeps the others.
    second = store.retention.drop_stream("b", CLIENT, "b too")
    third = store.retention.drop_stream("c", "inventory", "other client")
    assert second is not None and (second.destination, second.first_dropped_position) == (
        "b",
        p[0] + 1,
    )
    assert third is not None and (third.client_name, third.first_dropped_position) == (
        "inventory",
        1,
    )
    key = lambda d: (d.destination, d.client_name)  # noqa: E731
    assert sorted(store.retention.list_drops(), key=key) == sorted([drop, second, third], key=key)
    store.retention.clear_drop("c", CLIENT)
    assert sorted(store.retention.list_drops(), key=key) == sorted([second, third], key=key)


def test_a_drop_keeps_other_streams_entries(store: SQLAlchemyQueueStore) -> None:
    nums = store.sites.register_sites(["b", "c"])
    with store.write() as conn:
        mine_refs = store.send.append_log_entries(
            conn, CLIENT, [(b"x", [nums["b"], nums["c"]])] * 3
        )
        theirs_refs = store.send.append_log_entries(conn, "inventory", [(b"y", [nums["c"]])] * 2)
    mine, theirs = positions(store, mine_refs), positions(store, theirs_refs)
    assert store.retention.drop_stream("c", CLIENT, "too slow") is not None
    assert reads(store, "b", 0) == mine  # another destination of the same client
    got = [e.position for e in store.shipping.read_log_entries("c", "inventory", 0, 10)]
    assert got == theirs  # the same destination, another client
    store.retention.trim()
    assert left(store) == mine
    assert [e.position for e in store.shipping.read_client_log("inventory", 0, 10)] == theirs


def test_a_dropped_stream_holds_nothing_however_far_the_positions_go(
    store: SQLAlchemyQueueStore,
) -> None:
    assert store.retention.drop_stream("c", CLIENT, "gone") is None  # unknown destination: no drop
    store.sites.register_sites(["c"])
    assert store.retention.drop_stream("c", CLIENT, "gone") is not None
    # Past 2 * 62 (a mutant of the drop's hold, 2**62), in three slots, not one slot each.
    nums = store.sites.register_sites(["c"])
    refs = []
    for i in range(3):
        new_slot(store)
        with store.write() as conn:
            batch = [(b"%d-%d" % (i, j), [nums["c"]]) for j in range(100)]
            refs += store.send.append_log_entries(conn, CLIENT, batch)
    p = positions(store, refs)
    store.retention.trim()
    assert p[-1] >= 300 and left(store) == []


def test_trim_keeps_the_entries_of_a_ready_snapshot(store: SQLAlchemyQueueStore) -> None:
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", CLIENT, "test")
    assert store.snapshots.start_snapshot(sid) is not None
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"r1", b"r2"])
    store.snapshot_entries.finish_snapshot(sid)
    store.retention.trim()
    payloads = [e.payload for e in store.snapshot_entries.read_snapshot_entries(sid, 0, 10)]
    assert payloads == [b"r1", b"r2", b"2"]


def test_a_full_sync_started_during_a_trim_waits_for_it_and_keeps_what_follows(
    pg_schema: PgSchema,
) -> None:
    """A base fixed and entries committed while trim runs are not trimmed by what it read.

    PostgreSQL: a base is read from the sequencer, whose lock the trim holds,
    so a full sync starting mid-trim waits for it; the entries that follow
    its base are kept.
    """
    admin = pg_schema.admin

    class Interleaved(RetentionStore):
        meanwhile: Callable[[], None] | None = None

        def acked_positions(self, conn: Connection) -> dict[tuple[int, str], int]:
            out = super().acked_positions(conn)
            if self.meanwhile is not None:
                run, self.meanwhile = self.meanwhile, None
                run()
            return out

    store = open_store(pg_schema.engine())
    interleaved = store.retention = Interleaved(store.core)
    store.create_schema()
    store.retention.rotation_period = 0.0
    send(store, ["c"])
    store.retention.rotate_send_log()  # its slot is closed: the trim judges it
    assert store.retention.drop_stream("c", CLIENT, "too slow") is not None  # c needs nothing now
    added: list[int] = []
    errors: list[BaseException] = []
    other = open_store(pg_schema.engine(connect_args={"application_name": "full-sync"}))

    def full_sync_starts_and_entries_follow() -> None:
        try:
            sid = other.snapshots.request_snapshot(None, "c", CLIENT, "dropped")
            assert other.snapshots.start_snapshot(sid) is not None
            added.extend(send(other, ["c"], ["c"]))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=full_sync_starts_and_entries_follow)

    def start_and_wait_until_blocked() -> None:
        thread.start()
        wait_for(lambda: waiting_for_a_lock(admin, "full-sync"), timeout=30)

    interleaved.meanwhile = start_and_wait_until_blocked
    store.retention.trim()
    join(thread)
    assert errors == []
    assert interleaved.meanwhile is None and len(added) == 2  # the interleaving happened
    # The entries after the new base are needed by c's full sync: still there.
    assert left(store) == added
