"""Executor side of the snapshot job: each partition writes its own entries.

Partition ``p`` writes its rows as entries ``(snapshot_id, part=p, seq=i)``,
``i`` the row's index in the partition, in chunks of ``chunk_rows``, one
transaction per chunk (the store's
:meth:`~lr_client.store.contract.Snapshots.write_snapshot_part`). Each chunk
transaction

1. checks the snapshot is still RUNNING, holding a share lock on its request
   row (PostgreSQL) or the database's write lock (SQLite) until commit, so a
   cancellation either comes first (and the chunk writes nothing) or waits
   for the chunk and then deletes it with the rest: a cancelled snapshot keeps
   no entries;
2. deletes whatever an earlier attempt left in the chunk's seq range and
   writes the chunk (PostgreSQL: binary ``COPY``, unless ``method="store"``;
   otherwise through the store's ``write_snapshot_entries``);
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

from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from lr_client.errors import PayloadTooLargeError
from lr_client.records import check_partition_key, check_payload
from lr_client.store import (
    Sites,
    SnapshotEntries,
    SnapshotStore,
    Transactions,
    create_engine,
    open_store,
)
from lr_client.store import SnapshotRequests as SnapshotRequestRole
from lr_client.store.schema.lifecycle import SchemaStatus
from spark_jobs.encoders import Encoder, arrow_json, encode_json_dict

if TYPE_CHECKING:
    from pyspark.sql import Row

#: Rows per chunk transaction when the job is not told otherwise.
DEFAULT_CHUNK_ROWS = {"postgresql": 50_000, "sqlite": 20_000}
#: Write methods: binary COPY (PostgreSQL only) or the store's own inserts.
METHODS = ("copy", "store")


def _payload(value: object, limit: int) -> bytes:
    return check_payload(value, limit, "encoded row")


def row_key(value: object) -> bytes | None:
    """A key column's value as a partition key: str or bytes as they are, another
    type as its ``str``, null as none (checked: 1 to 256 bytes)."""
    if value is None:
        return None
    if not isinstance(value, (str, bytes, bytearray, memoryview)):
        value = str(value)
    return check_partition_key(value)


#: What a partition writes: payloads, or (payload, partition key) pairs.
Entry = bytes | tuple[bytes, bytes | None]


class _Sink(Protocol):
    def write_part(self, part: int, payloads: Iterator[Entry], chunk_rows: int) -> int: ...

    def close(self) -> None: ...


class JobStore(Transactions, Protocol):
    """What the snapshot job needs of the store: the snapshot queue and the backend."""

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade every table (idempotent); the schema's status before."""

    def close(self) -> None:
        """Close the store's connections; a later call reconnects."""

    sites: Sites
    snapshots: SnapshotRequestRole
    snapshot_entries: SnapshotEntries


class _StoreSink:
    """Writes parts through :meth:`~lr_client.store.contract.Snapshots.write_snapshot_part`."""

    def __init__(self, store: JobStore, snapshot_id: str, bulk: bool) -> None:
        self.store = store
        self.snapshot_id = snapshot_id
        self.bulk = bulk

    def write_part(self, part: int, payloads: Iterator[Entry], chunk_rows: int) -> int:
        return self.store.snapshot_entries.write_snapshot_part(
            self.snapshot_id, part, payloads, chunk_rows, bulk=self.bulk
        )

    def close(self) -> None:
        self.store.close()


def open_sink(database_url: str, snapshot_id: str, method: str = "copy") -> _Sink:
    """A writer for one snapshot: COPY on PostgreSQL (unless ``method="store"``)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    postgres = make_url(database_url).get_backend_name() == "postgresql"
    kwargs: dict[str, Any] = {"poolclass": NullPool}
    if postgres:
        # One connection for the partition's chunks, visible in pg_stat_activity.
        kwargs = {
            "pool_size": 1,
            "max_overflow": 0,
            "connect_args": {"application_name": f"lr-snapshot-{snapshot_id[:12]}"},
        }
    store = open_store(create_engine(database_url, **kwargs))
    return _StoreSink(store, snapshot_id, bulk=postgres and method == "copy")


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
    key_column: str = ""  # the column of each row's partition key ("": none)

    def write(self, part: int, payloads: Iterator[Entry]) -> int:
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
        column = self.key_column
        if column:
            keyed = ((_payload(encode(r), limit), row_key(r[column])) for r in rows)
            yield index, self.write(index, keyed)
        else:
            yield index, self.write(index, (_payload(encode(r), limit) for r in rows))

    # -- the Arrow path: plain schemas, much less per-row work ----------------------------
    def _encode_batches(self, batches: Iterable[Any]) -> Iterator[Entry]:
        if not self.key_column:
            yield from self._encode_payloads(batches)
            return
        for batch in batches:  # the payloads of one batch, then its keys alongside
            keys = batch.column(batch.schema.get_field_index(self.key_column)).to_pylist()
            payloads = self._encode_payloads([batch])
            for payload, key in zip(payloads, keys, strict=True):
                yield payload, row_key(key)

    def _encode_payloads(self, batches: Iterable[Any]) -> Iterator[bytes]:
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


def rows_committed(store: SnapshotStore, snapshot_id: str, parts: int) -> int:
    """Entries committed so far by the partitions (one index probe per part).

    Counts up to the highest seq of each part, so a part being re-written by
    a retry may count rows of its earlier attempt: good enough for progress.
    """
    return store.snapshot_entries.snapshot_rows_committed(snapshot_id, parts)


def drop_other_parts(store: SnapshotStore, snapshot_id: str, written: dict[int, int]) -> None:
    """Delete entries of parts this run did not write (left by an earlier run).

    ``written`` maps each part this run wrote to its entry count; every other
    part (a partition count that changed, an empty partition Spark skipped)
    is emptied. (Each partition already deleted anything past its own end.)
    """
    store.snapshot_entries.drop_unwritten_parts(snapshot_id, written)


__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "METHODS",
    "RESULT_SCHEMA",
    "JobStore",
    "PartitionWriter",
    "drop_other_parts",
    "open_sink",
    "rows_committed",
]
