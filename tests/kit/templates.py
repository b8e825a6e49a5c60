"""Migrated databases for tests, copied from one real migration per process.

Running the 13 schema revisions costs about 0.1-0.2 s on SQLite and 0.5-1 s
on PostgreSQL (the server's DDL); most tests want a current schema, not the
migration. So each test process migrates once per backend, for real
(:func:`lr_client.store.schema.lifecycle.upgrade_schema`), and hands out copies:

- SQLite: the migrated file, copied to the test's path (WAL mode is kept in the file);
- PostgreSQL: ``CREATE DATABASE ... TEMPLATE`` of a database migrated in its
  schema ``lr`` (a copy of the files, about 0.1 s), with ``synchronous_commit``
  off (commits do not wait for the disk: no test crashes the server), released
  after the test to a thread of its own (:func:`drop_pg_database`), which renews it
  for a later test (:mod:`tests.kit.pgreuse`) or drops it ``WITH (FORCE)``.

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
from tests.kit import pgreuse

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


#: Released databases made as new (:mod:`tests.kit.pgreuse`), per server, at most
#: ``POOL`` each; a test takes one before a copy is made.
POOL = 8
_pool: dict[str, list[str]] = {}
_pool_lock = threading.Lock()
_pg_contents: dict[str, pgreuse.Template] = {}


def migrated_pg_database(server_url: str) -> str:
    """A database holding the migrated schema ``lr`` as new; returns its name."""
    with _pool_lock:
        if _pool.get(server_url):
            return _pool[server_url].pop()
    template = _pg_template(server_url)
    name = "t_" + uuid.uuid4().hex[:12]
    # Commits visible at once as ever, only not waiting for the WAL's flush: no test
    # crashes the PostgreSQL server, and a test database is renewed or dropped at its end.
    _server_sql(
        server_url,
        f'CREATE DATABASE "{name}" TEMPLATE "{template}"',
        f'ALTER DATABASE "{name}" SET synchronous_commit = off',
    )
    if server_url not in _pg_contents:  # what a fresh copy holds, read from the first
        engine = create_engine(database_url(server_url, name), poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as conn:
                _pg_contents[server_url] = pgreuse.Template.read(conn)
        finally:
            engine.dispose()
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
_finishing = threading.Event()


def _release(server_url: str, database: str) -> None:
    """Pool ``database`` made as new, under a new name, or drop it."""
    template = _pg_contents.get(server_url)
    with _pool_lock:
        room = template is not None and len(_pool.get(server_url, ())) < POOL
    if not room or _finishing.is_set():
        _drop(server_url, database)
        return
    renamed = "t_" + uuid.uuid4().hex[:12]
    try:  # its sessions ended, and a process of the test that tries again finds no database
        _server_sql(
            server_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND pid <> pg_backend_pid()",
            f'ALTER DATABASE "{database}" RENAME TO "{renamed}"',
        )
    except sqlalchemy.exc.DBAPIError:
        _drop(server_url, database)
        return
    engine = create_engine(
        database_url(server_url, renamed),
        poolclass=sqlalchemy.pool.NullPool,
        isolation_level="AUTOCOMMIT",
    )
    try:
        with engine.connect() as conn:
            renewed = pgreuse.renew(conn, template)
    except sqlalchemy.exc.DBAPIError:
        renewed = False
    except AssertionError as exc:  # reported at the end of the run; the database dropped
        drop_errors.append((database, repr(exc)))
        renewed = False
    finally:
        engine.dispose()
    if renewed:
        with _pool_lock:
            _pool.setdefault(server_url, []).append(renamed)
    else:
        _drop(server_url, renamed)


def _drop_loop() -> None:
    while True:
        server_url, database = _drops.get()
        try:
            _release(server_url, database)
        except Exception as exc:  # reported at the end of the run
            drop_errors.append((database, repr(exc)))
        finally:
            _drops.task_done()


def drop_pg_database(server_url: str, database: str) -> None:
    """Release a database made by :func:`migrated_pg_database`: its sessions are ended
    and the name is gone; it is renewed for a later test, or dropped.

    The release is queued to threads of this process and the call returns at
    once (unless :data:`DROP_BACKLOG` are pending): ``DROP DATABASE`` waits
    for a checkpoint (0.1-2 s, several seconds when the server is busy),
    which the test that made the database no longer needs.
    The caller should have closed its own connections (the release ends any
    left). :func:`finish_drops` waits for the queue and drops the pooled
    databases; it runs at exit.
    """
    if not _dropper:
        for n in range(DROP_THREADS):
            thread = threading.Thread(target=_drop_loop, name=f"lr-test-dropdb-{n}", daemon=True)
            thread.start()
            _dropper.append(thread)
        atexit.register(finish_drops)
    _drops.put((server_url, database))


def pooled(server_url: str) -> list[str]:
    """The databases waiting in the pool for a test, oldest first."""
    with _pool_lock:
        return list(_pool.get(server_url, ()))


def wait_queued() -> None:
    """Wait until every queued release (renewal or drop) is done."""
    if _dropper:
        _drops.join()


def finish_drops() -> list[tuple[str, str]]:
    """Wait until every queued drop is done, then drop the pooled databases; the drops
    that failed (database, error)."""
    if _dropper:
        _drops.join()
        _finishing.set()
        with _pool_lock:
            pooled = [(url, name) for url, names in _pool.items() for name in names]
            _pool.clear()
        for server_url, database in pooled:
            _drops.put((server_url, database))
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
