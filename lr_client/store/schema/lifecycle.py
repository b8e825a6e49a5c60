"""The schema's lifecycle: create, upgrade and check, safe under concurrency.

The schema is versioned by Alembic revisions shipped in
:mod:`lr_client.store.schema.migrations`; a fresh database is created by running
every revision, so a new install and an upgraded one are the same schema.
Databases made by the first release (before revisions were recorded) carry
``lrq_meta.schema_version = 1`` and are adopted as revision ``0001``.

Any number of processes may set up or upgrade one database at the same
moment: the whole upgrade is one transaction that first takes a lock
(PostgreSQL: a transaction-scoped advisory lock keyed by the schema;
SQLite: ``BEGIN IMMEDIATE``, the database's single writer lock). Exactly one
process migrates; the others wait, then find the schema current. PostgreSQL
and SQLite both run DDL inside transactions, so an interrupted upgrade
leaves the previous version intact and can simply be run again.

Checking a current schema (every store's open) reads the version table and
compares it with the newest revision file; Alembic is imported only to
migrate or to explain a schema that is not current.
"""

from __future__ import annotations

import enum
import functools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import column, inspect, select, table, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from lr_client.errors import SchemaError, StoreUnavailableError
from lr_client.store.schema import migrations
from lr_client.store.schema import tables as s

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("lr_client.schema")

#: Alembic's record of the applied revision.
VERSION_TABLE = "lrq_schema_migrations"
#: The revision a database of the first release (no version table) is at.
LEGACY_REVISION = "0001"

_PG_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtextextended('lrq_schema:' || current_schema(), 0))"
)


class SchemaState(enum.StrEnum):
    """Where a database's schema stands: empty, current, behind or ahead of this release."""

    EMPTY = "empty"  # no table of ours
    CURRENT = "current"  # at this release's revision
    BEHIND = "behind"  # migrations pending: run `lr init-db`
    AHEAD = "ahead"  # made by a newer release: upgrade lr


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands against this release."""

    state: SchemaState
    current: str | None  # the applied revision, None if empty
    expected: str  # this release's revision
    pending: tuple[str, ...]  # revisions an upgrade would apply, oldest first

    def describe(self) -> str:
        """One line for an operator: the revisions and the command that fixes them."""
        if self.state is SchemaState.CURRENT:
            return f"schema at revision {self.expected} (current)"
        if self.state is SchemaState.EMPTY:
            return f"no schema; `lr init-db` creates revision {self.expected}"
        if self.state is SchemaState.BEHIND:
            return (
                f"schema at revision {self.current}, this release needs {self.expected}; "
                f"pending: {', '.join(self.pending)} (run `lr init-db`)"
            )
        return (
            f"schema at revision {self.current} is newer than this release's "
            f"{self.expected}: upgrade lr"
        )


_version = table(VERSION_TABLE, column("version_num"))
#: A revision file: ``NNNN_name.py`` holding revision ``NNNN`` (one linear chain).
_REVISION_FILE = re.compile(r"^(\d{4})_\w+\.py$")


def _config(conn: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["connection"] = conn
    cfg.attributes["version_table"] = VERSION_TABLE
    return cfg


def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


@functools.cache
def head_revision() -> str:
    """This release's schema revision: the newest revision file (Alembic's head:
    ``tests/integration/test_schema_lifecycle.py`` checks they agree)."""
    versions = Path(migrations.__file__).parent / "versions"
    found = [m.group(1) for p in versions.iterdir() if (m := _REVISION_FILE.match(p.name))]
    return max(found)


def _applied(conn: Connection) -> str | None:
    """The database's revision (the legacy one for a first-release database)."""
    names = set(inspect(conn).get_table_names())
    if VERSION_TABLE in names:
        rows = conn.execute(select(_version.c.version_num)).scalars().all()
        if len(rows) > 1:
            raise SchemaError(f"unrecognised schema: {VERSION_TABLE} holds {sorted(rows)}")
        return rows[0] if rows else None
    if s.meta.name in names:
        version = conn.execute(
            select(s.meta.c.value).where(s.meta.c.key == "schema_version")
        ).scalar()
        if version == "1":
            return LEGACY_REVISION
        raise SchemaError(f"unrecognised schema: {s.meta.name}.schema_version is {version!r}")
    return None


def _status(conn: Connection) -> SchemaStatus:
    expected = head_revision()
    current = _applied(conn)
    if current == expected:
        return SchemaStatus(SchemaState.CURRENT, current, expected, ())
    script = _script()
    known = {rev.revision for rev in script.walk_revisions()}
    if current is not None and current not in known:
        return SchemaStatus(SchemaState.AHEAD, current, expected, ())
    pending = tuple(
        rev.revision for rev in reversed(list(script.iterate_revisions(expected, current)))
    )
    state = SchemaState.EMPTY if current is None else SchemaState.BEHIND
    return SchemaStatus(state, current, expected, pending)


def _unavailable(exc: OperationalError) -> StoreUnavailableError:
    return StoreUnavailableError(str(exc.orig) if exc.orig else str(exc))


def schema_status(engine: Engine) -> SchemaStatus:
    """Where the database's schema stands; changes nothing."""
    try:
        with engine.connect() as conn, conn.begin():
            return _status(conn)
    except OperationalError as exc:
        raise _unavailable(exc) from exc


def require_current(engine: Engine) -> SchemaStatus:
    """Raise :class:`SchemaError` unless the schema is at this release's revision."""
    status = schema_status(engine)
    if status.state is not SchemaState.CURRENT:
        raise SchemaError(status.describe())
    return status


def upgrade_schema(engine: Engine) -> SchemaStatus:
    """Create or upgrade the schema to this release's revision; safe to run concurrently.

    Returns the status before the upgrade (``pending`` says what was applied).
    A database made by a newer release is refused with :class:`SchemaError`.
    """
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(lr_immediate=True)  # SQLite: BEGIN IMMEDIATE
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(_PG_LOCK)
                before = _status(conn)
                if before.state is SchemaState.AHEAD:
                    raise SchemaError(before.describe())
                if before.state is SchemaState.CURRENT:
                    return before
                from alembic import command

                cfg = _config(conn)
                if before.current == LEGACY_REVISION and VERSION_TABLE not in set(
                    inspect(conn).get_table_names()
                ):
                    command.stamp(cfg, LEGACY_REVISION)
                command.upgrade(cfg, "head")
                _record_version(conn, before.expected)
                log.info("schema upgraded: %s -> %s", before.current or "empty", before.expected)
                return before
    except OperationalError as exc:
        raise _unavailable(exc) from exc


def _record_version(conn: Connection, revision: str) -> None:
    """Mirror the revision in ``lrq_meta`` so a release that predates revisions refuses it."""
    value = str(int(revision))
    found = conn.execute(update(s.meta).where(s.meta.c.key == "schema_version").values(value=value))
    if not found.rowcount:
        conn.execute(s.meta.insert().values(key="schema_version", value=value))


__all__ = [
    "LEGACY_REVISION",
    "VERSION_TABLE",
    "SchemaState",
    "SchemaStatus",
    "head_revision",
    "require_current",
    "schema_status",
    "upgrade_schema",
]
