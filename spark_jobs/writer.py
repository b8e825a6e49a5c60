"""Executor side of the snapshot job: each partition writes its own entries.

Partition ``p`` writes its rows as entries ``(snapshot_id, part=p, seq=i)``,
``i`` the row's index in the partition, in chunks of ``chunk_rows``, one
transaction per chunk. Each chunk transaction

1. checks the snapshot is still RUNNING, holding a share lock on its request
   row (PostgreSQL) or the database's write lock (SQLite) until commit, so a
   cancellation either comes first (and the chunk writes nothing) or waits
   for the chunk and then deletes it with the rest: a cancelled snapshot keeps
   no entries;
2. deletes whatever an earlier attempt left in the chunk's seq range and
   writes the chunk (PostgreSQL: binary ``COPY``; otherwise through the
   store's ``write_snapshot_entries``);
3. on the partition's last chunk, deletes entries past its end.

So a retried task, or the whole job run again for the same snapshot, leaves
exactly one entry per row, and the unique key ``(snapshot_id, part, seq)``
turns any overlap of two live attempts into an error rather than a duplicate.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import and_, delete, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import NullPool

from lr_client.errors import InvalidPayloadError, PayloadTooLargeError, SnapshotError
from lr_client.records import ReplicationType, SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store import schema as s
from spark_jobs.encoders import Encoder, arrow_json, encode_json_dict

if TYPE_CHECKING:
    from pyspark.sql import Row

#: Rows per chunk transaction when the job is not told otherwise.
DEFAULT_CHUNK_ROWS = {"postgresql": 50_000, "sqlite": 20_000}
#: Write methods: binary COPY (PostgreSQL only) or the store's own inserts.
METHODS = ("copy", "store")


def _payload(value: object, limit: int) -> bytes:
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise InvalidPayloadError(f"encoder must return bytes, got {type(value).__name__}")
    if len(value) > limit:
        raise PayloadTooLargeError(f"encoded row of {len(value)} bytes exceeds the limit {limit}")
    return value


def _not_running(snapshot_id: str, status: object) -> SnapshotError:
    return SnapshotError(f"snapshot {snapshot_id} is {status or 'unknown'}, not running")


class _Sink(Protocol):
    def write_part(self, part: int, payloads: Iterator[bytes], chunk_rows: int) -> int: ...

    def close(self) -> None: ...


class _StoreSink:
    """Any backend, through :meth:`SQLAlchemyQueueStore.write_snapshot_entries`."""

    def __init__(self, store: SQLAlchemyQueueStore, snapshot_id: str) -> None:
        self.store = store
        self.snapshot_id = snapshot_id

    def _lock(self, conn: Connection) -> None:
        status = conn.execute(
            select(s.snapshots.c.status)
            .where(s.snapshots.c.snapshot_id == self.snapshot_id)
            .with_for_update(read=True)
        ).scalar()
        if status != SnapshotStatus.RUNNING.value:
            raise _not_running(self.snapshot_id, status)

    def write_part(self, part: int, payloads: Iterator[bytes], chunk_rows: int) -> int:
        t = s.send_snapsync
        seq = 0
        while True:
            chunk = list(itertools.islice(payloads, chunk_rows))  # encoded outside the txn
            with self.store.write() as conn:
                self._lock(conn)
                self.store.write_snapshot_entries(conn, self.snapshot_id, part, chunk, seq)
                if len(chunk) < chunk_rows:
                    conn.execute(
                        delete(t).where(
                            t.c.snapshot_id == self.snapshot_id,
                            t.c.part == part,
                            t.c.seq >= seq + len(chunk),
                        )
                    )
            seq += len(chunk)
            if len(chunk) < chunk_rows:
                return seq

    def close(self) -> None:
        self.store.engine.dispose()


class _CopySink:
    """PostgreSQL: binary ``COPY`` straight into ``lrq_send_snapsync``, streamed."""

    def __init__(self, database_url: str, snapshot_id: str) -> None:
        import psycopg
        from psycopg import sql

        url = make_url(database_url).set(drivername="postgresql")
        self.conn = psycopg.connect(
            url.render_as_string(hide_password=False),
            autocommit=True,
            application_name=f"lr-snapshot-{snapshot_id[:12]}",  # visible in pg_stat_activity
        )
        self.snapshot_id = snapshot_id
        entries = sql.Identifier(s.send_snapsync.name)
        self.lock_sql = sql.SQL("SELECT status FROM {} WHERE snapshot_id = %s FOR SHARE").format(
            sql.Identifier(s.snapshots.name)
        )
        self.clear_sql = sql.SQL(
            "DELETE FROM {} WHERE snapshot_id = %s AND part = %s AND seq >= %s AND seq < %s"
        ).format(entries)
        self.tail_sql = sql.SQL(
            "DELETE FROM {} WHERE snapshot_id = %s AND part = %s AND seq >= %s"
        ).format(entries)
        self.copy_sql = sql.SQL(
            "COPY {} (snapshot_id, part, seq, type, payload) FROM STDIN (FORMAT BINARY)"
        ).format(entries)

    def write_part(self, part: int, payloads: Iterator[bytes], chunk_rows: int) -> int:
        sid = self.snapshot_id
        kind = int(ReplicationType.SNAPSHOT_SYNC)
        seq = 0
        while True:
            n = 0
            with self.conn.transaction(), self.conn.cursor() as cur:
                status = cur.execute(self.lock_sql, (sid,)).fetchone()
                if status is None or status[0] != SnapshotStatus.RUNNING.value:
                    raise _not_running(sid, status[0] if status else None)
                cur.execute(self.clear_sql, (sid, part, seq, seq + chunk_rows))
                with cur.copy(self.copy_sql) as copy:
                    copy.set_types(["varchar", "int4", "int8", "int2", "bytea"])
                    write_row = copy.write_row
                    # Rows are encoded while COPY streams the previous ones to the server.
                    for payload in itertools.islice(payloads, chunk_rows):
                        write_row((sid, part, seq + n, kind, payload))
                        n += 1
                if n < chunk_rows:
                    cur.execute(self.tail_sql, (sid, part, seq + n))
            seq += n
            if n < chunk_rows:
                return seq

    def close(self) -> None:
        self.conn.close()


def open_sink(database_url: str, snapshot_id: str, method: str = "copy") -> _Sink:
    """A writer for one snapshot: COPY on PostgreSQL (unless ``method="store"``)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    dialect = make_url(database_url).get_backend_name()
    if dialect == "postgresql" and method == "copy":
        return _CopySink(database_url, snapshot_id)
    return _StoreSink(open_store(create_engine(database_url, poolclass=NullPool)), snapshot_id)


@dataclass(frozen=True)
class PartitionWriter:
    """The function each partition runs; pickled to the executors.

    ``encoder`` None means the default JSON encoder, which the Arrow path
    applies to plain dicts without building Rows.
    """

    database_url: str
    snapshot_id: str
    columns: tuple[str, ...]
    encoder: Encoder | None
    chunk_rows: int
    max_payload_bytes: int
    method: str = "copy"

    def write(self, part: int, payloads: Iterator[bytes]) -> int:
        """Write one partition's payloads as part ``part``; return how many."""
        sink = open_sink(self.database_url, self.snapshot_id, self.method)
        try:
            return sink.write_part(part, payloads, self.chunk_rows)
        finally:
            sink.close()

    # -- the RDD path: any schema, Rows as Spark makes them ---------------------------------
    def rows(self, index: int, rows: Iterable[Row]) -> Iterator[tuple[int, int]]:
        """``mapPartitionsWithIndex`` function: yields ``(part, entries)``."""
        from spark_jobs.encoders import json_encoder

        encode = self.encoder or json_encoder
        limit = self.max_payload_bytes
        yield index, self.write(index, (_payload(encode(r), limit) for r in rows))

    # -- the Arrow path: plain schemas, much less per-row work ----------------------------
    def _encode_batches(self, batches: Iterable[Any]) -> Iterator[bytes]:
        import pyarrow.compute as pc  # type: ignore[import-untyped]
        from pyspark.sql import Row

        names = list(self.columns)
        limit = self.max_payload_bytes
        factory = Row(*names)
        encode = self.encoder
        for batch in batches:
            if encode is None:
                encoded = arrow_json(batch, names)  # column-wise: no Python per row
                if encoded is not None:
                    if pc.max(pc.binary_length(encoded)).as_py() > limit:
                        raise PayloadTooLargeError(f"an encoded row exceeds the limit {limit}")
                    yield from encoded.to_pylist()
                    continue
            columns = [column.to_pylist() for column in batch.columns]
            tuples: Iterable[tuple[Any, ...]] = (
                zip(*columns, strict=True) if columns else itertools.repeat((), batch.num_rows)
            )
            if encode is None:
                for values in tuples:
                    yield _payload(encode_json_dict(dict(zip(names, values, strict=True))), limit)
            else:
                for values in tuples:
                    yield _payload(encode(factory(*values)), limit)

    def arrow(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``mapInArrow`` function: pyarrow RecordBatches in, one ``(part, entries)`` out."""
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "runs in a Spark task"
        part = ctx.partitionId()
        n = self.write(part, self._encode_batches(batches))
        yield pa.RecordBatch.from_arrays(
            [pa.array([part], pa.int64()), pa.array([n], pa.int64())], names=["part", "entries"]
        )


#: The schema of :meth:`PartitionWriter.arrow`'s output.
RESULT_SCHEMA = "part long, entries long"

# -- driver side ----------------------------------------------------------------------------

_PROGRESS_SQL = text(
    "WITH RECURSIVE parts(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM parts WHERE n < :last) "
    "SELECT COALESCE(SUM((SELECT MAX(e.seq) + 1 FROM lrq_send_snapsync e "
    "WHERE e.snapshot_id = :sid AND e.part = parts.n)), 0) FROM parts"
)


def rows_committed(store: SQLAlchemyQueueStore, snapshot_id: str, parts: int) -> int:
    """Entries committed so far by the partitions (one index probe per part).

    Counts up to the highest seq of each part, so a part being re-written by
    a retry may count rows of its earlier attempt: good enough for progress.
    """
    if parts <= 0:
        return 0
    with store.read() as conn:
        value = conn.execute(_PROGRESS_SQL, {"sid": snapshot_id, "last": parts - 1}).scalar()
    return int(value or 0)


def drop_other_parts(
    store: SQLAlchemyQueueStore, snapshot_id: str, written: dict[int, int]
) -> None:
    """Delete entries of parts this run did not write (left by an earlier run).

    ``written`` maps each part this run wrote to its entry count; every other
    part (a partition count that changed, an empty partition Spark skipped)
    is emptied. (Each partition already deleted anything past its own end.)
    """
    t = s.send_snapsync
    top = max(written, default=-1)
    gaps = [p for p in range(top) if p not in written]
    with store.write() as conn:
        status = conn.execute(
            select(s.snapshots.c.status)
            .where(s.snapshots.c.snapshot_id == snapshot_id)
            .with_for_update(read=True)
        ).scalar()
        if status != SnapshotStatus.RUNNING.value:
            raise _not_running(snapshot_id, status)
        base = and_(t.c.snapshot_id == snapshot_id, t.c.type == int(ReplicationType.SNAPSHOT_SYNC))
        conn.execute(delete(t).where(base, t.c.part > top))
        for i in range(0, len(gaps), 500):
            conn.execute(delete(t).where(base, t.c.part.in_(gaps[i : i + 500])))


__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "METHODS",
    "RESULT_SCHEMA",
    "PartitionWriter",
    "drop_other_parts",
    "open_sink",
    "rows_committed",
]
