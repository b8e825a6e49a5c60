"""PostgreSQL's commit-order sequencer, function by function: ticks and the tick lock.

The invariants it keeps (no committed entry skipped, commit order) are
``test_commit_order.py``'s; this module checks what each step promises on the
sequencer's own tables.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from lr_client.records import EntryRef
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.send import sequencer
from tests.conftest import PgSchema
from tests.kit.pglocks import waiting_for_a_lock
from tests.kit.wait import join, wait_for

CLIENT = "policy"


def pg_store(pg_schema: PgSchema, **engine_args: object) -> SQLAlchemyQueueStore:
    store = open_store(pg_schema.engine(**engine_args))
    assert isinstance(store, SQLAlchemyQueueStore)
    store.create_schema()
    store.sites.register_sites(["b"])
    return store


@pytest.fixture
def store(pg_schema: PgSchema) -> Iterator[SQLAlchemyQueueStore]:
    """A PostgreSQL store with its schema and site ``b``."""
    yield pg_store(pg_schema)


def commit(store: SQLAlchemyQueueStore, n: int) -> list[EntryRef]:
    """One committed transaction of ``n`` entries for site ``b``; their refs."""
    num = store.sites.site_numbers()["b"]
    with store.engine.begin() as conn:
        return store.send.append_log_entries(conn, CLIENT, [(b"%d" % i, [num]) for i in range(n)])


def count(store: SQLAlchemyQueueStore, table: str) -> int:
    with store.read() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_a_tick_sequences_the_transactions_committed_since_the_last_one(
    store: SQLAlchemyQueueStore,
) -> None:
    first, second = commit(store, 2), commit(store, 3)
    with store.engine.connect() as conn, conn.begin():
        key = sequencer.lock_key(conn)
        assert sequencer.tick(conn, key) == (2, 5)  # transactions, entries
    with store.engine.connect() as conn, conn.begin():
        assert sequencer.tick(conn, key) == (0, 0)  # nothing new
        assert sequencer.head(conn) == 5
        # Blocks in commit order: the first transaction's entries are 1, 2.
        assert sequencer.bases(conn, [first[0].txid, second[0].txid]) == {
            first[0].txid: 0,
            second[0].txid: 2,
        }
        assert sequencer.bases(conn, [first[0].txid + 10_000]) == {}
    assert store.send.positions_of([*first, *second]) == [1, 2, 3, 4, 5]


def test_an_empty_store_has_head_0(store: SQLAlchemyQueueStore) -> None:
    with store.read() as conn:
        assert sequencer.head(conn) == 0
    assert store.send.head_position() == 0


def test_ticks_take_the_documented_lock_of_their_own_schema(pg_schema: PgSchema) -> None:
    """The key is "LRQ2" and the entries table's oid: a holder stops this schema's ticks only."""
    tag = "lr-tick-" + uuid.uuid4().hex[:8]
    store = pg_store(pg_schema, connect_args={"application_name": tag})
    other_schema = PgSchema()
    try:
        other = pg_store(other_schema)
        commit(store, 1)
        commit(other, 2)
        with store.read() as conn:
            oid = int(
                conn.execute(text("SELECT CAST('lrq_send_entries' AS regclass)::oid")).scalar_one()
            )
            assert sequencer.lock_key(conn) == (0x4C525132 << 32) | oid
        results: dict[str, int] = {}

        def tick(name: str, st: SQLAlchemyQueueStore) -> None:
            results[name] = st.send.sequence()

        with pg_schema.admin.connect() as holder, holder.begin():
            holder.execute(
                text("SELECT pg_advisory_xact_lock(:k)"), {"k": (0x4C525132 << 32) | oid}
            )
            waiting = threading.Thread(target=tick, args=("store", store))
            waiting.start()
            wait_for(
                lambda: waiting_for_a_lock(pg_schema.admin, tag),
                30,
                what="the tick waiting for the lock",
            )
            free = threading.Thread(target=tick, args=("other", other))
            free.start()
            join(free, 30)  # another schema's tick does not wait
            assert results == {"other": 2}
        join(waiting, 30)
        assert results == {"other": 2, "store": 1}
    finally:
        other_schema.drop()


def test_concurrent_ticks_sequence_each_transaction_once(pg_schema: PgSchema) -> None:
    """Ticks of several connections at once: one at a time, so no tick id or position twice."""
    store = pg_store(pg_schema, pool_size=8)
    refs = [commit(store, 2) for _ in range(10)]
    errors: list[BaseException] = []
    counts: list[int] = []
    barrier = threading.Barrier(6)

    def ticker() -> None:
        try:
            barrier.wait(30)
            counts.append(store.send.sequence())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ticker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        join(t, 60)
    assert errors == []
    assert sorted(counts) == [0, 0, 0, 0, 0, 20]
    assert store.send.positions_of([r for pair in refs for r in pair]) == list(range(1, 21))


def test_positions_of_keeps_the_positions_refs_already_carry(store: SQLAlchemyQueueStore) -> None:
    """A list mixing refs with a known position and refs just transmitted."""
    (fresh,) = commit(store, 1)
    known = EntryRef(0, 1, 7)
    assert store.send.positions_of([known, fresh, known]) == [7, 1, 7]
    assert store.send.positions_of([known]) == [7]
