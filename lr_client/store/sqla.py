"""The SQLAlchemy queue store, shared by the SQLite and PostgreSQL backends.

Dialect-specific pieces (commit-ordered positions, the tag index, upserts)
are the few methods :mod:`lr_client.store.sqlite` and
:mod:`lr_client.store.postgres` override.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import and_, case, delete, func, insert, null, select, tuple_, update
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import OperationalError

from lr_client.errors import ProtocolError, SnapshotError, StoreUnavailableError
from lr_client.names import recv_queue_name, validate_name
from lr_client.records import (
    Backlog,
    Cursor,
    DropRecord,
    QueueInfo,
    RecvEntry,
    ReplicationType,
    SendEntry,
    SinkDrop,
    SinkProgress,
    SinkSnapshotState,
    SnapshotRequest,
    SnapshotStatus,
    StreamStop,
    WireEntry,
)
from lr_client.store import lifecycle
from lr_client.store import schema as s
from lr_client.store.contract import QueueStore

OPEN_STATUSES = (SnapshotStatus.REQUESTED, SnapshotStatus.RUNNING, SnapshotStatus.READY)


#: Bytes counted per entry on top of its payload when a read is bounded by bytes.
ENTRY_OVERHEAD = 32


class ByteCut:
    """The one byte-cut rule of every read bounded by bytes.

    Entries are taken in order while their payloads, plus ``ENTRY_OVERHEAD``
    each, stay within ``max_bytes`` (no limit if None); the first is always
    taken, so an entry larger than the limit travels alone.
    """

    __slots__ = ("count", "max_bytes", "total")

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.count = 0

    def take(self, payload_bytes: int) -> bool:
        """Count the next entry if it is within the limit; whether it is."""
        total = self.total + payload_bytes + ENTRY_OVERHEAD
        if self.max_bytes is not None and self.count and total > self.max_bytes:
            return False
        self.total, self.count = total, self.count + 1
        return True


def bytes_prefix(sizes: Iterable[int], max_bytes: int | None) -> int:
    """How many leading entries of these payload sizes one read within ``max_bytes`` takes."""
    cut = ByteCut(max_bytes)
    for size in sizes:
        if not cut.take(size):
            break
    return cut.count


def cut_to_bytes(rows: Sequence[Any], max_bytes: int | None) -> list[Any]:
    """The prefix of ``rows`` (each with a ``payload``) within ``max_bytes``; at least one."""
    return list(rows[: bytes_prefix((len(r.payload) for r in rows), max_bytes)])


class LogRange(list[SendEntry]):
    """Entries of one read, and whether the read reached the end of the queue."""

    def __init__(self, entries: Iterable[SendEntry], complete: bool) -> None:
        super().__init__(entries)
        self.complete = complete


def payload_size(payload: Any) -> Any:
    """A payload's size in bytes, read without loading the payload.

    SQLite takes a blob's length from its record header, PostgreSQL a bytea's
    from its (TOAST) header: neither reads the value itself.
    """
    return func.length(payload).label("size")


@functools.lru_cache(maxsize=64)
def sized(payload: Any, limit: int, max_bytes: int | None) -> tuple[Any, Any]:
    """The last two columns, ``size`` and ``inline``, of a read of at most ``limit`` entries.

    ``inline`` is the payload itself when it is small (at most ``max_bytes //
    limit``, so all such payloads of the read together stay within
    ``max_bytes``), else NULL: the payload is loaded afterwards (:func:`fill`)
    only if its entry is within the byte limit. So a read of small entries
    stays one query, and a read never loads more than twice its limit.
    """
    size = payload_size(payload)
    if max_bytes is None:
        return size, payload.label("inline")
    small = max(0, max_bytes // max(1, limit))
    return size, case((func.length(payload) <= small, payload), else_=null()).label("inline")


def within(rows: Sequence[Any], max_bytes: int | None) -> list[Any]:
    """The leading ``rows`` (read with :func:`sized`) one read takes, by the byte-cut rule."""
    if max_bytes is None or sum(r[-2] for r in rows) + ENTRY_OVERHEAD * len(rows) <= max_bytes:
        return list(rows)
    return list(rows[: bytes_prefix((r[-2] for r in rows), max_bytes)])


def fill(conn: Connection, rows: Sequence[Any], key: Any, payload: Any) -> list[tuple[Any, bytes]]:
    """Each of ``rows`` (key first, read with :func:`sized`) with its payload.

    Loads the payloads that were not inline, by their ``key`` column; stops
    before an entry deleted meanwhile (a trim, a superseded snapshot).
    """
    missing = [r[0] for r in rows if r[-1] is None]
    found: dict[Any, Any] = {}
    if missing:
        found = {k: v for k, v in conn.execute(select(key, payload).where(key.in_(missing)))}
    out: list[tuple[Any, bytes]] = []
    for r in rows:
        value = r[-1]
        if value is None:
            value = found.get(r[0])
            if value is None:
                break
        out.append((r, value if type(value) is bytes else bytes(value)))
    return out


class SQLAlchemyQueueStore(QueueStore):
    """Common implementation; use :func:`lr_client.store.open_store`."""

    dialect = "generic"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sites: dict[str, int] = {}
        self._site_names: dict[int, str] = {}
        self._queue_ids: dict[str, int] = {}
        #: snapshot_id -> (ordinal, part, seq) of the last entry a read returned.
        self._snapshot_marks: dict[str, tuple[int, int, int]] = {}

    # -- transactions -----------------------------------------------------------
    #: Isolation for trim: every read of the transaction sees one snapshot.
    consistent_isolation: str | None = None

    @contextmanager
    def write(self, consistent: bool = False) -> Iterator[Connection]:
        """A read-write transaction of the store's own."""
        try:
            with self.engine.connect() as conn:
                conn = conn.execution_options(lr_immediate=True)
                if consistent and self.consistent_isolation:
                    conn = conn.execution_options(isolation_level=self.consistent_isolation)
                with conn.begin():
                    yield conn
        except OperationalError as exc:
            raise StoreUnavailableError(str(exc.orig) if exc.orig else str(exc)) from exc

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        try:
            with self.engine.connect() as conn, conn.begin():
                yield conn
        except OperationalError as exc:
            raise StoreUnavailableError(str(exc.orig) if exc.orig else str(exc)) from exc

    # -- schema and sites ---------------------------------------------------------
    def create_schema(self) -> None:
        """Create or upgrade the schema (concurrency-safe; see :mod:`lifecycle`)."""
        lifecycle.upgrade_schema(self.engine)

    def check_schema(self) -> None:
        lifecycle.require_current(self.engine)

    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        wanted = [validate_name(x, "site id") for x in site_ids]
        known = self.site_numbers(refresh=True)
        new = [x for x in dict.fromkeys(wanted) if x not in known]
        if new:
            with self.write() as conn:
                self._insert_ignore(conn, s.sites, [{"site_id": x} for x in new], ["site_id"])
        return self.site_numbers(refresh=True)

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

    # -- dialect hooks ------------------------------------------------------------------
    #: The dialect's INSERT construct (it has ``on_conflict_do_nothing/update``).
    dialect_insert: Any = None

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

    def _insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[int]:
        raise NotImplementedError

    def _tagged_query(self, dest_num: int, client_name: str, after: int) -> Any:
        """``position, created_at`` of a stream's entries after ``after`` (no payloads)."""
        raise NotImplementedError

    def _trim_log(self, conn: Connection, batch_size: int) -> int:
        raise NotImplementedError

    def _release_tags(
        self, conn: Connection, dest_num: int, client_name: str, up_to: int | None
    ) -> None:
        """Backend hook run when a stream is dropped: release what it needs up to ``up_to``.

        ``up_to`` None: everything.
        """

    def _lock_stream(self, conn: Connection, source_id: str, client_name: str) -> None:
        """Serialise appends to one receive queue (SQLite already serialises writers)."""

    def head_position(self, conn: Connection | None = None) -> int:
        raise NotImplementedError

    def analyze(self) -> None:
        """Refresh the planner's statistics of the send queue (a backend hook)."""

    # -- send side ----------------------------------------------------------------------
    def append_log_entries(
        self, conn: Connection, client_name: str, messages: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[int]:
        if not messages:
            return []
        return self._insert_entries(conn, client_name, messages)

    def read_log_entries(
        self,
        destination: str,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
        up_to: int | None = None,
    ) -> list[SendEntry]:
        num = self.site_numbers().get(destination)
        if num is None:
            num = self.site_numbers(refresh=True).get(destination)
            if num is None:
                return []
        e = s.send_log_entries
        query = self._tagged_query(num, client_name, after)
        query = query.add_columns(*sized(e.c.payload, limit, max_bytes))
        if up_to is not None:
            query = query.where(e.c.position <= up_to)
        query = query.order_by(e.c.position).limit(limit)
        with self.read() as conn:
            rows = fill(
                conn, within(conn.execute(query).all(), max_bytes), e.c.position, e.c.payload
            )
        return [
            SendEntry(
                position=r.position,
                client_name=client_name,
                type=ReplicationType.LOG_ENTRY_SYNC,
                payload=payload,
                created_at=r.created_at,
            )
            for r, payload in rows
        ]

    def read_client_log(
        self, client_name: str, after: int, limit: int, max_bytes: int | None = None
    ) -> LogRange:
        e = s.send_log_entries
        query = (
            select(
                e.c.position, e.c.dest_nums, e.c.created_at, *sized(e.c.payload, limit, max_bytes)
            )
            .where(e.c.client_name == client_name, e.c.position > after)
            .order_by(e.c.position)
            .limit(limit)
        )
        with self.read() as conn:
            found = conn.execute(query).all()
            rows = fill(conn, within(found, max_bytes), e.c.position, e.c.payload)
        names: dict[Any, tuple[str, ...]] = {}  # few distinct destination sets per read

        def destinations(value: Any) -> tuple[str, ...]:
            key = value if isinstance(value, str) else tuple(value)
            got = names.get(key)
            if got is None:
                got = names[key] = tuple(self.site_name(n) for n in self._dest_nums_of(value))
            return got

        return LogRange(
            (
                SendEntry(
                    position=r.position,
                    client_name=client_name,
                    type=ReplicationType.LOG_ENTRY_SYNC,
                    payload=payload,
                    destinations=destinations(r.dest_nums),
                    created_at=r.created_at,
                )
                for r, payload in rows
            ),
            complete=len(found) < limit and len(rows) == len(found),
        )

    @staticmethod
    def _dest_nums_of(value: Any) -> list[int]:
        """The destination numbers stored with an entry (a backend's encoding)."""
        if isinstance(value, str):  # SQLite: ",1,5,"
            return [int(x) for x in value.split(",") if x]
        return [int(x) for x in value]

    def oldest_position(self, client_name: str | None = None) -> int | None:
        query = select(func.min(s.send_log_entries.c.position))
        if client_name is not None:
            query = query.where(s.send_log_entries.c.client_name == client_name)
        with self.read() as conn:
            value = conn.execute(query).scalar()
        return None if value is None else int(value)

    @staticmethod
    def _cursor(row: Row[Any]) -> Cursor:
        return Cursor(
            destination=row.destination,
            client_name=row.client_name,
            position=row.position,
            acked_at=row.acked_at,
            needs_snapshot=bool(row.needs_snapshot),
        )

    def get_cursor(self, destination: str, client_name: str) -> Cursor:
        with self.read() as conn:
            row = conn.execute(
                select(s.cursors).where(
                    s.cursors.c.destination == destination, s.cursors.c.client_name == client_name
                )
            ).first()
        return self._cursor(row) if row else Cursor(destination, client_name)

    def list_cursors(self) -> list[Cursor]:
        with self.read() as conn:
            rows = conn.execute(
                select(s.cursors).order_by(s.cursors.c.destination, s.cursors.c.client_name)
            ).all()
        return [self._cursor(r) for r in rows]

    def set_cursor(
        self,
        destination: str,
        client_name: str,
        position: int,
        *,
        needs_snapshot: bool | None = None,
    ) -> None:
        with self.write() as conn:
            self._set_cursor(conn, destination, client_name, position, needs_snapshot)

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

    def backlog(self, destination: str, client_name: str) -> Backlog:
        cursor = self.get_cursor(destination, client_name)
        num = self.site_numbers().get(destination)
        if num is None:
            return Backlog(destination, client_name)
        query = self._tagged_query(num, client_name, cursor.position)
        sub = query.add_columns(payload_size(s.send_log_entries.c.payload)).subquery()
        with self.read() as conn:
            row = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(sub.c.size), 0),
                    func.min(sub.c.created_at),
                )
            ).one()
        return Backlog(destination, client_name, int(row[0]), int(row[1]), row[2])

    # -- snapshots ----------------------------------------------------------------------
    @staticmethod
    def _snapshot(row: Row[Any]) -> SnapshotRequest:
        return SnapshotRequest(
            snapshot_id=row.snapshot_id,
            destination=row.destination,
            client_name=row.client_name,
            status=SnapshotStatus(row.status),
            base_position=row.base_position,
            reason=row.reason,
            rows_written=row.rows_written,
            entry_count=row.entry_count,
            shipped_position=row.shipped_position,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def request_snapshot(
        self, conn: Connection | None, destination: str, client_name: str, reason: str = ""
    ) -> str:
        validate_name(destination, "site id")
        validate_name(client_name, "client name")
        if conn is None:
            with self.write() as own:
                return self._request_snapshot(own, destination, client_name, reason)
        return self._request_snapshot(conn, destination, client_name, reason)

    def _request_snapshot(
        self, conn: Connection, destination: str, client_name: str, reason: str
    ) -> str:
        now = time.time()
        snapshot_id = uuid.uuid4().hex
        stale = (
            conn.execute(
                select(s.snapshots.c.snapshot_id).where(
                    s.snapshots.c.destination == destination,
                    s.snapshots.c.client_name == client_name,
                    s.snapshots.c.status.in_([x.value for x in OPEN_STATUSES]),
                )
            )
            .scalars()
            .all()
        )
        for old in stale:
            self._cancel(conn, old, f"superseded by {snapshot_id}")
        conn.execute(
            insert(s.snapshots).values(
                snapshot_id=snapshot_id,
                destination=destination,
                client_name=client_name,
                status=SnapshotStatus.REQUESTED.value,
                reason=reason,
                rows_written=0,
                shipped_position=0,
                created_at=now,
                updated_at=now,
            )
        )
        return snapshot_id

    def get_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        with self.read() as conn:
            row = conn.execute(
                select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).first()
        return self._snapshot(row) if row else None

    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
    ) -> list[SnapshotRequest]:
        query = select(s.snapshots)
        if destination is not None:
            query = query.where(s.snapshots.c.destination == destination)
        if client_name is not None:
            query = query.where(s.snapshots.c.client_name == client_name)
        if statuses is not None:
            query = query.where(s.snapshots.c.status.in_([x.value for x in statuses]))
        query = query.order_by(s.snapshots.c.created_at.desc())
        with self.read() as conn:
            return [self._snapshot(r) for r in conn.execute(query).all()]

    def open_snapshots(
        self, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        t = s.snapshots
        query = (
            select(t)
            .where(
                t.c.destination == destination,
                t.c.client_name.in_(list(client_names)),
                t.c.status.in_([x.value for x in OPEN_STATUSES]),
            )
            .order_by(t.c.created_at.desc())
        )
        found: dict[str, SnapshotRequest] = {}
        with self.read() as conn:
            for row in conn.execute(query).all():
                found.setdefault(row.client_name, self._snapshot(row))  # the newest
        return found

    def update_snapshot(
        self,
        snapshot_id: str,
        *,
        expect: Sequence[SnapshotStatus] | None = None,
        **values: object,
    ) -> bool:
        with self.write() as conn:
            return self._update_snapshot(conn, snapshot_id, expect, values)

    def _update_snapshot(
        self,
        conn: Connection,
        snapshot_id: str,
        expect: Sequence[SnapshotStatus] | None,
        values: dict[str, object],
    ) -> bool:
        values = {k: (v.value if isinstance(v, SnapshotStatus) else v) for k, v in values.items()}
        values["updated_at"] = time.time()
        query = update(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
        if expect is not None:
            query = query.where(s.snapshots.c.status.in_([x.value for x in expect]))
        return bool(conn.execute(query.values(**values)).rowcount)

    def start_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        with self.write() as conn:
            base = self.head_position(conn)
            ok = self._update_snapshot(
                conn,
                snapshot_id,
                [SnapshotStatus.REQUESTED],
                {"status": SnapshotStatus.RUNNING, "base_position": base},
            )
            if not ok:
                return None
            row = conn.execute(
                select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).one()
        return self._snapshot(row)

    def heartbeat_snapshot(self, snapshot_id: str) -> bool:
        return self.update_snapshot(snapshot_id, expect=[SnapshotStatus.RUNNING])

    def fail_stalled_snapshot(self, snapshot_id: str, silent_since: float, reason: str) -> bool:
        t = s.snapshots
        with self.write() as conn:
            failed = conn.execute(
                update(t)
                .where(
                    t.c.snapshot_id == snapshot_id,
                    t.c.status == SnapshotStatus.RUNNING.value,
                    t.c.updated_at < silent_since,
                )
                .values(status=SnapshotStatus.FAILED.value, reason=reason, updated_at=time.time())
            ).rowcount
            if failed:
                conn.execute(
                    delete(s.send_snapsync).where(s.send_snapsync.c.snapshot_id == snapshot_id)
                )
        return bool(failed)

    def _require_writable(self, conn: Connection, snapshot_id: str) -> None:
        # A shared row lock: a concurrent cancel waits for this write, or this
        # write sees the cancel, so no entry of a cancelled snapshot survives it.
        status = conn.execute(
            select(s.snapshots.c.status)
            .where(s.snapshots.c.snapshot_id == snapshot_id)
            .with_for_update(read=True)
        ).scalar()
        if status != SnapshotStatus.RUNNING.value:
            raise SnapshotError(f"snapshot {snapshot_id} is {status or 'unknown'}, not running")

    def write_snapshot_entries(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        payloads: Sequence[bytes],
        first_seq: int = 0,
    ) -> int:
        self._require_writable(conn, snapshot_id)
        t = s.send_snapsync
        conn.execute(
            delete(t).where(
                t.c.snapshot_id == snapshot_id,
                t.c.part == part,
                t.c.seq >= first_seq,
                t.c.seq < first_seq + len(payloads),
            )
        )
        if payloads:
            conn.execute(
                insert(t),
                [
                    {
                        "snapshot_id": snapshot_id,
                        "part": part,
                        "seq": first_seq + i,
                        "type": int(ReplicationType.SNAPSHOT_SYNC),
                        "payload": p,
                    }
                    for i, p in enumerate(payloads)
                ],
            )
        return len(payloads)

    def count_snapshot_entries(self, snapshot_id: str) -> int:
        t = s.send_snapsync
        with self.read() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(
                        t.c.snapshot_id == snapshot_id,
                        t.c.type == int(ReplicationType.SNAPSHOT_SYNC),
                    )
                ).scalar_one()
            )

    def set_snapshot_progress(self, snapshot_id: str, rows_written: int) -> None:
        self.update_snapshot(
            snapshot_id, expect=[SnapshotStatus.RUNNING], rows_written=rows_written
        )

    def finish_snapshot(self, snapshot_id: str) -> int:
        t = s.send_snapsync
        with self.write() as conn:
            self._require_writable(conn, snapshot_id)
            count = int(
                conn.execute(
                    select(func.count()).where(
                        t.c.snapshot_id == snapshot_id,
                        t.c.type == int(ReplicationType.SNAPSHOT_SYNC),
                    )
                ).scalar_one()
            )
            conn.execute(
                delete(t).where(
                    t.c.snapshot_id == snapshot_id,
                    t.c.type == int(ReplicationType.LAST_FULL_SYNC_ENTRY),
                )
            )
            conn.execute(
                insert(t).values(
                    snapshot_id=snapshot_id,
                    part=-1,
                    seq=0,
                    type=int(ReplicationType.LAST_FULL_SYNC_ENTRY),
                    payload=str(count).encode(),
                )
            )
            self._update_snapshot(
                conn,
                snapshot_id,
                [SnapshotStatus.RUNNING],
                {"status": SnapshotStatus.READY, "entry_count": count, "rows_written": count},
            )
        return count

    def _cancel(self, conn: Connection, snapshot_id: str, reason: str) -> bool:
        ok = self._update_snapshot(
            conn,
            snapshot_id,
            OPEN_STATUSES,
            {"status": SnapshotStatus.CANCELLED, "reason": reason},
        )
        conn.execute(delete(s.send_snapsync).where(s.send_snapsync.c.snapshot_id == snapshot_id))
        return ok

    def cancel_snapshot(self, snapshot_id: str, reason: str = "cancelled") -> bool:
        with self.write() as conn:
            return self._cancel(conn, snapshot_id, reason)

    def complete_snapshot(self, snapshot_id: str) -> bool:
        """READY -> COMPLETED: the sink has it all; release its entries."""
        with self.write() as conn:
            ok = self._update_snapshot(
                conn, snapshot_id, [SnapshotStatus.READY], {"status": SnapshotStatus.COMPLETED}
            )
            conn.execute(
                delete(s.send_snapsync).where(s.send_snapsync.c.snapshot_id == snapshot_id)
            )
        return ok

    def read_snapshot_entries(
        self, snapshot_id: str, after: int, limit: int, max_bytes: int | None = None
    ) -> list[SendEntry]:
        t = s.send_snapsync
        cols = (t.c.position, t.c.type, t.c.part, t.c.seq, *sized(t.c.payload, limit, max_bytes))
        with self.read() as conn:
            req = conn.execute(
                select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).first()
            if req is None or req.status != SnapshotStatus.READY.value:
                return []
            # Ordinals: the entries by (part, seq), then the end marker (part -1). A READY
            # snapshot no longer changes, so where the previous read of this snapshot
            # ended is a key to continue from: each read is an index range, not an OFFSET
            # that rescans everything already shipped.
            mark = self._snapshot_marks.get(snapshot_id)
            if after == 0 or (mark is not None and mark[0] == after):
                query = select(*cols).where(t.c.snapshot_id == snapshot_id)
                if after:
                    assert mark is not None  # its part is >= 0: the end marker stays out
                    query = query.where(tuple_(t.c.part, t.c.seq) > tuple_(mark[1], mark[2]))
                else:
                    query = query.where(t.c.part >= 0)
                rows = list(conn.execute(query.order_by(t.c.part, t.c.seq).limit(limit)).all())
                if len(rows) < limit:
                    end = select(*cols).where(t.c.snapshot_id == snapshot_id, t.c.part < 0)
                    rows += conn.execute(end.limit(limit - len(rows))).all()  # the end marker
            else:  # resuming elsewhere (a reconnect): find the place once
                rows = list(
                    conn.execute(
                        select(*cols)
                        .where(t.c.snapshot_id == snapshot_id)
                        .order_by((t.c.part < 0), t.c.part, t.c.seq)
                        .offset(after)
                        .limit(limit)
                    ).all()
                )
            rows = within(rows, max_bytes)
            filled = fill(conn, rows, t.c.position, t.c.payload)
        if len(filled) < len(rows):  # cancelled meanwhile
            return []
        if rows and rows[-1].part >= 0:
            self._snapshot_marks[snapshot_id] = (after + len(rows), rows[-1].part, rows[-1].seq)
        else:
            self._snapshot_marks.pop(snapshot_id, None)
        return [
            SendEntry(
                position=after + i + 1,
                client_name=req.client_name,
                type=ReplicationType(r.type),
                payload=payload,
                snapshot_id=snapshot_id,
            )
            for i, (r, payload) in enumerate(filled)
        ]

    # -- trim and retention --------------------------------------------------------------
    def trim(self, batch_size: int = 5000, max_batches: int | None = None) -> int:
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            # One snapshot for the acknowledgements read and the delete, so an
            # entry committed meanwhile is never judged by stale acknowledgements.
            with self.write(consistent=True) as conn:
                n = self._trim_log(conn, batch_size)
            total += n
            batches += 1
            if n < batch_size:
                break
        with self.write() as conn:
            done = select(s.snapshots.c.snapshot_id).where(
                s.snapshots.c.status.in_(
                    [
                        SnapshotStatus.COMPLETED.value,
                        SnapshotStatus.CANCELLED.value,
                        SnapshotStatus.FAILED.value,
                    ]
                )
            )
            total += (
                conn.execute(
                    delete(s.send_snapsync).where(s.send_snapsync.c.snapshot_id.in_(done))
                ).rowcount
                or 0
            )
        return total

    def log_streams(self, after: int = 0) -> tuple[set[tuple[str, str]], int]:
        """The (destination, client) pairs of the send queue's entries after ``after``.

        Also the highest position read (``after`` when there is none), so a
        caller can read only what was appended since: positions are assigned
        in commit order, none can appear below it later.
        """
        e = s.send_log_entries
        with self.read() as conn:
            top = conn.execute(select(func.max(e.c.position)).where(e.c.position > after)).scalar()
            if top is None:
                return set(), after
            rows = conn.execute(
                select(e.c.client_name, e.c.dest_nums)
                .where(e.c.position > after, e.c.position <= top)
                .distinct()
            ).all()
        pairs = {
            (self.site_name(num), str(r.client_name))
            for r in rows
            for num in self._dest_nums_of(r.dest_nums)
        }
        return pairs, int(top)

    @staticmethod
    def _trim_sites(conn: Connection) -> dict[str, int]:
        """Every registered site, read in the trim's transaction.

        Not this store's cache: an application may have registered a
        destination since, and its entries must be judged by its tags too.
        """
        rows = conn.execute(select(s.sites.c.site_id, s.sites.c.site_num)).all()
        return {r.site_id: r.site_num for r in rows}

    def _acked_positions(self, conn: Connection) -> dict[tuple[int, str], int]:
        """{(site number, client): position below which the stream needs nothing}."""
        rows = conn.execute(select(s.cursors)).all()
        nums = self._trim_sites(conn)
        out: dict[tuple[int, str], int] = {}
        for r in rows:
            if r.destination in nums:
                out[(nums[r.destination], r.client_name)] = r.position
        # A stream with an open snapshot needs everything after its base
        # position: log entries resume from there once the snapshot is shipped.
        # A dropped stream needs nothing until such a base is fixed.
        bases = {
            (r.destination, r.client_name): r.base_position
            for r in conn.execute(
                select(s.snapshots).where(
                    s.snapshots.c.status.in_([x.value for x in OPEN_STATUSES]),
                    s.snapshots.c.base_position.is_not(None),
                )
            ).all()
        }
        for r in conn.execute(select(s.drops)).all():
            if r.destination in nums:
                out[(nums[r.destination], r.client_name)] = 2**62
        for (dest, client), base in bases.items():
            if dest in nums:
                key = (nums[dest], client)
                out[key] = min(out.get(key, 0), base)
        return out

    def drop_stream(
        self,
        destination: str,
        client_name: str,
        reason: str,
        first_dropped_position: int | None = None,
    ) -> DropRecord | None:
        num = self.site_numbers().get(destination)
        if num is None:
            return None
        with self.write() as conn:
            existing = conn.execute(
                select(s.drops).where(
                    s.drops.c.destination == destination, s.drops.c.client_name == client_name
                )
            ).first()
            if existing is not None:
                return self._drop(existing)
            cursor = (
                conn.execute(
                    select(s.cursors.c.position).where(
                        s.cursors.c.destination == destination,
                        s.cursors.c.client_name == client_name,
                    )
                ).scalar()
                or 0
            )
            now = time.time()
            first = cursor + 1 if first_dropped_position is None else first_dropped_position
            row = {
                "destination": destination,
                "client_name": client_name,
                "first_dropped_position": first,
                "dropped_at": now,
                "reason": reason,
            }
            conn.execute(insert(s.drops).values(**row))
            self._set_cursor(conn, destination, client_name, cursor, True)
            # An open snapshot whose base is fixed still needs the entries after it:
            # log entries resume from there once the snapshot is shipped.
            base = conn.execute(
                select(func.min(s.snapshots.c.base_position)).where(
                    s.snapshots.c.destination == destination,
                    s.snapshots.c.client_name == client_name,
                    s.snapshots.c.status.in_([x.value for x in OPEN_STATUSES]),
                )
            ).scalar()
            self._release_tags(conn, num, client_name, None if base is None else int(base))
        return DropRecord(destination, client_name, first, now, reason)

    @staticmethod
    def _drop(row: Row[Any]) -> DropRecord:
        return DropRecord(
            row.destination, row.client_name, row.first_dropped_position, row.dropped_at, row.reason
        )

    def list_drops(self, destination: str | None = None) -> list[DropRecord]:
        query = select(s.drops)
        if destination is not None:
            query = query.where(s.drops.c.destination == destination)
        with self.read() as conn:
            return [self._drop(r) for r in conn.execute(query).all()]

    def clear_drop(self, destination: str, client_name: str) -> None:
        with self.write() as conn:
            conn.execute(
                delete(s.drops).where(
                    s.drops.c.destination == destination, s.drops.c.client_name == client_name
                )
            )

    # -- trim marks and stopped streams ---------------------------------------------------
    def _record_trim_marks(self, conn: Connection, marks: dict[tuple[int, str], int]) -> None:
        """Raise the trim marks of the streams whose entries were just deleted."""
        if not marks:
            return
        t = s.trim_marks
        for (num, client), position in sorted(marks.items()):
            stmt = self.dialect_insert(t).values(
                dest_num=num, client_name=client, trimmed_through=position
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=["dest_num", "client_name"],
                set_={
                    "trimmed_through": case(
                        (t.c.trimmed_through > stmt.excluded.trimmed_through, t.c.trimmed_through),
                        else_=stmt.excluded.trimmed_through,
                    )
                },
            )
            conn.execute(stmt)

    def trimmed_through(self, destination: str, client_name: str) -> int:
        """The highest position trim deleted among the entries tagged for the stream (0: none).

        Every entry of the stream above it is still stored.
        """
        num = self.site_numbers().get(destination)
        if num is None:
            return 0
        t = s.trim_marks
        with self.read() as conn:
            value = conn.execute(
                select(t.c.trimmed_through).where(
                    t.c.dest_num == num, t.c.client_name == client_name
                )
            ).scalar()
        return int(value or 0)

    @staticmethod
    def _stop(row: Row[Any]) -> StreamStop:
        return StreamStop(
            row.destination,
            row.client_name,
            row.reason,
            int(row.resume_after),
            float(row.stopped_at),
            None if row.accepted_at is None else float(row.accepted_at),
            None if row.accepted_through is None else int(row.accepted_through),
            None if row.resumed_at is None else float(row.resumed_at),
        )

    def stop_stream(
        self, destination: str, client_name: str, reason: str, resume_after: int
    ) -> bool:
        """Record that the stream stopped (True), or keep a stop still open (False).

        The record of an earlier loss, accepted and resumed, is replaced.
        """
        t = s.stream_stops
        with self.write() as conn:
            found = conn.execute(
                select(t.c.resumed_at).where(
                    t.c.destination == destination, t.c.client_name == client_name
                )
            ).first()
            if found is not None:
                if found.resumed_at is None:
                    return False
                conn.execute(
                    delete(t).where(t.c.destination == destination, t.c.client_name == client_name)
                )
            conn.execute(
                insert(s.stream_stops).values(
                    destination=destination,
                    client_name=client_name,
                    reason=reason,
                    resume_after=resume_after,
                    stopped_at=time.time(),
                    accepted_at=None,
                    accepted_through=None,
                    resumed_at=None,
                )
            )
        return True

    def get_stream_stop(self, destination: str, client_name: str) -> StreamStop | None:
        with self.read() as conn:
            row = conn.execute(
                select(s.stream_stops).where(
                    s.stream_stops.c.destination == destination,
                    s.stream_stops.c.client_name == client_name,
                )
            ).first()
        return self._stop(row) if row else None

    def list_stream_stops(self) -> list[StreamStop]:
        with self.read() as conn:
            rows = conn.execute(
                select(s.stream_stops).order_by(
                    s.stream_stops.c.destination, s.stream_stops.c.client_name
                )
            ).all()
        return [self._stop(r) for r in rows]

    def accept_stream_loss(self, destination: str, client_name: str) -> StreamStop | None:
        """Mark a stopped stream's loss accepted; None if the stream is not stopped."""
        t, m = s.stream_stops, s.trim_marks
        num = self.site_numbers(refresh=True).get(destination, -1)
        with self.write() as conn:
            mark = conn.execute(
                select(m.c.trimmed_through).where(
                    m.c.dest_num == num, m.c.client_name == client_name
                )
            ).scalar()
            done = conn.execute(
                update(t)
                .where(
                    t.c.destination == destination,
                    t.c.client_name == client_name,
                    t.c.accepted_at.is_(None),
                )
                .values(accepted_at=time.time(), accepted_through=int(mark or 0))
            ).rowcount
            row = conn.execute(
                select(t).where(t.c.destination == destination, t.c.client_name == client_name)
            ).first()
        return self._stop(row) if done and row else None

    def mark_stream_resumed(self, destination: str, client_name: str) -> None:
        """The sink was told of an accepted loss: the stop is only a record now."""
        t = s.stream_stops
        with self.write() as conn:
            conn.execute(
                update(t)
                .where(
                    t.c.destination == destination,
                    t.c.client_name == client_name,
                    t.c.accepted_at.is_not(None),
                )
                .values(resumed_at=time.time())
            )

    def clear_stream_stop(self, destination: str, client_name: str) -> None:
        with self.write() as conn:
            conn.execute(
                delete(s.stream_stops).where(
                    s.stream_stops.c.destination == destination,
                    s.stream_stops.c.client_name == client_name,
                )
            )

    # -- receive side -------------------------------------------------------------------
    def apply_drop_notice(
        self,
        source_id: str,
        client_name: str,
        notice_id: str,
        first_dropped_position: int,
        reason: str,
    ) -> bool:
        """Queue a drop notice for the listener, once per ``notice_id``; False if a repeat.

        The stream's position goes back to just before ``first_dropped_position``
        if it was further: what follows is sent again from there.
        """
        t = s.sink_drops
        with self.write() as conn:
            self._lock_stream(conn, source_id, client_name)
            last = conn.execute(
                select(t.c.notice_id).where(
                    t.c.source_id == source_id, t.c.client_name == client_name
                )
            ).scalar()
            if last == notice_id:
                return False
            qid = self._ensure_queue(conn, source_id, client_name)
            row = self._progress_row(conn, source_id, client_name)
            progress = self._progress(row) if row else SinkProgress(source_id, client_name)
            if progress.snapshot_state == SinkSnapshotState.ONGOING and progress.snapshot_id:
                # An unfinished snapshot is dead once its stream was dropped: what
                # follows is a new full sync or, after an accepted loss, log entries.
                r = s.recv_entries
                conn.execute(
                    delete(r).where(r.c.queue_id == qid, r.c.snapshot_id == progress.snapshot_id)
                )
                progress = dataclasses.replace(
                    progress,
                    snapshot_state=SinkSnapshotState.NONE,
                    snapshot_id="",
                    snapshot_position=0,
                )
                self._save_progress(conn, progress)
            entry = WireEntry(
                first_dropped_position,
                ReplicationType.STREAM_DROPPED,
                reason.encode(),
                snapshot_id=notice_id,
            )
            self._append_recv(conn, qid, [entry])
            self._upsert(
                conn,
                t,
                {
                    "source_id": source_id,
                    "client_name": client_name,
                    "notice_id": notice_id,
                    "first_dropped_position": first_dropped_position,
                    "reason": reason,
                    "received_at": time.time(),
                },
                ["source_id", "client_name"],
            )
            rewind = max(first_dropped_position - 1, 0)
            if progress.last_position > rewind:
                self._save_progress(
                    conn,
                    SinkProgress(
                        source_id,
                        client_name,
                        last_position=rewind,
                        snapshot_state=progress.snapshot_state,
                        snapshot_id=progress.snapshot_id,
                        snapshot_position=progress.snapshot_position,
                        entries_received=progress.entries_received,
                    ),
                )
        return True

    def list_sink_drops(self) -> list[SinkDrop]:
        t = s.sink_drops
        with self.read() as conn:
            rows = conn.execute(select(t).order_by(t.c.source_id, t.c.client_name)).all()
        return [
            SinkDrop(
                r.source_id,
                r.client_name,
                r.notice_id,
                int(r.first_dropped_position),
                r.reason,
                float(r.received_at),
            )
            for r in rows
        ]

    @staticmethod
    def _progress(row: Row[Any]) -> SinkProgress:
        return SinkProgress(
            source_id=row.source_id,
            client_name=row.client_name,
            last_position=row.last_position,
            snapshot_state=SinkSnapshotState(row.snapshot_state),
            snapshot_id=row.snapshot_id,
            snapshot_position=row.snapshot_position,
            entries_received=row.entries_received,
            updated_at=row.updated_at,
        )

    def sink_progress(self, source_id: str, client_name: str) -> SinkProgress:
        with self.read() as conn:
            row = self._progress_row(conn, source_id, client_name)
        return self._progress(row) if row else SinkProgress(source_id, client_name)

    @staticmethod
    def _progress_row(conn: Connection, source_id: str, client_name: str) -> Row[Any] | None:
        return conn.execute(
            select(s.sink_progress).where(
                s.sink_progress.c.source_id == source_id,
                s.sink_progress.c.client_name == client_name,
            )
        ).first()

    def list_sink_progress(self) -> list[SinkProgress]:
        with self.read() as conn:
            rows = conn.execute(
                select(s.sink_progress).order_by(
                    s.sink_progress.c.source_id, s.sink_progress.c.client_name
                )
            ).all()
        return [self._progress(r) for r in rows]

    def _ensure_queue(self, conn: Connection, source_id: str, client_name: str) -> int:
        name = recv_queue_name(client_name, source_id)
        if name in self._queue_ids:  # registrations are never removed
            return self._queue_ids[name]
        qid = conn.execute(
            select(s.queue_registry.c.queue_id).where(s.queue_registry.c.queue_name == name)
        ).scalar()
        if qid is None:
            self._insert_ignore(
                conn,
                s.queue_registry,
                [
                    {
                        "queue_name": name,
                        "client_name": client_name,
                        "source_id": source_id,
                        "created_at": time.time(),
                    }
                ],
                ["queue_name"],
            )
            qid = conn.execute(
                select(s.queue_registry.c.queue_id).where(s.queue_registry.c.queue_name == name)
            ).scalar_one()
        self._queue_ids[name] = int(qid)
        return int(qid)

    def _save_progress(self, conn: Connection, progress: SinkProgress) -> None:
        self._upsert(
            conn,
            s.sink_progress,
            {
                "source_id": progress.source_id,
                "client_name": progress.client_name,
                "last_position": progress.last_position,
                "snapshot_state": int(progress.snapshot_state),
                "snapshot_id": progress.snapshot_id,
                "snapshot_position": progress.snapshot_position,
                "entries_received": progress.entries_received,
                "updated_at": time.time(),
            },
            ["source_id", "client_name"],
        )

    def _append_recv(self, conn: Connection, queue_id: int, entries: Sequence[WireEntry]) -> None:
        now = time.time()
        conn.execute(
            insert(s.recv_entries),
            [
                {
                    "queue_id": queue_id,
                    "type": int(e.type),
                    "source_position": e.position,
                    "snapshot_id": e.snapshot_id,
                    "snapshot_count": e.snapshot_count,
                    "payload": e.payload,
                    "received_at": now,
                }
                for e in entries
            ],
        )

    def apply_log_batch(
        self,
        source_id: str,
        client_name: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        with self.write() as conn:
            self._lock_stream(conn, source_id, client_name)
            row = self._progress_row(conn, source_id, client_name)
            progress = self._progress(row) if row else SinkProgress(source_id, client_name)
            if previous_position is not None and previous_position > progress.last_position:
                raise ProtocolError(
                    f"gap: batch follows position {previous_position}, "
                    f"sink has {progress.last_position}"
                )
            fresh = [e for e in entries if e.position > progress.last_position]
            if not fresh:
                return False, progress.last_position
            qid = self._ensure_queue(conn, source_id, client_name)
            self._append_recv(conn, qid, fresh)
            last = fresh[-1].position
            self._save_progress(
                conn,
                SinkProgress(
                    source_id,
                    client_name,
                    last_position=last,
                    snapshot_state=progress.snapshot_state,
                    snapshot_id=progress.snapshot_id,
                    snapshot_position=progress.snapshot_position,
                    entries_received=progress.entries_received + len(fresh),
                ),
            )
        return True, last

    def apply_snapshot_batch(
        self,
        source_id: str,
        client_name: str,
        snapshot_id: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        with self.write() as conn:
            self._lock_stream(conn, source_id, client_name)
            row = self._progress_row(conn, source_id, client_name)
            progress = self._progress(row) if row else SinkProgress(source_id, client_name)
            same = progress.snapshot_id == snapshot_id
            if previous_position is not None:
                if same and previous_position > progress.snapshot_position:
                    raise ProtocolError("gap in snapshot batch")
                if not same and previous_position != 0:
                    raise ProtocolError("a new snapshot must start at its first entry")
            qid = self._ensure_queue(conn, source_id, client_name)
            if not same:
                # A new snapshot supersedes what is still queued of an unfinished
                # one. A completed one stays whole: the log entries replayed after
                # its base follow it in the queue and need its end before them.
                if progress.snapshot_id and progress.snapshot_state == SinkSnapshotState.ONGOING:
                    conn.execute(
                        delete(s.recv_entries).where(
                            s.recv_entries.c.queue_id == qid,
                            s.recv_entries.c.snapshot_id == progress.snapshot_id,
                        )
                    )
                progress = SinkProgress(
                    source_id,
                    client_name,
                    last_position=progress.last_position,
                    snapshot_state=SinkSnapshotState.ONGOING,
                    snapshot_id=snapshot_id,
                    snapshot_position=0,
                    entries_received=progress.entries_received,
                )
            elif progress.snapshot_state == SinkSnapshotState.COMPLETED:
                return False, progress.snapshot_position
            fresh = [e for e in entries if e.position > progress.snapshot_position]
            if not fresh:
                self._save_progress(conn, progress)
                return False, progress.snapshot_position
            self._append_recv(conn, qid, fresh)
            last = fresh[-1]
            done = last.type == ReplicationType.LAST_FULL_SYNC_ENTRY
            # After the end marker, log entries resume after the snapshot's base
            # position, even those already received: the snapshot may have
            # overwritten their effect, so they must be applied again after it.
            base = last.base_position if done else progress.last_position
            self._save_progress(
                conn,
                SinkProgress(
                    source_id,
                    client_name,
                    last_position=base,
                    snapshot_state=SinkSnapshotState.COMPLETED
                    if done
                    else SinkSnapshotState.ONGOING,
                    snapshot_id=snapshot_id,
                    snapshot_position=last.position,
                    entries_received=progress.entries_received + len(fresh),
                ),
            )
        return True, last.position

    # -- subscriber ---------------------------------------------------------------------
    def list_queues(self, client_name: str | None = None) -> list[QueueInfo]:
        query = select(s.queue_registry).order_by(s.queue_registry.c.queue_id)
        if client_name is not None:
            query = query.where(s.queue_registry.c.client_name == client_name)
        with self.read() as conn:
            rows = conn.execute(query).all()
        return [QueueInfo(r.queue_id, r.queue_name, r.client_name, r.source_id) for r in rows]

    def read_queue(self, conn: Connection, queue_id: int, limit: int) -> list[RecvEntry]:
        t = s.recv_entries
        reg = s.queue_registry
        rows = conn.execute(
            select(t, reg.c.source_id, reg.c.client_name)
            .join(reg, reg.c.queue_id == t.c.queue_id)
            .where(t.c.queue_id == queue_id)
            .order_by(t.c.seq)
            .limit(limit)
        ).all()
        return [
            RecvEntry(
                seq=r.seq,
                queue_id=r.queue_id,
                source_id=r.source_id,
                client_name=r.client_name,
                source_position=r.source_position,
                type=ReplicationType(r.type),
                payload=bytes(r.payload),
                snapshot_id=r.snapshot_id,
                snapshot_count=r.snapshot_count,
            )
            for r in rows
        ]

    def delete_entries(self, conn: Connection, seqs: Sequence[int]) -> int:
        if not seqs:
            return 0
        lo, hi = min(seqs), max(seqs)
        t = s.recv_entries
        if hi - lo + 1 == len(seqs):
            query = delete(t).where(and_(t.c.seq >= lo, t.c.seq <= hi))
        else:
            query = delete(t).where(t.c.seq.in_(list(seqs)))
        return int(conn.execute(query).rowcount or 0)

    # -- flow control (written by the server's retention policy) ------------------------
    def set_flow_state(self, client_name: str, backpressure: bool, slow: Sequence[str]) -> None:
        with self.write() as conn:
            self._upsert(
                conn,
                s.flow_control,
                {
                    "client_name": client_name,
                    "backpressure": backpressure,
                    "slow_destinations": ",".join(sorted(slow)),
                    "updated_at": time.time(),
                },
                ["client_name"],
            )

    def flow_state(self, client_name: str) -> tuple[bool, list[str]]:
        """(backpressure on, slow destinations) for a client."""
        with self.read() as conn:
            row = conn.execute(
                select(s.flow_control).where(s.flow_control.c.client_name == client_name)
            ).first()
        if row is None:
            return False, []
        return bool(row.backpressure), [x for x in row.slow_destinations.split(",") if x]

    # -- session status (written by running sender sessions) ----------------------------
    def save_session_status(
        self,
        destination: str,
        state: str,
        *,
        connected: bool,
        inflight_batches: int,
        inflight_bytes: int,
        last_error: str = "",
    ) -> None:
        with self.write() as conn:
            self._upsert(
                conn,
                s.session_status,
                {
                    "destination": destination,
                    "state": state,
                    "connected": connected,
                    "inflight_batches": inflight_batches,
                    "inflight_bytes": inflight_bytes,
                    "last_error": last_error[:2000],
                    "updated_at": time.time(),
                },
                ["destination"],
            )

    def list_session_status(self) -> list[dict[str, Any]]:
        with self.read() as conn:
            rows = conn.execute(
                select(s.session_status).order_by(s.session_status.c.destination)
            ).all()
        return [dict(r._mapping) for r in rows]

    def queue_depth(self, queue_id: int) -> int:
        with self.read() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(s.recv_entries.c.queue_id == queue_id)
                ).scalar_one()
            )
