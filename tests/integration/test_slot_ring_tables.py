"""A ring's tables on a real database: its state row, and partitions added, locked and
emptied by slot (:mod:`lr_client.store.slot_ring`), each object built by the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

from lr_client.store.slot_ring import Partitions, StateRow
from tests.conftest import PgSchema


def _state_table(engine: Engine) -> None:
    """``ring_state`` with its row 1 (slot 3 since 10.5) and another row, 2."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE ring_state (id integer PRIMARY KEY, cur_slot integer NOT NULL,"
            " rotated_at double precision NOT NULL)"
        )
        conn.exec_driver_sql("INSERT INTO ring_state VALUES (1, 3, 10.5), (2, 9, 99.0)")


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = sqlalchemy.create_engine(db_url, poolclass=sqlalchemy.pool.NullPool)
    _state_table(eng)
    yield eng
    eng.dispose()


def test_a_state_row_reads_and_switches_row_one_only(engine: Engine) -> None:
    state = StateRow("ring_state")
    with engine.begin() as conn:
        assert state.read(conn) == (3, 10.5)
        state.switch(conn, 4, 20.25)
        assert state.read(conn, for_update=True) == (4, 20.25)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, cur_slot, rotated_at FROM ring_state ORDER BY id")
        assert [tuple(r) for r in rows] == [(1, 4, 20.25), (2, 9, 99.0)]


def _row_one_is_free(engine: Engine) -> bool:
    """Whether another session can lock the state's row 1 at once."""
    with engine.connect() as other, other.begin():
        try:
            other.exec_driver_sql("SELECT 1 FROM ring_state WHERE id = 1 FOR UPDATE NOWAIT")
        except sqlalchemy.exc.OperationalError:
            return False
        return True


@pytest.mark.postgres
def test_a_state_rows_read_for_update_holds_the_row(pg_schema: PgSchema) -> None:
    engine = pg_schema.engine(poolclass=sqlalchemy.pool.NullPool)
    _state_table(engine)
    state = StateRow("ring_state")
    with engine.connect() as conn, conn.begin():
        assert state.read(conn) == (3, 10.5)
        assert _row_one_is_free(engine)  # a plain read locks nothing
        assert state.read(conn, for_update=True) == (3, 10.5)
        assert not _row_one_is_free(engine)  # until this transaction ends


@pytest.fixture
def parent(pg_schema: PgSchema) -> Engine:
    eng = pg_schema.engine(poolclass=sqlalchemy.pool.NullPool)
    with eng.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE ring_parent (slot integer NOT NULL, v integer DEFAULT 42)"
            " PARTITION BY LIST (slot)"
        )
    return eng


@pytest.mark.postgres
def test_a_new_partition_takes_the_parents_defaults_only_when_asked(parent: Engine) -> None:
    with parent.begin() as conn:
        Partitions("ring_parent", "ring_d", defaults=True).add(conn, 1)
        Partitions("ring_parent", "ring_n").add(conn, 2)
        conn.exec_driver_sql("INSERT INTO ring_d1 (slot) VALUES (1)")
        conn.exec_driver_sql("INSERT INTO ring_n2 (slot) VALUES (2)")
        rows = conn.exec_driver_sql("SELECT slot, v FROM ring_parent ORDER BY slot")
        assert [tuple(r) for r in rows] == [(1, 42), (2, None)]  # both attached to the parent


@pytest.mark.postgres
def test_a_partition_is_locked_then_emptied_or_refused_in_time(parent: Engine) -> None:
    ring = Partitions("ring_parent", "ring_p")
    with parent.begin() as conn:
        ring.add(conn, 1)
        conn.exec_driver_sql("INSERT INTO ring_parent (slot) VALUES (1), (1)")
    with parent.connect() as holder, parent.connect() as conn:
        held = holder.begin()
        holder.exec_driver_sql("LOCK TABLE ring_p1 IN ACCESS SHARE MODE")  # a reader's lock
        with conn.begin():
            before = conn.exec_driver_sql("SHOW lock_timeout").scalar_one()
            assert ring.lock(conn, 1, "50ms") is None  # refused in time: nothing changed
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == before
            assert conn.exec_driver_sql("SELECT count(*) FROM ring_p1").scalar_one() == 2
        held.commit()
        with conn.begin():
            conn.exec_driver_sql("SET LOCAL lock_timeout = '7s'")  # the transaction's own
            savepoint = ring.lock(conn, 1, "5s")
            assert savepoint is not None
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "7s"
            ring.truncate(conn, 1)
            savepoint.commit()
        assert conn.exec_driver_sql("SELECT count(*) FROM ring_parent").scalar_one() == 0
