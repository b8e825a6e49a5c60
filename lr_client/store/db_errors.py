"""Database errors as the store's own: :func:`map_error` and :func:`mapped_errors`."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, OperationalError

from lr_client.errors import LRError, SchemaError, StoreUnavailableError

#: SQLSTATEs of a missing or older schema: undefined table, schema, column, function.
MISSING_SCHEMA_STATES = frozenset({"42P01", "3F000", "42703", "42883"})


def raw_errors(operational: bool = False) -> tuple[type[Exception], ...]:
    """Errors of the drivers' own cursors, which some hot paths write through.

    psycopg's count once it is imported (a PostgreSQL engine imports it): a
    process that only opens SQLite does not pay for importing the driver.
    """
    drivers = [sqlite3, *filter(None, [sys.modules.get("psycopg")])]
    return tuple(d.OperationalError if operational else d.Error for d in drivers)


def map_error(exc: Exception) -> LRError | None:
    """The store's error for a database error (None: not ours, re-raise it as it is).

    ``exc`` is SQLAlchemy's wrapper or a raw ``sqlite3`` or ``psycopg`` error
    (some hot paths write through the driver's own cursor). A table,
    schema or column that does not exist is a :class:`SchemaError`
    (permanent: ``lr init-db`` must run); any other operational error is a
    :class:`StoreUnavailableError` (transient: the database may come back).
    """
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    detail = str(orig) if orig else str(exc)
    state = getattr(orig, "sqlstate", None)
    operational = isinstance(exc, (OperationalError, *raw_errors(operational=True)))
    if state in MISSING_SCHEMA_STATES or (
        operational and ("no such table" in detail or "no such column" in detail)
    ):
        first = detail.splitlines()[0] if detail else ""
        return SchemaError(
            f"no schema, or an older one ({first}); `lr init-db` creates or upgrades it"
        )
    if operational:
        return StoreUnavailableError(detail)
    return None


def database_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's database errors and the drivers' own (:func:`raw_errors`)."""
    return (DBAPIError, *raw_errors())


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Raise the store's error (:func:`map_error`) for a database error in the block."""
    try:
        yield
    except database_errors() as exc:
        mapped = map_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


__all__ = ["database_errors", "map_error", "mapped_errors", "raw_errors"]
