"""Migrated databases for tests, made from one real migration per process.

Running the 13 schema revisions costs about 0.2 s on SQLite and 0.8 s on
PostgreSQL; most tests want a current schema, not the migration. So each test
process migrates once per backend, for real (:func:`lr_client.store.lifecycle.upgrade_schema`),
and hands out copies:

- SQLite: the migrated file, copied to the test's path (WAL mode is kept in the file);
- PostgreSQL: the statements the migration sent to the server, recorded as it
  ran and run again, in one transaction, in the test's own schema. The
  revisions name their schema through ``current_schema()``, never literally
  (checked: no recorded statement names the template's schema), so the copy is
  the migration's result in another schema.

A copy equals a migration: ``tests/integration/test_schema_templates.py`` compares
them, table for table, and ``test_schema_lifecycle.py`` still migrates every
revision from an empty database on both backends.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import event

from lr_client.store import create_engine
from lr_client.store.lifecycle import upgrade_schema


@dataclass(frozen=True)
class _Statement:
    sql: str
    params: Any
    many: bool


_sqlite_template: list[Path] = []
_pg_templates: dict[str, list[_Statement]] = {}


def _sqlite_file() -> Path:
    if not _sqlite_template:
        folder = Path(tempfile.mkdtemp(prefix="lr-template-"))
        atexit.register(shutil.rmtree, folder, True)
        path = folder / "migrated.db"
        engine = create_engine(f"sqlite:///{path}")
        try:
            upgrade_schema(engine)
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            engine.dispose()
        _sqlite_template.append(path)
    return _sqlite_template[0]


def migrated_sqlite(path: Path) -> None:
    """Put a migrated SQLite database at ``path`` (which must not exist yet)."""
    if path.exists():
        raise FileExistsError(path)
    shutil.copyfile(_sqlite_file(), path)


def _schema_url(admin_url: str, schema: str) -> str:
    base = "postgresql+psycopg://" + admin_url.split("://", 1)[1]
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


def _recorded_migration(admin_url: str) -> list[_Statement]:
    """The statements of one real migration of an empty schema (made once per server)."""
    if admin_url in _pg_templates:
        return _pg_templates[admin_url]
    schema = "tmpl_" + uuid.uuid4().hex[:12]
    admin = create_engine(admin_url, poolclass=sqlalchemy.pool.NullPool)
    recorded: list[_Statement] = []
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        engine = create_engine(_schema_url(admin_url, schema), poolclass=sqlalchemy.pool.NullPool)

        @event.listens_for(engine, "before_cursor_execute")
        def record(
            conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> None:
            recorded.append(_Statement(statement, params, many))

        try:
            upgrade_schema(engine)
        finally:
            engine.dispose()
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()
    named = [s.sql for s in recorded if schema in s.sql]
    assert not named, f"a migration statement names its schema literally: {named[0][:200]}"
    _pg_templates[admin_url] = recorded
    return recorded


def migrated_pg_schema(admin_url: str, schema: str) -> None:
    """Give the existing, empty PostgreSQL ``schema`` the migrated schema."""
    statements = _recorded_migration(admin_url)
    engine = create_engine(_schema_url(admin_url, schema), poolclass=sqlalchemy.pool.NullPool)
    try:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            for s in statements:
                if s.many:
                    cursor.executemany(s.sql, _seq(s.params))
                else:
                    cursor.execute(s.sql, s.params)
            raw.commit()
        finally:
            raw.close()
    finally:
        engine.dispose()


def _seq(params: Any) -> Sequence[Mapping[str, Any]]:
    return list(params)


__all__ = ["migrated_pg_schema", "migrated_sqlite"]
