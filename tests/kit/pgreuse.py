"""A test's PostgreSQL database made as new for the next test, instead of dropped.

Copying the template (``CREATE DATABASE ... TEMPLATE``, 10 MB to the WAL) and
dropping the copy (a checkpoint) cost the server 0.2-0.3 s of CPU together;
renewing one about 0.1 s. A released database is renamed (a process of the test
still trying it finds no database) and its sessions ended; the indexes the test
made are dropped; then it is checked against a fresh copy: every object of its
schemas and their definitions, the database's settings, no prepared transaction.
Only if all match is it emptied (``TRUNCATE`` of the tables written), given the
template's rows and sequence values back and its planner statistics and counters
reset; anything else (a table altered, a trigger disabled) and it is dropped as
before. ``tests/integration/test_schema_templates.py`` checks both outcomes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

#: Every schema a test or the store may create objects in: all but the system's.
_USER = (
    "n.nspname NOT IN ('pg_catalog', 'information_schema')"
    " AND left(n.nspname, 8) <> 'pg_toast' AND left(n.nspname, 7) <> 'pg_temp'"
)

#: The definitions that make a database's shape, each query's rows sorted.
_SHAPE = (
    f"SELECT n.nspname, n.nspacl::text FROM pg_namespace n WHERE {_USER}",
    "SELECT c.relname, c.relkind, c.relpersistence, c.reltablespace, c.reloptions::text,"
    " c.relacl::text, c.relrowsecurity, c.relreplident, c.relispartition,"
    " pg_get_expr(c.relpartbound, c.oid), c.relowner"
    f" FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}",
    "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),"
    " a.attnotnull, a.attisdropped, a.attidentity, a.attgenerated,"
    " pg_get_expr(d.adbin, d.adrelid), a.attstattarget"
    " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
    f" WHERE a.attnum > 0 AND {_USER}",
    "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisclustered"
    " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}",
    "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid), k.convalidated"
    " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}",
    "SELECT pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t"
    " JOIN pg_class c ON c.oid = t.tgrelid"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}",
    "SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(p.prosrc),"
    " p.proconfig::text, p.prosecdef, p.provolatile"
    f" FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER}",
    "SELECT t.typname, t.typtype, (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)"
    " FROM pg_enum e WHERE e.enumtypid = t.oid)"
    f" FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE {_USER}",
    "SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('v', 'm') AND {_USER}",
    "SELECT r.rulename, r.ev_class::regclass::text FROM pg_rewrite r"
    " JOIN pg_class c ON c.oid = r.ev_class"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind NOT IN ('v', 'm') AND {_USER}",
    "SELECT polname, polrelid::regclass::text FROM pg_policy",
    "SELECT pubname FROM pg_publication",
    "SELECT evtname FROM pg_event_trigger",
    "SELECT extname, extversion FROM pg_extension",
    "SELECT count(*) FROM pg_largeobject_metadata",
    "SELECT s.setrole, s.setconfig::text FROM pg_db_role_setting s"
    " WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
    "SELECT d.datacl::text, d.datallowconn, d.datconnlimit, d.dattablespace FROM pg_database d"
    " WHERE d.datname = current_database()",
)

_TABLES = (
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND {_USER}"
)
_SEQUENCES = (
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c"
    f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'S' AND {_USER}"
)

#: Indexes not part of another's (a partition's index attached to its table's).
_INDEXES = (
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    f" WHERE c.relkind IN ('i', 'I') AND NOT c.relispartition AND {_USER}"
)
_WRITTEN = _TABLES.replace(
    "c.relkind IN ('r', 'p')", "c.relkind = 'r' AND pg_relation_size(c.oid) > 0"
)


def shape(conn: Connection) -> str:
    """A digest of every definition that makes the database's shape."""
    digest = hashlib.sha256()
    for query in _SHAPE:
        rows = sorted(repr(tuple(r)) for r in conn.exec_driver_sql(query))
        digest.update(query.encode())
        digest.update("\n".join(rows).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Template:
    """What a fresh copy holds: its shape, its tables' rows and its sequences' values."""

    shape: str
    tables: tuple[str, ...]
    indexes: frozenset[str]
    rows: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]
    sequences: dict[str, tuple[int, bool]]

    @classmethod
    def read(cls, conn: Connection) -> Template:
        tables = tuple(sorted(r[0] for r in conn.exec_driver_sql(_TABLES)))
        rows: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]] = {}
        for table in tables:
            columns, found = _rows(conn, table)
            if found:
                rows[table] = (columns, found)
        sequences = {}
        for (seq,) in conn.exec_driver_sql(_SEQUENCES).all():
            last, called = conn.exec_driver_sql(f"SELECT last_value, is_called FROM {seq}").one()
            sequences[seq] = (int(last), bool(called))
        indexes = frozenset(r[0] for r in conn.exec_driver_sql(_INDEXES))
        return cls(shape(conn), tables, indexes, rows, sequences)


def _rows(conn: Connection, table: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    result = conn.exec_driver_sql(f"SELECT * FROM ONLY {table}")  # a name from the catalog
    return tuple(result.keys()), sorted((tuple(r) for r in result), key=repr)


def idle(conn: Connection) -> bool:
    """Whether nobody else is connected to the database and no transaction is prepared."""
    others = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).scalar()
    prepared = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
    ).scalar()
    return others == 0 and prepared == 0


def renew(conn: Connection, template: Template) -> bool:
    """Make the database (``conn``'s, in autocommit: a failure half-way leaves it to be
    dropped) as the template's copy was: the indexes the test made dropped, then every
    table it wrote emptied. False if someone else is connected or, once its indexes are
    dropped, its shape differs."""
    if not idle(conn):
        return False
    # The store makes indexes as it runs (one per destination on PostgreSQL): dropped.
    made = sorted({r[0] for r in conn.exec_driver_sql(_INDEXES)} - template.indexes)
    if made:
        conn.exec_driver_sql(f"DROP INDEX {', '.join(made)}")  # names from the catalog
    if shape(conn) != template.shape:
        return False
    # A table never written is still empty, its file of no pages: only those written
    # are truncated (each a new file), and a table the template fills only if its rows
    # changed (the store may have truncated it: no pages, and no rows).
    refill = {t: rows for t, rows in template.rows.items() if _rows(conn, t) != rows}
    written = {r[0] for r in conn.exec_driver_sql(_WRITTEN)} - set(template.rows)
    if written | set(refill):
        conn.exec_driver_sql(f"TRUNCATE {', '.join(sorted(written | set(refill)))}")
    for table, (columns, rows) in refill.items():
        names = ", ".join(f'"{c}"' for c in columns)
        marks = ", ".join(f"%(c{i})s" for i in range(len(columns)))
        conn.exec_driver_sql(
            # names from the catalog
            f"INSERT INTO {table} ({names}) OVERRIDING SYSTEM VALUE VALUES ({marks})",
            [{f"c{i}": v for i, v in enumerate(row)} for row in rows],
        )
    for seq, (last, called) in template.sequences.items():
        conn.exec_driver_sql(
            "SELECT setval(%(s)s, %(v)s, %(c)s)", {"s": seq, "v": last, "c": called}
        )
    conn.exec_driver_sql(
        "DELETE FROM pg_statistic WHERE starelid IN (SELECT c.oid FROM pg_class c"
        f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER})"
    )
    conn.exec_driver_sql("SELECT pg_stat_reset()")
    if Template.read(conn) != template:  # every row and sequence as a fresh copy's
        raise AssertionError("a renewed database differs from a fresh copy")
    return idle(conn)


__all__ = ["Template", "idle", "renew", "shape"]
