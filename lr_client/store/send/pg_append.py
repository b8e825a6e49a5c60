"""PostgreSQL's transmit path: the statements that append to the send queue, named once.

An application's transaction runs them (:meth:`SendLog.append_log_entries
<lr_client.store.contract.SendLog.append_log_entries>`). On psycopg's sync
connection they go through the driver's own cursor (a batch's rows in one
binary COPY): this runs in every transmitting transaction, and SQLAlchemy's
statement machinery costs the application several times the driver's own work
per call. So does one entry on psycopg's async connection (reached from an
``AsyncConnection`` through ``run_sync``: awaited in its greenlet). Otherwise
(asyncpg, whose transaction SQLAlchemy's adapter begins at its first
statement; a batch on psycopg's async connection) the same statements go
through the DB-API cursor of SQLAlchemy's adapter (the text compiled once per
dialect), a batch's rows in one executemany: the same rows, the same round
trips (one per entry, two per batch).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.util import await_only

from lr_client.records import EntryRef, NewLogEntry, new_entry_headers, new_entry_key
from lr_client.store import watches

try:
    import psycopg
except ImportError:  # pragma: no cover - only without the extra
    psycopg = None  # type: ignore[assignment]

#: The sessions' wake-up at commit (:data:`~lr_client.store.watches.SENDS_CHANNEL`),
#: sent from the statement a transmit runs anyway: no round trip of its own.
NOTIFY_SENDS = (
    # The condition in a FROM-less SELECT: checked before pg_notify is called (in a
    # FROM clause, the function would run first and the condition filter its row).
    f"(SELECT count(*) FROM (SELECT pg_notify('{watches.SENDS_CHANNEL}', '')"
    f" WHERE pg_notification_queue_usage() < {watches.QUEUE_USAGE_LIMIT}) n)"
)
_VALUES = (
    "VALUES (:client_name, :payload, CAST(:dest_nums AS smallint[]), :created_at, :key, :headers)"
)
_INSERT_SQL = (
    "INSERT INTO lrq_send_entries"
    " (client_name, payload, dest_nums, created_at, partition_key, headers) "
    f"{_VALUES} RETURNING CAST(CAST(txid AS text) AS bigint), ord"
)
_INSERT_NOTIFY_SQL = (
    "WITH e AS (INSERT INTO lrq_send_entries"
    f" (client_name, payload, dest_nums, created_at, partition_key, headers) {_VALUES}"
    " RETURNING txid, ord) "
    f"SELECT CAST(CAST(e.txid AS text) AS bigint), e.ord, {NOTIFY_SENDS} FROM e"
)
#: A batch reserves its ordinals at once: the transaction-local counter that
#: ``lrq_next_ord`` (the ``ord`` default, revision 0004) advances by one per
#: row, advanced here by the batch's size. Returns (txid, first ordinal).
_RESERVE_SQL = (
    "SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint), "
    "CAST(set_config(k.name, CAST(CAST(coalesce(nullif(current_setting(k.name, true), ''), '0')"
    " AS bigint) + :n AS text), true) AS bigint) - :n + 1 "
    "FROM (SELECT 'lrq.ord_' || CAST(CAST('lrq_send_entries' AS regclass) AS oid) AS name) k"
)
_RESERVE_NOTIFY_SQL = _RESERVE_SQL.replace(" FROM (", f", {NOTIFY_SENDS} FROM (", 1)
#: A batch's rows with their reserved ordinals, where no COPY serves.
_INSERT_ROWS_SQL = (
    "INSERT INTO lrq_send_entries"
    " (client_name, payload, dest_nums, created_at, ord, partition_key, headers)"
    " VALUES (:client_name, :payload, CAST(:dest_nums AS smallint[]), :created_at, :ord, :key,"
    " :headers)"
)
_COPY_ENTRIES = (
    "COPY lrq_send_entries"
    " (client_name, payload, dest_nums, created_at, ord, partition_key, headers)"
    " FROM STDIN (FORMAT BINARY)"
)
_ENTRY_TYPES = ("varchar", "bytea", "int2[]", "float8", "int8", "bytea", "bytea")


def _compiled(sql: str, dialect: Dialect) -> tuple[str, tuple[str, ...] | None]:
    """``sql`` in ``dialect``'s paramstyle, and its parameters' order if positional."""
    compiled = text(sql).compile(dialect=dialect)
    names = compiled.positiontup
    return str(compiled), (tuple(names) if names else None)


_PYFORMAT = postgresql.dialect(paramstyle="pyformat")  # type: ignore[no-untyped-call]
#: The named statements by (batch, notify), and psycopg's own text of each.
_STATEMENTS: dict[tuple[bool, bool], tuple[str, str]] = {
    (batch, notify): (sql, _compiled(sql, _PYFORMAT)[0])
    for (batch, notify), sql in {
        (False, False): _INSERT_SQL,
        (False, True): _INSERT_NOTIFY_SQL,
        (True, False): _RESERVE_SQL,
        (True, True): _RESERVE_NOTIFY_SQL,
    }.items()
}
#: Another driver's text of a statement: (named statement, dialect class, paramstyle).
_DRIVER_TEXT: dict[tuple[str, type[Dialect], str], tuple[str, tuple[str, ...] | None]] = {}


def insert_entries(
    conn: Connection, client_name: str, messages: Sequence[NewLogEntry], notify: bool
) -> list[EntryRef]:
    """Append ``messages`` in ``conn``'s transaction (which must have begun); a ref each.

    ``notify`` wakes the sender sessions at commit, from the first statement.
    """
    now = time.time()
    named, own = _STATEMENTS[(len(messages) > 1, notify)]
    raw = conn.connection.driver_connection
    if psycopg is not None and isinstance(raw, psycopg.AsyncConnection) and len(messages) == 1:
        # psycopg's async connection, in the greenlet of run_sync: the statement on it
        # as on the sync one (SQLAlchemy's execution cost more than the driver's work).
        m = messages[0]
        acur = await_only(raw.execute(own, _row(client_name, m, now, _array(m[1]))))
        found = await_only(acur.fetchone())
        assert found is not None
        return [EntryRef(int(found[0]), int(found[1]))]
    if psycopg is None or not isinstance(raw, psycopg.Connection):
        return _through_dbapi(conn, named, client_name, messages, now)
    with raw.cursor() as cur:
        if len(messages) == 1:
            m = messages[0]
            cur.execute(own, _row(client_name, m, now, _array(m[1])))
            row = cur.fetchone()
            assert row is not None
            return [EntryRef(int(row[0]), int(row[1]))]
        # A batch: its ordinals reserved in one statement, its rows in one
        # COPY (the stamp trigger fires for the row whose ordinal is 1).
        cur.execute(own, {"n": len(messages)})
        row = cur.fetchone()
        assert row is not None
        txid, first = int(row[0]), int(row[1])
        with cur.copy(_COPY_ENTRIES) as copy:
            copy.set_types(list(_ENTRY_TYPES))
            for i, m in enumerate(messages):
                key, headers = new_entry_key(m), new_entry_headers(m)
                copy.write_row((client_name, m[0], list(m[1]), now, first + i, key, headers))
    return [EntryRef(txid, first + i) for i in range(len(messages))]


def _row(client_name: str, m: NewLogEntry, now: float, dests: Any) -> dict[str, Any]:
    return {
        "client_name": client_name,
        "payload": m[0],
        "dest_nums": dests,
        "created_at": now,
        "key": new_entry_key(m),
        "headers": new_entry_headers(m),
    }


def _array(nums: Sequence[int]) -> str:
    """Site numbers as PostgreSQL's array literal (the statement casts it to smallint[])."""
    return "{" + ",".join(str(n) for n in nums) + "}"


def _through_dbapi(
    conn: Connection,
    named: str,
    client_name: str,
    messages: Sequence[NewLogEntry],
    now: float,
) -> list[EntryRef]:
    """The same statements on the connection's DB-API cursor (SQLAlchemy's adapter of
    an async driver: it begins the transaction at the first statement, as
    ``exec_driver_sql`` would), in the driver's paramstyle (compiled once per
    dialect): no execution context, result or type processing per call, which
    cost the application more than the statement. asyncpg types the array
    parameter from the statement (smallint[]) and takes a list; psycopg takes the
    literal, as on its own cursor. A driver's error is raised as SQLAlchemy's, as
    ``exec_driver_sql`` raises it."""
    dialect = conn.dialect
    as_list = dialect.driver == "asyncpg"
    cursor = conn.connection.cursor()

    def run(sql: str, rows: list[dict[str, Any]], many: bool = False) -> Any:
        key = (sql, type(dialect), dialect.paramstyle)
        found = _DRIVER_TEXT.get(key)
        if found is None:
            found = _DRIVER_TEXT[key] = _compiled(sql, dialect)
        string, order = found
        params: list[Any] = [r if order is None else tuple(r[n] for n in order) for r in rows]
        try:
            if many:
                cursor.executemany(string, params)
                return None
            cursor.execute(string, params[0])
            return cursor.fetchone()
        except dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(
                string, params, exc, dialect.loaded_dbapi.Error, dialect=dialect
            ) from exc

    def dests(m: NewLogEntry) -> Any:
        return list(m[1]) if as_list else _array(m[1])

    try:
        if len(messages) == 1:
            m = messages[0]
            row = run(named, [_row(client_name, m, now, dests(m))])
            return [EntryRef(int(row[0]), int(row[1]))]
        reserved = run(named, [{"n": len(messages)}])
        txid, first = int(reserved[0]), int(reserved[1])
        rows = [
            {**_row(client_name, m, now, dests(m)), "ord": first + i}
            for i, m in enumerate(messages)
        ]
        run(_INSERT_ROWS_SQL, rows, many=True)
        return [EntryRef(txid, first + i) for i in range(len(messages))]
    finally:
        cursor.close()


__all__ = ["NOTIFY_SENDS", "insert_entries"]
