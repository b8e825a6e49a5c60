"""What every role of the SQLAlchemy store stands on: the engine, transactions,
the site cache, upserts, and the hooks a dialect (SQLite, PostgreSQL) fills in.

Each role's implementation is a mixin over :class:`StoreBase`
(:mod:`~lr_client.store.sqla` composes them); the dialect classes override
the abstract hooks.
"""

from __future__ import annotations

import abc
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from lr_client.errors import FencedError, LRError, SchemaError, StoreUnavailableError
from lr_client.records import EntryRef, Fence, NewLogEntry
from lr_client.store import schema as s
from lr_client.store.relay_marks import RelayMarks

try:  # the PostgreSQL driver is an optional extra
    import psycopg
except ImportError:  # pragma: no cover - only without the extra
    psycopg = None  # type: ignore[assignment]

#: SQLSTATEs of a missing or older schema: undefined table, schema, column.
MISSING_SCHEMA_STATES = frozenset({"42P01", "3F000", "42703"})
#: Errors of the drivers' own cursors, which some hot paths write through.
RAW_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error,) + (
    (psycopg.Error,) if psycopg is not None else ()
)
RAW_OPERATIONAL: tuple[type[Exception], ...] = (sqlite3.OperationalError,) + (
    (psycopg.OperationalError,) if psycopg is not None else ()
)


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
    operational = isinstance(exc, (OperationalError, *RAW_OPERATIONAL))
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


_DATABASE_ERRORS: tuple[type[Exception], ...] = (DBAPIError, *RAW_ERRORS)


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Raise the store's error (:func:`map_error`) for a database error in the block."""
    try:
        yield
    except _DATABASE_ERRORS as exc:
        mapped = map_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


class StoreBase(abc.ABC):
    """The engine, the store's own transactions, the site cache and the dialect hooks."""

    dialect = "generic"
    #: Isolation for trim: every read of the transaction sees one snapshot.
    consistent_isolation: str | None = None
    #: The dialect's INSERT construct (it has ``on_conflict_do_nothing/update``).
    dialect_insert: Any = None
    #: PostgreSQL: seconds a slot of the send queue stays current before a trim
    #: closes it (0: every trim closes it). SQLite trims rows and ignores it.
    rotation_period: float = 30.0
    #: PostgreSQL: slots are added while the others are pinned, up to this many.
    max_slots: int = 32

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sites: dict[str, int] = {}
        self._site_names: dict[int, str] = {}
        self._queue_ids: dict[str, int] = {}
        #: Queue ids each open transaction registered or read, cached once it commits:
        #: a registration rolled back with its transaction must be made again.
        self._txn_queue_ids: dict[Connection, dict[str, int]] = {}
        #: queue_id -> whether it is relayed, read when this store last took its lease.
        self._relayed: dict[int, bool] = {}
        #: snapshot_id -> (ordinal, part, seq) of the last entry a read returned.
        self._snapshot_marks: dict[tuple[str, int], tuple[int, int, int]] = {}
        #: Per thread: whether its transactions run on one connection, and which.
        self._pins = threading.local()
        #: Where relay reads of a relayed queue may start (:mod:`.relay_marks`).
        self._relay_marks = RelayMarks()

    # -- transactions -----------------------------------------------------------
    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Run the calling thread's transactions of this store on one connection of its
        own until the block ends (taken at the first, given back at the end).

        For a thread that runs transactions back to back (a partition worker): no
        pool checkout per transaction, and no connection closed and opened again
        when more threads than the pool keeps give theirs back at once. A
        transaction begun while the thread's connection is in one (nested) takes
        another from the pool.
        """
        self._pins.on = True
        try:
            yield
        finally:
            self._pins.on = False
            conn, self._pins.conn = getattr(self._pins, "conn", None), None
            if conn is not None:
                with suppress(*_DATABASE_ERRORS):
                    conn.close()

    def _connect(self, immediate: bool) -> AbstractContextManager[Connection]:
        """A connection for one transaction (``immediate``: SQLite's BEGIN IMMEDIATE):
        the thread's pinned one if it is free, else one from the pool."""
        if getattr(self._pins, "on", False):
            conn: Connection | None = getattr(self._pins, "conn", None)
            if conn is not None and (conn.closed or conn.invalidated):
                with suppress(*_DATABASE_ERRORS):
                    conn.close()
                conn = None
            if conn is None:
                conn = self._pins.conn = self.engine.connect()
            if not conn.in_transaction():
                # Its options are set again for each transaction: none stays from the last.
                return nullcontext(conn.execution_options(lr_immediate=immediate, lr_turn=None))
        return self.engine.connect().execution_options(lr_immediate=immediate)

    @contextmanager
    def write(self, consistent: bool = False) -> Iterator[Connection]:
        """A read-write transaction of the store's own."""
        if consistent and self.consistent_isolation:  # an isolation level: never pinned
            with mapped_errors(), self.engine.connect() as conn:
                conn = conn.execution_options(
                    lr_immediate=True, isolation_level=self.consistent_isolation
                )
                with self._transaction(conn):
                    yield conn
            return
        with mapped_errors(), self._connect(immediate=True) as conn, self._transaction(conn):
            yield conn

    def _announce_sends(self, conn: Connection) -> None:  # noqa: B027 - a hook: most need none
        """Work for the sender sessions was written in ``conn``'s transaction: wake them
        at commit where the backend needs telling (PostgreSQL; SQLite's watch sees it)."""

    @contextmanager
    def _transaction(self, conn: Connection) -> Iterator[Connection]:
        """``conn``'s transaction; the queue ids it learnt are cached once it committed."""
        try:
            with conn.begin():
                yield conn
            self._queue_ids.update(self._txn_queue_ids.get(conn, {}))
        finally:
            self._txn_queue_ids.pop(conn, None)

    @contextmanager
    def late_write(self, turn: AbstractContextManager[object]) -> Iterator[Connection]:
        """A read-write transaction that takes the database's write lock at its first
        statement, not at BEGIN, after ``turn`` (a lock of the process's writers): what
        runs before its first statement (a listener's wait) holds no lock.

        Row locks (PostgreSQL) need neither: this is :meth:`write`.
        """
        with self.write() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        with mapped_errors(), self._connect(immediate=False) as conn, conn.begin():
            yield conn

    @contextmanager
    def read_statements(self) -> Iterator[Connection]:
        """Reads that need no snapshot across their statements: each sees what was
        committed before it began, as in a ``READ COMMITTED`` transaction (PostgreSQL
        runs them without a transaction: no ``BEGIN`` and ``COMMIT`` round trips, on a
        hot path of every batch shipped); :meth:`read` here."""
        with self.read() as conn:
            yield conn

    def _fetch_rows(
        self, conn: Connection, query: Any, in_index_order: bool = False
    ) -> Sequence[Any]:
        """The rows of a read of entries with their payloads, as tuples (by index).

        A backend may fetch them a faster way (PostgreSQL: binary results;
        SQLite: the driver's rows). ``in_index_order``: the query takes the
        first rows of an index range in its order (``ORDER BY`` the index,
        ``LIMIT``), and must be planned so, whatever the statistics say.
        """
        return conn.execute(query).all()

    # -- the site cache -----------------------------------------------------------
    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        if refresh or not self._sites:
            with self.read() as conn:
                rows = conn.execute(select(s.sites.c.site_id, s.sites.c.site_num)).all()
            self._sites = {r.site_id: r.site_num for r in rows}
            self._site_names = {num: name for name, num in self._sites.items()}
        return dict(self._sites)

    def site_name(self, num: int) -> str:
        if num not in self._site_names:
            self.site_numbers(refresh=True)
        return self._site_names.get(num, f"#{num}")

    @staticmethod
    def _dest_nums_of(value: Any) -> list[int]:
        """The destination numbers stored with an entry (a backend's encoding)."""
        if isinstance(value, str):  # SQLite: ",1,5,"
            return [int(x) for x in value.split(",") if x]
        return [int(x) for x in value]

    # -- upserts -------------------------------------------------------------------
    def _insert_ignore(
        self, conn: Connection, table: Any, rows: list[dict[str, Any]], keys: list[str]
    ) -> None:
        conn.execute(self.dialect_insert(table).on_conflict_do_nothing(index_elements=keys), rows)

    def _upsert(
        self,
        conn: Connection,
        table: Any,
        row: dict[str, Any],
        keys: list[str],
        keep: Sequence[str] = (),
    ) -> None:
        """Insert ``row``, or update it on a key conflict (except the ``keep`` columns)."""
        stmt = self.dialect_insert(table).values(**row)
        stmt = stmt.on_conflict_do_update(
            index_elements=keys,
            set_={k: v for k, v in row.items() if k not in keys and k not in keep},
        )
        conn.execute(stmt)

    def _set_cursor(
        self,
        conn: Connection,
        destination: str,
        client_name: str,
        position: int,
        needs_snapshot: bool | None,
    ) -> None:
        """Upsert a cursor; ``needs_snapshot=None`` keeps the flag as it is."""
        row: dict[str, Any] = {
            "destination": destination,
            "client_name": client_name,
            "position": position,
            "acked_at": time.time(),
            "needs_snapshot": bool(needs_snapshot),
        }
        keep = ["needs_snapshot"] if needs_snapshot is None else []
        self._upsert(conn, s.cursors, row, ["destination", "client_name"], keep)

    def _fence(self, conn: Connection, fence: Fence | None) -> None:
        """Hold ``fence``'s lease row for the transaction, or raise :class:`FencedError`."""
        if fence is None:
            return
        u = s.unit_leases
        n = conn.execute(
            update(u)
            .where(u.c.unit == fence.unit, u.c.owner == fence.owner, u.c.token == fence.token)
            .values(token=u.c.token)
        ).rowcount
        if not n:
            raise FencedError(
                f"unit {fence.unit}: the lease of token {fence.token} is no longer this member's"
            )

    # -- dialect hooks ------------------------------------------------------------------
    @abc.abstractmethod
    def head_position(self, conn: Connection | None = None) -> int:
        """The highest position assigned so far (0 if none)."""

    @abc.abstractmethod
    def _insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[NewLogEntry]
    ) -> list[EntryRef]:
        """Insert send log entries with their destinations; a ref for each."""

    def sequence(self) -> int:
        """Give positions to entries committed since the last call; how many (a hook).

        Every read of positions calls it first. SQLite assigns positions at
        insert: nothing to do.
        """
        return 0

    def _bases(self, conn: Connection, txids: Sequence[int]) -> dict[int, int]:
        """{txid: base} of sequenced transactions: an entry's position is base + ord."""
        return {}

    @abc.abstractmethod
    def _with_tag(self, query: Any, dest_num: int) -> Any:
        """``query`` (over the send log) narrowed to the entries tagged for ``dest_num``."""

    @abc.abstractmethod
    def _tagged_query(self, dest_num: int, client_name: str, after: int) -> Any:
        """``position, created_at`` of a stream's entries after ``after`` (no payloads)."""

    @abc.abstractmethod
    def _trim_send_log(self, batch_size: int, max_batches: int | None) -> int:
        """Retire the log entries every destination has passed, raising the trim marks.

        Returns how many entries went.
        """

    def _lock_stream(  # noqa: B027 (a hook: SQLite needs no lock)
        self, conn: Connection, source_id: str, client_name: str
    ) -> None:
        """Serialise appends to one receive queue (SQLite already serialises writers)."""

    def _copy_snapshot_rows(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        seq: int,
        payloads: Iterable[bytes | tuple[bytes, bytes | None]],
        slot: int,
    ) -> int | None:
        """Bulk-insert snapshot entries from ``seq`` on, into the snapshot's ``slot``;
        how many, or None if not supported."""
        return None

    def head_position_estimate(self) -> int:
        """The highest position assigned so far, read without waiting for transmitters."""
        return self.head_position()

    def analyze(self) -> None:  # noqa: B027 (a hook: PostgreSQL analyzes)
        """Refresh the planner's statistics of the send queue (a backend hook)."""


__all__ = ["StoreBase"]
