"""``create_app_tables``: an application's tables created beside a running site's writes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import Column, Integer, MetaData, Table, event, inspect

from lr_client.store import create_app_tables, create_engine

meta = MetaData()
applied = Table("app_applied", meta, Column("id", Integer, primary_key=True))


def _failures(engine: sqlalchemy.Engine) -> list[BaseException]:
    seen: list[BaseException] = []
    event.listen(engine, "handle_error", lambda ctx: seen.append(ctx.original_exception))
    return seen


def test_a_write_between_the_schema_read_and_the_create_is_waited_out(tmp_path: Path) -> None:
    path = tmp_path / "site.db"
    engine = create_engine(f"sqlite:///{path}")
    failures = _failures(engine)
    server = sqlite3.connect(path, isolation_level=None)
    server.execute("CREATE TABLE busy (x)")
    writes = []

    def a_server_writes(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().startswith("CREATE TABLE") and not writes:
            # After the create read the schema, before it writes: it cannot go on.
            writes.append(server.execute("INSERT INTO busy VALUES (1)"))

    event.listen(engine, "before_cursor_execute", a_server_writes)
    create_app_tables(engine, meta)
    server.close()
    assert writes and failures and all("locked" in str(f) for f in failures)
    assert "app_applied" in inspect(engine).get_table_names()


def test_other_errors_are_raised_at_once(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'missing' / 'site.db'}")
    failures = _failures(engine)
    with pytest.raises(sqlalchemy.exc.OperationalError, match="unable to open"):
        create_app_tables(engine, meta)
    assert len(failures) <= 1  # no retry
