"""What the store backends keep in their tables: rows and schema internals.

The behaviour of the store, through its public methods, is the contract
suite's (``tests/contract``); this module checks what only the tables show.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from lr_client.errors import SchemaError
from lr_client.records import EntryRef
from lr_client.store import SQLAlchemyQueueStore, open_store, postgres
from lr_client.store.schema import lifecycle
from lr_client.store.schema import tables as s
from tests.conftest import PgSchema
from tests.kit.positions import new_slot, positions


def test_a_schema_of_a_newer_release_is_refused(store: SQLAlchemyQueueStore) -> None:
    store.check_schema()
    with store.write() as conn:  # as a newer release would leave it
        conn.execute(text(f"UPDATE {lifecycle.VERSION_TABLE} SET version_num = 'ffff'"))
    with pytest.raises(SchemaError, match="revision ffff is newer than this release"):
        store.check_schema()


def test_payload_stored_once_whatever_the_destinations(store: SQLAlchemyQueueStore) -> None:
    dests = [f"s{i}" for i in range(8)]
    nums = store.sites.register_sites(dests)
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x" * 1024, [nums[d] for d in dests])])
    assert store.send.sequence() == (1 if store.dialect == "postgresql" else 0)
    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(s.send_log_entries)).scalar() == 1
    for d in dests:
        assert [e.payload for e in store.shipping.read_log_entries(d, "policy", 0, 10)] == [
            b"x" * 1024
        ]


def test_a_burst_sequenced_at_once_refreshes_the_planners_statistics(
    pg_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog committed while nothing read: the next reads must not plan for an empty table."""
    monkeypatch.setattr(postgres, "ANALYZE_AFTER_TICK", 3)
    store = open_store(pg_schema.engine())
    store.create_schema()
    nums = store.sites.register_sites(["b"])

    def counted_rows() -> float:  # -1 until ANALYZE (or VACUUM) counted the table
        with store.read() as conn:
            return float(
                conn.execute(
                    text(
                        "SELECT reltuples FROM pg_class WHERE oid = 'lrq_send_positions'::regclass"
                    )
                ).scalar_one()
            )

    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])] * 2)
    assert store.send.sequence() == 2 and counted_rows() == -1  # below the threshold
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])] * 3)
    assert store.send.sequence() == 3
    assert counted_rows() == 5


def test_sqlite_refs_carry_their_positions_and_no_transaction(sqlite_url: str) -> None:
    """SQLite gives positions at insert: a ref's txid is 0, its ordinal and position the row's."""
    store = open_store(sqlite_url)
    store.create_schema()
    nums = store.sites.register_sites(["b"])
    with store.write() as conn:
        refs = store.send.append_log_entries(
            conn, "policy", [(b"x", [nums["b"]]), (b"y", [nums["b"]])]
        )
    assert refs == [EntryRef(0, 1, 1), EntryRef(0, 2, 2)]


def test_reads_are_in_position_order_whatever_the_rows_storage(
    store: SQLAlchemyQueueStore,
) -> None:
    """After a trim PostgreSQL puts new rows in a reused slot, a partition before the older
    rows', and after a VACUUM in freed space: reads go by position."""
    nums = store.sites.register_sites(["b"])

    def send(tag: bytes, n: int) -> list[int]:
        refs = []
        for i in range(n):  # each in a slot of its own on PostgreSQL
            new_slot(store)
            with store.write() as conn:
                refs += store.send.append_log_entries(
                    conn, "policy", [(tag + b"%d" % i, [nums["b"]])]
                )
        return positions(store, refs)

    p = send(b"a", 10)
    store.shipping.set_cursor("b", "policy", p[4])
    store.retention.trim()
    if store.dialect == "postgresql":  # SQLite keeps rows in a B-tree keyed by position
        with store.engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            auto.exec_driver_sql("VACUUM lrq_send_positions")
    q = send(b"n", 3)
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 100)] == p[5:] + q
    assert [e.position for e in store.shipping.read_log_entries("b", "policy", 0, 100)] == p[5:] + q


def test_a_destination_registered_by_another_store_is_read(store: SQLAlchemyQueueStore) -> None:
    """The site numbers a store cached miss a site registered since: a read looks again."""
    store.sites.register_sites(["b"])
    assert set(store.sites.site_numbers()) == {"b"}  # cached
    other = open_store(store.engine)
    nums = other.sites.register_sites(["c"])
    with other.write() as conn:
        refs = other.send.append_log_entries(conn, "policy", [(b"x", [nums["c"]])])
    assert [e.position for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == positions(
        other, refs
    )


def test_a_streams_read_built_once_per_shape_reads_each_stream_its_own_entries(
    store: SQLAlchemyQueueStore,
) -> None:
    """The statement of a stream's read is kept per destination and limits: the client,
    the position after which and the upper bound are its parameters, never baked in."""
    nums = store.sites.register_sites(["b", "c"])
    refs = {}
    for client, dests in (("policy", ["b", "c"]), ("orders", ["b"]), ("policy", ["c"])):
        new_slot(store)
        with store.write() as conn:
            added = store.send.append_log_entries(conn, client, [(b"x", [nums[d] for d in dests])])
        refs.setdefault(client, []).extend(added)
    p1, p3 = positions(store, refs["policy"])
    (p2,) = positions(store, refs["orders"])

    def read(dest: str, client: str, after: int = 0, up_to: int | None = None) -> list[int]:
        entries = store.shipping.read_log_entries(dest, client, after, 10, 1 << 20, up_to)
        return [e.position for e in entries]

    for _ in range(2):  # built, then reused
        assert read("b", "policy") == [p1] and read("b", "orders") == [p2]
        assert read("c", "policy") == [p1, p3] and read("c", "policy", p1) == [p3]
        assert read("c", "policy", up_to=p1) == [p1] and read("c", "orders") == []
    assert len(store.shipping.__dict__["_log_reads"]) == 3  # b, c, c bounded


def test_read_statements_need_no_transaction_on_postgresql(store: SQLAlchemyQueueStore) -> None:
    """``read_statements`` (a sender's checks before each batch, a branch's relay read):
    on PostgreSQL each statement is a transaction of its own (no BEGIN and COMMIT round
    trips); SQLite reads them in one read transaction, as :meth:`read`."""
    with store.read_statements() as conn:
        raw = conn.connection.driver_connection
        if store.dialect == "postgresql":
            ids = [conn.execute(text("SELECT txid_current()")).scalar() for _ in range(2)]
            assert ids[0] != ids[1]  # each statement committed on its own
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "read committed"
        else:
            conn.execute(select(func.count()).select_from(s.sites)).scalar()
            assert raw is not None and raw.in_transaction  # one read transaction
    if store.dialect == "postgresql":  # the connection went back to the pool as it came
        assert raw is not None and not raw.autocommit
    with store.read() as conn:
        if store.dialect == "postgresql":
            ids = [conn.execute(text("SELECT txid_current()")).scalar() for _ in range(2)]
            assert ids[0] == ids[1]
