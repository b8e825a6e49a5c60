"""The plans of two hot statements stay index look-ups as their tables grow.

Both run many times a second and their planners are blind (fresh partitions
without statistics, bounds read in the same statement), and both have a plan
that reads every row of a slot or a queue: a tick that scanned and sorted
every stamp and entry of the current slot, and the relay read's probe for the
last full sync's end, which walked back through every entry a relayed queue
keeps. These tests read the plans the backends choose on thousands of rows.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from lr_client import LRMessageWithDestinations, RoutingQueueClient
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store.cascade.relays import last_end_query, last_end_seq
from lr_client.store.retention import slots
from lr_client.store.send import pg_dest_index, sequencer, sqlite_dest_index
from tests.conftest import PgSchema
from tests.kit.templates import migrated_sqlite
from tests.kit.wait import scaled

LOG = ReplicationType.LOG_ENTRY_SYNC


def test_the_probe_for_a_full_syncs_end_reads_the_end_markers_index(
    store: SQLAlchemyQueueStore,
) -> None:
    for b in range(10):
        batch = [WireEntry(p, LOG, b"x") for p in range(b * 500 + 1, b * 500 + 501)]
        store.recv.apply_log_batch("a", "policy", batch)
    (queue,) = store.queues.list_queues("policy")
    query = last_end_query(queue.queue_id)
    sql = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
    explain = "EXPLAIN QUERY PLAN " if store.dialect == "sqlite" else "EXPLAIN "
    with store.read() as conn:
        plan = "\n".join(str(r[-1]) for r in conn.execute(text(explain + sql)))
        assert last_end_seq(conn, queue.queue_id) == (0, 0)
    # SQLite names the index; PostgreSQL its partitions' (queue_id, snapshot_id) copies.
    assert "lrq_recv_entries_ends" in plan or "_queue_id_snapshot_id_idx" in plan, plan
    assert "lrq_recv_entries_queue" not in plan and "_queue_id_seq_idx" not in plan, plan


@pytest.fixture
def pg_store(pg_schema: PgSchema) -> Iterator[SQLAlchemyQueueStore]:
    st = open_store(create_engine(pg_schema.url))
    assert isinstance(st, SQLAlchemyQueueStore)
    st.create_schema()
    yield st
    st.engine.dispose()


#: auto_explain's settings that report every nested statement's plan to the client.
AUTO_EXPLAIN = {
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_level": "notice",
}


@pytest.mark.postgres
def test_a_tick_looks_its_fresh_stamps_up_by_index(pg_store: SQLAlchemyQueueStore) -> None:
    store = pg_store
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    for i in range(3000):
        with store.engine.begin() as conn:
            client.transmit_log_entry_message(conn, b"x", ["b"])
        if i % 100 == 0:
            store.send.sequence()
    store.send.sequence()
    with store.engine.begin() as conn:  # a fresh stamp for the tick explained below
        client.transmit_log_entry_message(conn, b"x", ["b"])
    notices: list[str] = []
    with store.engine.connect() as conn, conn.begin():
        # The tick's statement runs inside lrq_send_tick (revision 0019), with the
        # function's plan settings: auto_explain reports its plan as a notice.
        raw = conn.connection.driver_connection
        raw.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute(text("LOAD 'auto_explain'"))
        for setting, value in AUTO_EXPLAIN.items():
            conn.execute(text("SELECT set_config(:s, :v, true)"), {"s": setting, "v": value})
        assert sequencer.tick(conn, sequencer.lock_key(conn)) == (1, 1)
        conn.rollback()
    plans = [n for n in notices if "lrq_send_commits" in n]
    assert len(plans) == 1, notices
    plan = plans[0]
    assert "rows=1 loops=1" in plan  # the tick found the one fresh stamp
    scans = [
        line
        for line in plan.splitlines()
        if "Seq Scan on lrq_send_" in line and "lrq_send_state" not in line
    ]
    assert scans == [], plan


@pytest.mark.postgres
def test_the_slots_holding_rows_are_found_by_a_row_read_per_slot(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    store = pg_store
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    with store.engine.begin() as conn:
        for _ in range(3000):
            client.transmit_log_entry_message(conn, b"x" * 100, ["b"])
    store.send.sequence()
    with store.engine.begin() as conn:
        closed = slots.rotate(conn, sequencer.lock_key(conn))
    assert closed is not None
    with store.engine.connect() as conn, conn.begin():
        held = slots._holding(conn, time.time())
        read = conn.execute(
            text(
                "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables"
                " WHERE relname LIKE 'lrq_send_entries%'"
            )
        ).scalar_one()
        conn.rollback()
    assert 0 in held  # the slot closed, holding the 3,000 entries
    assert read <= len(held)  # a row read per slot at most, not every entry of every slot


def test_a_destinations_read_walks_its_own_entries_only(store: SQLAlchemyQueueStore) -> None:
    """The seed's stream tags: the read of one destination's entries, in position order
    a batch at a time as a session reads them, walks that destination's partial index
    (``lrq_send_dest_<n>`` on SQLite, made by the first read that walked 5,000 entries
    of others; ``lrq_send_positions_dest_<n>`` on PostgreSQL, made at registration),
    not the position index filtering out every entry of the others."""
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b", "c"])
    numbers = store.sites.site_numbers()
    with store.engine.begin() as conn:
        client.transmit_log_entry_messages(
            conn, [LRMessageWithDestinations(b"y", ["b", "c"]) for _ in range(5)]
        )
        client.transmit_log_entry_messages(
            conn, [LRMessageWithDestinations(b"x", ["c"]) for _ in range(5000)]
        )
    store.send.sequence()
    store.send.analyze()
    entries = store.shipping.read_log_entries("b", "policy", 0, 100)
    assert [e.payload for e in entries] == [b"y"] * 5
    position = store.core.tagged_query(numbers["b"], "policy", 0).selected_columns[0]
    query = store.core.tagged_query(numbers["b"], "policy", 0).order_by(position).limit(100)
    with store.read() as conn:
        if store.dialect == "sqlite":
            # A statement first, as a read would: it reloads the schema the index
            # changed (an EXPLAIN on its own plans with the connection's last one).
            assert len(conn.execute(query).all()) == 5
            sql = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
            rows = conn.execute(text("EXPLAIN QUERY PLAN " + sql))
            plan = "\n".join(str(r[-1]) for r in rows)
            assert f"lrq_send_dest_{numbers['b']}" in plan, plan
            return
        # The array's type is in its parameter, which literals lose.
        compiled = query.compile(store.engine)
        rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params)
        plan = "\n".join(str(r[0]) for r in rows)
        partial = conn.execute(
            text(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename = 'lrq_send_positions_s0' AND indexdef LIKE :term"
            ),
            {"term": f"%WHERE (dest_nums @> '{{{numbers['b']}}}'%"},
        ).scalar_one()
    assert f"Index Scan using {partial} on lrq_send_positions_s0" in plan, plan


def test_sqlite_makes_a_destinations_index_when_its_reads_first_walk_others(
    sqlite_url: str,
) -> None:
    """SQLite: no destination's index while reads find their own entries (every transmit
    would write one per destination of each entry); a destination's index once one
    of its reads walks ``SPARSE_WALK`` entries of others, and that read's only."""
    migrated_sqlite(Path(sqlite_url.removeprefix("sqlite:///")))
    store = open_store(create_engine(sqlite_url))
    sites = [f"d{n}" for n in range(8)]
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(sites)
    numbers = store.sites.site_numbers()
    with store.engine.begin() as conn:
        client.transmit_log_entry_messages(
            conn, [LRMessageWithDestinations(b"x", sites) for _ in range(3000)]
        )
    for site in sites:  # every destination read to the end, batch by batch
        after, read = 0, 1
        while read:
            entries = store.shipping.read_log_entries(site, "policy", after, 500)
            after, read = (entries[-1].position if entries else after), len(entries)
        assert after == 3000
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == set()

    def others(n: int) -> None:
        with store.engine.begin() as conn:
            client.transmit_log_entry_messages(
                conn, [LRMessageWithDestinations(b"o", ["d1"]) for _ in range(n)]
            )

    others(sqlite_dest_index.SPARSE_WALK - 1)
    assert store.shipping.read_log_entries("d0", "policy", 3000, 500) == []
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == set()
    others(1)
    assert store.shipping.read_log_entries("d0", "policy", 3000, 500) == []
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == {numbers["d0"]}
    # d1's reads of the same entries find their own: no index of its own.
    assert len(store.shipping.read_log_entries("d1", "policy", 3000, 5000)) == 2000
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == {numbers["d0"]}
    store.engine.dispose()


def _sparse_b(sqlite_url: str) -> SQLAlchemyQueueStore:
    """A SQLite store whose 3 entries for ``b`` come before ``SPARSE_WALK`` for ``c``:
    ``b``'s first read walks enough of others' to make its index."""
    migrated_sqlite(Path(sqlite_url.removeprefix("sqlite:///")))
    store = open_store(create_engine(sqlite_url))
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b", "c"])
    with store.engine.begin() as conn:
        client.transmit_log_entry_messages(conn, [LRMessageWithDestinations(b"y", ["b"])] * 3)
        client.transmit_log_entry_messages(
            conn, [LRMessageWithDestinations(b"x", ["c"])] * sqlite_dest_index.SPARSE_WALK
        )
    return store


def test_sqlite_a_destinations_index_that_cannot_be_made_leaves_its_read_whole(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Making the index is the read's afterthought: if it fails (the database busy,
    full or read-only) the read still returns its entries, and a later read tries again."""
    store = _sparse_b(sqlite_url)
    made = sqlite_dest_index.ddl
    monkeypatch.setattr(sqlite_dest_index, "ddl", lambda num: "CREATE INDEX broken ON nowhere (x)")
    entries = store.shipping.read_log_entries("b", "policy", 0, 100)
    assert [e.payload for e in entries] == [b"y"] * 3
    assert "its index not made now" in caplog.text
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == set()
    monkeypatch.setattr(sqlite_dest_index, "ddl", made)
    assert len(store.shipping.read_log_entries("b", "policy", 0, 100)) == 3
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == {store.sites.site_numbers()["b"]}
    store.engine.dispose()


def test_sqlite_a_destinations_index_waits_for_no_writer(sqlite_url: str) -> None:
    """A transmitter holding SQLite's write lock does not hold up the read that would
    make the index (the busy timeout is a minute): the read returns, the index comes
    with a read after the lock is released."""
    store = _sparse_b(sqlite_url)
    writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    assert len(store.shipping.read_log_entries("b", "policy", 0, 100)) == 3
    assert time.monotonic() - started < scaled(20)  # not the minute of the busy timeout
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == set()
    writer.rollback()
    writer.close()
    assert len(store.shipping.read_log_entries("b", "policy", 0, 100)) == 3
    with store.read() as conn:
        assert sqlite_dest_index.existing(conn) == {store.sites.site_numbers()["b"]}
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60_000
    store.engine.dispose()


def test_a_destinations_index_waits_for_no_long_transaction(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a transaction writing the sequenced send queue (the sequencer's
    tick, held up) defers a new destination's index instead of queueing every write
    behind the index's lock; the destination is registered and read all the same
    (through the GIN index), and its index is made once the transaction ends. An index
    that exists is found in the catalog: no lock at all."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's partial indexes")
    monkeypatch.setattr(pg_dest_index, "LOCK_TIMEOUT_MS", 100)
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["b"])

    def indexed() -> set[int]:
        with store.read() as conn:
            return pg_dest_index.ensure(conn, [])

    holder = store.engine.connect()
    try:
        tx = holder.begin()
        holder.exec_driver_sql("LOCK TABLE lrq_send_positions IN ROW EXCLUSIVE MODE")
        client.register_destinations(["b"])  # exists: found in the catalog, no wait
        client.register_destinations(["c"])  # deferred, not an error
        numbers = store.sites.site_numbers()
        assert numbers["c"] not in indexed() and numbers["b"] in indexed()
        with store.engine.begin() as conn:
            client.transmit_log_entry_message(conn, b"to-c", ["c"])
        store.send.sequence()
        assert [e.payload for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == [
            b"to-c"
        ]
        tx.rollback()
    finally:
        holder.close()
    client.register_destinations(["c"])
    assert store.sites.site_numbers()["c"] in indexed()
