"""PostgreSQL's send queue slots: rotation, retirement by TRUNCATE, bounded storage.

What trim keeps, entry by entry, is ``test_trim.py``'s and
``test_trim_property.py``'s (which also rotate at random); this module
checks what the slots themselves promise: a transaction's rows share a slot,
a slot goes only whole and only once every stream passed it, nothing is
deleted row by row, nobody is waited for, and storage stays bounded while a
transaction pins the vacuum horizon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from lr_client.records import EntryRef
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.postgres import PostgresCore
from lr_client.store.retention import slots
from lr_client.store.send import sequencer
from tests.conftest import PgSchema
from tests.kit.pglocks import waiting_for_a_lock
from tests.kit.positions import positions
from tests.kit.statements import recorded
from tests.kit.wait import join, wait_for

CLIENT = "policy"
TABLES = ("lrq_send_entries", "lrq_send_commits", "lrq_send_positions", "lrq_send_blocks")


@pytest.fixture
def store(pg_schema: PgSchema) -> Iterator[SQLAlchemyQueueStore]:
    st = open_store(pg_schema.engine())
    assert isinstance(st.core, PostgresCore)
    st.create_schema()
    st.sites.register_sites(["b", "c"])
    st.retention.rotation_period = 0.0
    yield st


def commit(store: SQLAlchemyQueueStore, n: int = 1, dests: tuple[str, ...] = ("b",)) -> list[int]:
    nums = store.sites.site_numbers()
    with store.engine.begin() as conn:
        refs = store.send.append_log_entries(
            conn, CLIENT, [(b"x" * 1000, [nums[d] for d in dests])] * n
        )
    return positions(store, refs)


def slot_of(store: SQLAlchemyQueueStore, table: str) -> set[int]:
    with store.read() as conn:
        return set(conn.execute(text(f"SELECT DISTINCT slot FROM {table}")).scalars())


def current(store: SQLAlchemyQueueStore) -> int:
    return next(x.slot for x in store.retention.send_slots() if x.current)


def write_late(app: Connection, slot: int) -> None:
    """Make ``app``'s transaction write into ``slot`` as a late writer does: one that took
    the slot as current before it closed (a transaction's slot is its setting
    ``lrq.slot_<oid>``, revision 0006)."""
    app.execute(
        text(
            "SELECT set_config('lrq.slot_' || CAST(CAST('lrq_send_entries' AS regclass)"
            " AS oid), :slot, true)"
        ),
        {"slot": str(slot)},
    )


def naming(seen: list[str], part: str) -> list[str]:
    return [x for x in seen if part in x]


LOCK = "lrq_lock_send_slot("
SCAN = "unnest(p.dest_nums)"  # the per-stream scan of a slot's positions
TICK = "lrq_send_tick("


def deleted_rows(store: SQLAlchemyQueueStore, schema: str) -> int:
    """Rows ever deleted from the send queue's partitions (statistics flushed first)."""
    with store.engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    with store.engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                text(
                    "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables "
                    "WHERE schemaname = :s AND relname LIKE 'lrq\\_send\\_%\\_s%'"
                ),
                {"s": schema},
            ).scalar_one()
        )


def test_a_transactions_rows_share_the_current_slot(store: SQLAlchemyQueueStore) -> None:
    commit(store, 3)
    first = current(store)
    for table in TABLES:
        assert slot_of(store, table) == {first}, table
    assert store.retention.rotate_send_log() not in (None, first)
    commit(store, 2)
    assert slot_of(store, "lrq_send_entries") == {first, current(store)}
    assert store.retention.rotate_send_log() is not None
    assert store.retention.rotate_send_log() is None  # the current slot is empty: nothing to close


def test_a_passed_slot_is_truncated_never_deleted_row_by_row(
    store: SQLAlchemyQueueStore, pg_schema: PgSchema
) -> None:
    p = commit(store, 50)
    before = {x.slot: x.bytes for x in store.retention.send_slots()}
    store.shipping.set_cursor("b", CLIENT, p[-1])
    assert store.retention.trim() == 50
    after = {x.slot: x for x in store.retention.send_slots()}
    assert all(x.entries == 0 for x in after.values())
    assert sum(x.bytes for x in after.values()) < sum(before.values())
    assert deleted_rows(store, pg_schema.name) == 0
    assert store.retention.trimmed_through("b", CLIENT) == p[-1]


def test_a_slot_holding_an_unacknowledged_entry_is_kept_whole(store: SQLAlchemyQueueStore) -> None:
    (both,) = commit(store, 1, ("b", "c"))
    (only_b,) = commit(store, 1, ("b",))
    store.shipping.set_cursor("b", CLIENT, only_b)
    assert store.retention.trim() == 0  # c has not passed the slot: b's entry stays with it
    assert [e.position for e in store.shipping.read_client_log(CLIENT, 0, 10)] == [both, only_b]
    assert store.retention.trimmed_through("b", CLIENT) == 0
    store.shipping.set_cursor("c", CLIENT, both)
    assert store.retention.trim() == 2
    assert store.retention.trimmed_through("c", CLIENT) == both


def test_a_slot_in_use_by_an_open_transaction_is_neither_waited_for_nor_retired(
    store: SQLAlchemyQueueStore,
) -> None:
    nums = store.sites.site_numbers()
    with store.engine.connect() as app:
        app.begin()
        (ref,) = store.send.append_log_entries(app, CLIENT, [(b"open", [nums["b"]])])
        slot = current(store)
        assert store.retention.rotate_send_log() is None  # nothing committed in it yet
        p = commit(store, 1)  # another transaction, same slot
        store.shipping.set_cursor("b", CLIENT, p[0])
        store.retention.trim()  # rotates away; the open transaction holds the slot: not judged
        assert current(store) != slot
        assert [e.position for e in store.shipping.read_client_log(CLIENT, 0, 10)] == p
        app.commit()
    (late,) = store.send.positions_of([ref])
    assert late is not None and late > p[0]
    assert [e.payload for e in store.shipping.read_log_entries("b", CLIENT, p[0], 10)] == [b"open"]
    store.shipping.set_cursor("b", CLIENT, late)
    assert store.retention.trim() == 2
    assert store.shipping.read_client_log(CLIENT, 0, 10) == []


def test_a_reader_holding_a_slot_defers_its_retirement_without_blocking_the_trim(
    store: SQLAlchemyQueueStore,
) -> None:
    p = commit(store, 2)
    slot = current(store)
    store.retention.rotate_send_log()
    store.shipping.set_cursor("b", CLIENT, p[-1])
    with store.engine.connect() as reader:
        reader.begin()
        reader.execute(text(f"LOCK TABLE lrq_send_entries_s{slot} IN ACCESS SHARE MODE"))
        assert store.retention.trim() == 0  # returns: the slot is tried again next time
        reader.rollback()
    assert store.retention.trim() == 2


def test_slots_are_added_while_the_others_are_pinned_up_to_max_slots(
    store: SQLAlchemyQueueStore,
) -> None:
    store.retention.max_slots = 6
    for _ in range(8):  # c never acknowledges: every slot stays pinned
        commit(store, 1, ("c",))
        store.retention.trim()
    slots = store.retention.send_slots()
    assert len(slots) == 6
    assert sum(x.entries for x in slots) == 8  # the last slot took the overflow
    store.shipping.set_cursor("c", CLIENT, store.send.head_position())
    store.retention.trim()
    assert sum(x.entries for x in store.retention.send_slots()) == 0
    assert len(store.retention.send_slots()) == 6  # reused from now on


def test_the_newest_tick_survives_every_retirement(store: SQLAlchemyQueueStore) -> None:
    for _ in range(6):
        p = commit(store, 2)
        store.shipping.set_cursor("b", CLIENT, p[-1])
        store.retention.trim()
    head = store.send.head_position()
    assert head == p[-1] == 12
    assert commit(store, 1) == [13]


def test_a_position_is_known_while_its_slot_is_kept(store: SQLAlchemyQueueStore) -> None:
    nums = store.sites.site_numbers()
    with store.engine.begin() as conn:
        (ref,) = store.send.append_log_entries(conn, CLIENT, [(b"x", [nums["c"]])])
    (position,) = store.send.positions_of([ref])
    assert position is not None
    store.retention.trim()
    assert store.send.positions_of([ref]) == [position]  # c has not passed it
    store.shipping.set_cursor("c", CLIENT, position)
    store.retention.trim()
    assert store.send.positions_of([EntryRef(ref.txid, ref.ord)]) == [None]  # retired with it


def test_storage_stays_bounded_while_a_transaction_pins_vacuum(
    store: SQLAlchemyQueueStore, pg_schema: PgSchema
) -> None:
    """30 rounds of 100 entries of 1 KiB, each acknowledged and trimmed, with an open
    transaction holding a transaction id all along: no dead row is ever reclaimable,
    yet the queue's size stays that of a slot or two."""
    with pg_schema.admin.connect() as pin:
        pin.begin()
        pin.execute(text("SELECT pg_current_xact_id()"))
        sizes = []
        for _ in range(30):
            p = commit(store, 100)
            store.shipping.set_cursor("b", CLIENT, p[-1])
            store.retention.trim()
            sizes.append(sum(x.bytes for x in store.retention.send_slots()))
        pin.rollback()
    written = 30 * 100 * 1000
    assert max(sizes[10:]) <= max(sizes[:10]) * 1.1  # no upward trend
    assert sizes[-1] < written / 4


def test_a_late_commit_into_a_closed_slot_is_judged_again(store: SQLAlchemyQueueStore) -> None:
    """A slot judged pinned is judged again once more entries were sequenced in it."""
    nums = store.sites.site_numbers()
    (first,) = commit(store, 1, ("c",))
    with store.engine.connect() as app:
        app.begin()
        store.send.append_log_entries(app, CLIENT, [(b"late", [nums["c"]])])
        store.retention.rotate_send_log()
        store.retention.trim()  # the slot is in use: not judged
        app.commit()
    store.shipping.set_cursor("c", CLIENT, first)
    assert store.retention.trim() == 0  # judged now: the late entry is not passed
    store.shipping.set_cursor("c", CLIENT, store.send.head_position())
    assert store.retention.trim() == 2
    assert store.shipping.read_client_log(CLIENT, 0, 10) == []


def test_a_closed_slot_is_kept_one_period_so_positions_stay_known(
    store: SQLAlchemyQueueStore,
) -> None:
    nums = store.sites.site_numbers()
    with store.engine.begin() as conn:
        (ref,) = store.send.append_log_entries(conn, CLIENT, [(b"x", [nums["b"]])])
    (position,) = store.send.positions_of([ref])
    store.retention.rotation_period = 3600.0
    assert store.retention.rotate_send_log() is not None  # closed just now
    store.shipping.set_cursor("b", CLIENT, store.send.head_position())
    assert store.retention.trim() == 0  # passed, but closed less than a period ago
    assert store.send.positions_of([EntryRef(ref.txid, ref.ord)]) == [position]
    store.retention.rotation_period = 0.0
    assert store.retention.trim() == 1


def test_a_slot_judged_pinned_is_judged_anew_once_a_late_writer_added_to_it(
    store: SQLAlchemyQueueStore,
) -> None:
    """What was read of a pinned slot serves only while its highest position stays: a
    writer that took the slot as current before it closed and wrote after it was judged
    (the slot is its transaction's setting) makes it be read again, or the late entry
    would go with the slot once the earlier ones are passed."""
    nums = store.sites.site_numbers()
    (first,) = commit(store, 1, ("c",))
    slot = current(store)
    assert store.retention.rotate_send_log() is not None
    assert store.retention.trim() == 0  # judged: c is behind; what was read is kept
    with store.engine.begin() as app:
        write_late(app, slot)
        (ref,) = store.send.append_log_entries(app, CLIENT, [(b"late", [nums["c"]])])
    (late,) = positions(store, [ref])
    with store.read() as conn:
        found = conn.execute(
            text("SELECT slot FROM lrq_send_positions WHERE position = :p"), {"p": late}
        ).scalar_one()
    assert found == slot != current(store) and late > first
    store.shipping.set_cursor("c", CLIENT, first)  # past what was judged, not the late entry
    assert store.retention.trim() == 0
    assert [e.payload for e in store.shipping.read_log_entries("c", CLIENT, first, 10)] == [b"late"]
    store.shipping.set_cursor("c", CLIENT, late)
    assert store.retention.trim() == 2
    assert store.shipping.read_client_log(CLIENT, 0, 10) == []


def test_a_busy_slot_does_not_keep_the_next_passed_slot_from_retiring(
    store: SQLAlchemyQueueStore,
) -> None:
    nums = store.sites.site_numbers()
    with store.engine.connect() as app:
        app.begin()
        store.send.append_log_entries(app, CLIENT, [(b"open", [nums["b"]])])
        busy = current(store)
        commit(store, 1)
        assert store.retention.rotate_send_log() is not None
        passed = current(store)
        assert passed > busy  # judged after the busy one
        (p,) = commit(store, 1)
        assert store.retention.rotate_send_log() is not None
        store.shipping.set_cursor("b", CLIENT, p)
        assert store.retention.trim() == 1  # the passed slot's entry; the busy slot waits
        assert {x.slot for x in store.retention.send_slots() if x.entries} == {busy}
        app.rollback()


def test_a_slot_made_current_again_is_emptied_of_what_rolled_back_writers_left(
    store: SQLAlchemyQueueStore,
) -> None:
    """A retired slot written to afterwards by a transaction that rolled back (one that
    took it as current before it closed) holds no row but pages: it is emptied when it
    becomes current again, so a ring's reuse never carries dead pages along."""
    (p,) = commit(store, 1)
    old = current(store)
    assert store.retention.rotate_send_log() is not None
    store.shipping.set_cursor("b", CLIENT, p)
    assert store.retention.trim() == 1  # the old slot retired: truncated
    nums = store.sites.site_numbers()
    with store.engine.connect() as app, app.begin() as txn:
        write_late(app, old)
        store.send.append_log_entries(app, CLIENT, [(b"x" * 1000, [nums["b"]])] * 50)
        txn.rollback()

    def pages() -> int:
        with store.read() as conn:
            return int(
                conn.execute(
                    text("SELECT pg_relation_size(CAST(:t AS regclass))"),
                    {"t": f"lrq_send_entries_s{old}"},
                ).scalar_one()
            )

    assert pages() > 0
    commit(store, 1)
    assert store.retention.rotate_send_log() == old  # the ring's free slot, reused
    assert pages() == 0


def test_the_trim_rotates_the_current_slot_once_a_period_passed_and_only_if_it_holds_entries(
    store: SQLAlchemyQueueStore,
) -> None:
    store.retention.rotation_period = 3600.0
    first = current(store)

    def a_period_passes() -> None:
        with store.write() as conn:
            conn.execute(text("UPDATE lrq_send_state SET rotated_at = rotated_at - 7200"))

    store.retention.trim()
    assert current(store) == first  # neither a period passed nor an entry written
    a_period_passes()
    store.retention.trim()
    assert current(store) == first  # a period passed, but the slot is empty
    commit(store, 1)
    store.retention.trim()
    second = current(store)
    assert second != first  # both: rotated
    commit(store, 1)
    store.retention.trim()
    assert current(store) == second  # entries, but rotated less than a period ago


def test_a_slot_judged_pinned_is_neither_locked_nor_scanned_again_while_nothing_was_added(
    store: SQLAlchemyQueueStore,
) -> None:
    """The trim runs under the tick lock: a slot pinned by a stream behind costs one
    read of its highest position per trim, not its lock and a scan of its positions."""
    commit(store, 3, ("c",))
    with recorded(store.engine) as seen:
        assert store.retention.trim() == 0  # rotates, then judges the closed slot: c pins it
    assert len(naming(seen, SCAN)) == 1
    for _ in range(2):
        with recorded(store.engine) as seen:
            assert store.retention.trim() == 0
        assert naming(seen, LOCK) == [] and naming(seen, SCAN) == []
    store.shipping.set_cursor("c", CLIENT, store.send.head_position())
    with recorded(store.engine) as seen:
        assert store.retention.trim() == 3  # passed now: locked and retired
    assert len(naming(seen, LOCK)) == 1


def test_the_sequencer_ticks_once_per_trim_however_many_slots_it_locks(
    store: SQLAlchemyQueueStore,
) -> None:
    for _ in range(3):
        commit(store, 2)
        assert store.retention.rotate_send_log() is not None
    store.shipping.set_cursor("b", CLIENT, store.send.head_position())
    with recorded(store.engine) as seen:
        assert store.retention.trim() == 6
    assert len(naming(seen, LOCK)) == 3
    assert len(naming(seen, TICK)) == 1


def test_a_retirement_reports_the_slots_it_retired_and_those_in_use(
    store: SQLAlchemyQueueStore,
) -> None:
    """What one retirement did, slot by slot (here without the store's cache of judgments)."""
    commit(store, 2)
    first = current(store)
    store.retention.rotate_send_log()
    commit(store, 1)
    second = current(store)
    store.retention.rotate_send_log()
    store.shipping.set_cursor("b", CLIENT, store.send.head_position())
    acked, record = store.retention.acked_positions, store.retention.record_trim_marks
    assert isinstance(store.core, PostgresCore)
    with store.engine.connect() as reader:
        reader.begin()
        reader.execute(text(f"LOCK TABLE lrq_send_entries_s{second} IN ACCESS SHARE MODE"))
        with store.write() as conn:
            done = slots.retire(conn, store.core._tick_lock(conn), acked, record, period=0.0)
        reader.rollback()
    assert (done.retired, done.busy, done.entries) == ((first,), (second,), 2)
    assert done.rotated_to is None  # the current slot is empty
    with store.write() as conn:
        done = slots.retire(conn, store.core._tick_lock(conn), acked, record, period=0.0)
    assert (done.retired, done.busy, done.entries) == ((second,), (), 1)
    assert done.rotated_to is None
    third = current(store)
    commit(store, 1)  # b has not passed it: closed, judged and kept
    with store.write() as conn:
        done = slots.retire(conn, store.core._tick_lock(conn), acked, record, period=0.0)
    assert done.rotated_to == current(store) != third
    assert (done.retired, done.busy, done.entries) == ((), (), 0)


def test_the_trim_waits_for_a_tick_running_elsewhere(
    store: SQLAlchemyQueueStore, pg_schema: PgSchema
) -> None:
    """No slot is judged while positions are being given: the trim takes the
    sequencer's lock first, for its whole transaction."""
    p = commit(store, 2)
    store.retention.rotate_send_log()
    store.shipping.set_cursor("b", CLIENT, p[-1])
    trimmer = open_store(pg_schema.engine(connect_args={"application_name": "trimmer"}))
    trimmer.retention.rotation_period = 0.0
    done: list[int] = []
    with store.engine.connect() as ticker:
        ticker.begin()
        key = sequencer.lock_key(ticker)
        ticker.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        thread = threading.Thread(target=lambda: done.append(trimmer.retention.trim()))
        thread.start()
        wait_for(
            lambda: done or waiting_for_a_lock(pg_schema.admin, "trimmer"),
            what="the trim waiting for the lock, or done",
        )
        assert done == []  # waiting
        ticker.rollback()
    join(thread)
    assert done == [2]


def test_a_trim_that_rotated_retired_or_met_a_busy_slot_logs_what_it_did(
    store: SQLAlchemyQueueStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr_client.store.postgres")

    def logged() -> list[tuple[Any, ...]]:
        found = [r for r in caplog.records if r.getMessage() == "send queue slots"]
        caplog.clear()
        return [(r.rotated_to, r.retired, r.entries, r.busy) for r in found]

    store.retention.trim()
    assert logged() == []  # nothing done: nothing logged
    commit(store, 2)
    slot = current(store)
    store.retention.rotate_send_log()
    store.shipping.set_cursor("b", CLIENT, store.send.head_position())
    with store.engine.connect() as reader:
        reader.begin()
        reader.execute(text(f"LOCK TABLE lrq_send_entries_s{slot} IN ACCESS SHARE MODE"))
        store.retention.trim()
        reader.rollback()
    assert logged() == [(None, [], 0, [slot])]
    store.retention.trim()
    assert logged() == [(None, [slot], 2, [])]
    commit(store, 1)  # not acknowledged: rotated away from, kept
    store.retention.trim()
    assert logged() == [(current(store), [], 0, [])]
