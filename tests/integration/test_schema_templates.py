"""A migrated database of the test kit equals one migrated in front of it.

The fixtures hand out copies of one real migration per process
(:mod:`tests.kit.templates`); this checks, on both backends, that a copy has
exactly the tables, columns, indexes, constraints (and, on PostgreSQL, the
functions, triggers and sequences) of a database that runs every revision now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from lr_client import RoutingQueueClient
from lr_client.store import create_engine, open_store
from lr_client.store.schema import lifecycle
from tests.conftest import PG_URL, require_pg
from tests.kit import pgreuse, templates

#: PostgreSQL's objects of the schema; a function body names its own schema,
#: compared without the name.
_PG_OBJECTS = {
    "functions": "SELECT p.proname || ':' || md5(replace(replace(p.prosrc,"
    " current_schema() || '.', 'S.'), quote_literal(current_schema()), 'S'))"
    " FROM pg_proc p"
    " WHERE p.pronamespace = CAST(current_schema() AS regnamespace)",
    "triggers": "SELECT t.tgname || ':' || c.relname FROM pg_trigger t"
    " JOIN pg_class c ON c.oid = t.tgrelid"
    " WHERE c.relnamespace = CAST(current_schema() AS regnamespace) AND NOT t.tgisinternal",
    "relations": "SELECT relname || ':' || CAST(relkind AS text) FROM pg_class"
    " WHERE relnamespace = CAST(current_schema() AS regnamespace)",
}


def _shape(conn: Connection) -> dict[str, Any]:
    insp = inspect(conn)
    tables = sorted(insp.get_table_names())
    shape: dict[str, Any] = {"tables": tables}
    for t in tables:
        shape[t] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(t)],
            "pk": insp.get_pk_constraint(t)["constrained_columns"],
            "indexes": sorted((i["name"], tuple(i["column_names"])) for i in insp.get_indexes(t)),
            "unique": sorted(str(u["column_names"]) for u in insp.get_unique_constraints(t)),
            "fks": sorted(str(f["referred_table"]) for f in insp.get_foreign_keys(t)),
        }
    if conn.dialect.name == "postgresql":
        for name, query in _PG_OBJECTS.items():
            shape[name] = sorted(str(r[0]) for r in conn.execute(text(query)))
    shape["version"] = lifecycle.schema_status(conn.engine).current
    return shape


@pytest.mark.filterwarnings("ignore:Did not recognize type:sqlalchemy.exc.SAWarning")
def test_a_copied_database_is_the_migrated_schema(
    db_url: str, db_url_factory: Callable[..., str]
) -> None:
    migrated, copied = create_engine(db_url), create_engine(db_url_factory("copy"))
    try:
        assert lifecycle.schema_status(migrated).state is lifecycle.SchemaState.EMPTY
        lifecycle.upgrade_schema(migrated)
        assert lifecycle.schema_status(copied).state is lifecycle.SchemaState.CURRENT
        with migrated.connect() as a, copied.connect() as b:
            want, got = _shape(a), _shape(b)
        assert len(want["tables"]) > 20
        assert got == want
    finally:
        migrated.dispose()
        copied.dispose()


def _read(url: str, query: str | None = None) -> Any:
    """The database's shape and contents (:class:`pgreuse.Template`), or ``query``'s value."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            if query is not None:
                return conn.exec_driver_sql(query).scalar()
            return pgreuse.Template.read(conn)
    finally:
        engine.dispose()


def _released(name: str) -> set[str]:
    """Release ``name`` as a test's end does; the databases it put in the pool."""
    before = set(templates.pooled(PG_URL))
    templates.drop_pg_database(PG_URL, name)
    templates.wait_queued()
    return set(templates.pooled(PG_URL)) - before


@pytest.mark.postgres
def test_a_released_database_is_renewed_as_a_fresh_copy_or_dropped() -> None:
    """A database a test wrote comes back under a new name with no trace of it (rows,
    sequences, planner statistics); one whose shape a test changed is dropped."""
    require_pg()
    used = templates.migrated_pg_database(PG_URL)
    held = [used]  # released at the end whatever fails: no database is left behind
    try:
        url = templates.database_url(PG_URL, used)
        fresh = _read(url)
        store = open_store(create_engine(url))
        try:
            client = RoutingQueueClient(store, source_id="a", client_name="policy")
            client.register_destinations(["b", "c"])
            with Session(store.engine) as session, session.begin():
                client.transmit_log_entry_message(session, b"x" * 5000, ["b", "c"])
            with store.engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE")
        finally:
            store.engine.dispose()
        assert _read(url) != fresh
        assert _read(url, _STATISTICS)

        (renewed,) = _released(used)
        assert renewed != used and not _exists(used)  # a process still trying it finds nothing
        assert _read(templates.database_url(PG_URL, renewed)) == fresh
        assert _read(templates.database_url(PG_URL, renewed), _STATISTICS) == 0

        taken = templates.migrated_pg_database(PG_URL)
        held.append(taken)
        assert taken == renewed
        with create_engine(
            templates.database_url(PG_URL, taken), poolclass=NullPool
        ).begin() as conn:
            conn.exec_driver_sql("ALTER TABLE lr.lrq_meta ADD COLUMN extra int")
        assert _released(taken) == set()
        assert not _exists(taken)
    finally:
        for name in held:
            templates.drop_pg_database(PG_URL, name)  # gone already: nothing to do


_STATISTICS = (
    "SELECT count(*) FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid"
    " WHERE c.relnamespace = CAST('lr' AS regnamespace)"
)


def _exists(database: str) -> bool:
    return bool(_read(PG_URL, f"SELECT count(*) FROM pg_database WHERE datname = '{database}'"))
