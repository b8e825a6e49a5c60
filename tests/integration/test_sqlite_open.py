"""Opening a SQLite store while other connections hold locks on a new database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import lr_client.store as store_module


def test_switching_to_wal_waits_for_a_lock_held_by_another_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER)")  # still in rollback-journal mode
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    opener = sqlite3.connect(path, isolation_level=None, timeout=5)
    # SQLite answers "database is locked" at once here: its busy handler is skipped
    # for a journal-mode change.
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        opener.execute("PRAGMA journal_mode=WAL")

    waits: list[float] = []

    def release_on_first_wait(seconds: float) -> None:
        waits.append(seconds)
        if holder.in_transaction:
            holder.execute("COMMIT")

    monkeypatch.setattr(store_module.time, "sleep", release_on_first_wait)
    store_module._enable_wal(opener.cursor())
    assert len(waits) == 1  # it waited once, while the lock was held, then switched
    assert opener.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert opener.execute("SELECT x FROM t").fetchall() == [(1,)]
    opener.close()
    holder.close()


def test_a_wait_for_the_journal_switch_gives_up_at_the_busy_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    opener = sqlite3.connect(path, isolation_level=None, timeout=5)
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(store_module.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(store_module.time, "sleep", lambda _s: None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store_module._enable_wal(opener.cursor(), timeout_s=30)
    holder.close()
    opener.close()


def test_store_connections_zero_deleted_rows_only_in_the_pages_that_stay(tmp_path: Path) -> None:
    """``secure_delete=FAST`` (2), whatever the build's default (Debian's is on): the pages
    that delivered entries free are not written again, only those still in use are zeroed."""
    engine = store_module.create_engine(f"sqlite:///{tmp_path / 'site.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA secure_delete").scalar() == 2
    finally:
        engine.dispose()
