"""Migrated databases for tests, copied from one real migration per process.

Running the 13 schema revisions costs about 0.1-0.2 s on SQLite and 0.5-1 s
on PostgreSQL (the server's DDL); most tests want a current schema, not the
migration. So each test process migrates once per backend, for real
(:func:`lr_client.store.schema.lifecycle.upgrade_schema`), and hands out copies:

- SQLite: the migrated file, copied to the test's path (WAL mode is kept in the file);
- PostgreSQL: ``CREATE DATABASE ... TEMPLATE`` of a database migrated in its
  schema ``lr`` (a copy of the files, about 0.1 s), with ``synchronous_commit``
  off (commits do not wait for the disk: no test crashes the server), dropped
  ``WITH (FORCE)`` after the test, by a thread of its own (:func:`drop_pg_database`).

A copy equals a migration: ``tests/integration/test_schema_templates.py``
compares them, and ``test_schema_lifecycle.py`` still migrates every revision
from an empty database on both backends.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

import sqlalchemy
from sqlalchemy.engine import make_url

from lr_client.store import create_engine
from lr_client.store.schema.lifecycle import upgrade_schema

#: The schema of a migrated PostgreSQL database.
PG_SCHEMA = "lr"

_sqlite_template: list[Path] = []
_pg_templates: dict[str, str] = {}


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


def database_url(server_url: str, database: str, schema: str = PG_SCHEMA) -> str:
    """The SQLAlchemy URL of ``schema`` in ``database`` on the server of ``server_url``."""
    url = make_url("postgresql+psycopg://" + server_url.split("://", 1)[1])
    base = url.set(database=database).render_as_string(hide_password=False)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


def _server_sql(server_url: str, *statements: str) -> None:
    """Run statements outside a transaction (CREATE/DROP DATABASE) on the server."""
    admin = create_engine(
        server_url, poolclass=sqlalchemy.pool.NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        with admin.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        admin.dispose()


def _drop(server_url: str, database: str) -> None:
    _server_sql(server_url, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _pg_template(server_url: str) -> str:
    """This process's migrated template database on the server (made once)."""
    if server_url not in _pg_templates:
        name = f"lr_tmpl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        _server_sql(server_url, f'CREATE DATABASE "{name}"')
        atexit.register(_drop, server_url, name)
        engine = create_engine(database_url(server_url, name), poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{PG_SCHEMA}"')
            upgrade_schema(engine)
        finally:
            engine.dispose()  # a template takes no connections while it is copied
        _pg_templates[server_url] = name
    return _pg_templates[server_url]


def migrated_pg_database(server_url: str) -> str:
    """A new database holding the migrated schema ``lr``; returns its name."""
    template = _pg_template(server_url)
    name = "t_" + uuid.uuid4().hex[:12]
    # Commits visible at once as ever, only not waiting for the WAL's flush: no test
    # crashes the PostgreSQL server, and a test database is dropped at its end.
    _server_sql(
        server_url,
        f'CREATE DATABASE "{name}" TEMPLATE "{template}"',
        f'ALTER DATABASE "{name}" SET synchronous_commit = off',
    )
    return name


#: Drops queued at most (a test that would queue more waits: databases do not pile up),
#: and the threads running them: concurrent drops share one checkpoint, so the threads
#: drop as many databases per checkpoint as the tests make meanwhile (with 4 threads the
#: 17 PostgreSQL tests of test_cascade_control.py waited 76-86 s for room in the queue).
DROP_BACKLOG, DROP_THREADS = 64, 16
_drops: queue.Queue[tuple[str, str]] = queue.Queue(DROP_BACKLOG)
_dropper: list[threading.Thread] = []
#: Drops that failed (database, error), reported by :func:`finish_drops`.
drop_errors: list[tuple[str, str]] = []


def _drop_loop() -> None:
    while True:
        server_url, database = _drops.get()
        try:
            _drop(server_url, database)
        except Exception as exc:  # reported at the end of the run
            drop_errors.append((database, repr(exc)))
        finally:
            _drops.task_done()


def drop_pg_database(server_url: str, database: str) -> None:
    """Drop a database made by :func:`migrated_pg_database`, closing its sessions.

    The drop is queued to threads of this process and the call returns at
    once (unless :data:`DROP_BACKLOG` drops are pending): ``DROP DATABASE``
    waits for a checkpoint (0.1-2 s, several seconds when the server is busy),
    which the test that made the database no longer needs.
    The caller must have closed its own connections (``WITH (FORCE)`` ends
    any left). :func:`finish_drops` waits for the queue; it runs at exit.
    """
    if not _dropper:
        for n in range(DROP_THREADS):
            thread = threading.Thread(target=_drop_loop, name=f"lr-test-dropdb-{n}", daemon=True)
            thread.start()
            _dropper.append(thread)
        atexit.register(finish_drops)
    _drops.put((server_url, database))


def finish_drops() -> list[tuple[str, str]]:
    """Wait until every queued drop is done; the drops that failed (database, error)."""
    if _dropper:
        _drops.join()
    return list(drop_errors)


__all__ = [
    "PG_SCHEMA",
    "database_url",
    "drop_pg_database",
    "finish_drops",
    "migrated_pg_database",
    "migrated_sqlite",
]
