"""PostgreSQL backend: commit-ordered positions and a GIN tag index.

Invariant I1. A sequence hands out positions at INSERT time, but transactions
can commit in another order, so a reader could pass a position whose
transaction commits later. Transmitting transactions therefore take a
transaction-scoped advisory lock before their first insert; it is held until
COMMIT/ROLLBACK, and PostgreSQL releases locks only after the commit is
visible. So positions are assigned in commit order: whatever a reader sees,
every lower position is already committed or never will be.

Why this and not PgQ's snapshot batches: those order entries by transaction
id, so delivery order differs from position order and a reader must wait for
*every* older transaction of the cluster (even unrelated long ones); here one
integer position is both the order and the resume point, and unrelated
transactions never delay delivery. The cost is that transmitting transactions
serialise from their first transmit to their commit: transmit late in the
transaction. ``bench/transmit.py`` measures it, with concurrent writers too.

Stream tags: ``dest_nums smallint[]`` with a GIN index (compressed posting
lists: a few bytes per destination), so eight destinations cost little more
than one (I4).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, literal, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from lr_client.records import ReplicationType, WireEntry
from lr_client.store import schema as s
from lr_client.store.base import mapped_errors
from lr_client.store.sqla import SQLAlchemyQueueStore

#: High half of the advisory lock key serialising transmit commits ("LRQ1"); the
#: low half is the queue table's oid, so stores in different schemas of one
#: database never wait for each other.
TRANSMIT_LOCK_KEY = 0x4C525131

_TABLE_OID = text("SELECT CAST(CAST('lrq_send_log_entries' AS regclass) AS oid)")

_INSERT_MANY = (
    "INSERT INTO lrq_send_log_entries (client_name, payload, dest_nums, created_at) "
    "VALUES (%s, %s, CAST(%s AS smallint[]), %s) RETURNING position"
)

_INSERT_ONE = text(
    "INSERT INTO lrq_send_log_entries (client_name, payload, dest_nums, created_at) "
    "SELECT :client_name, :payload, :dest_nums, :created_at "
    "FROM (SELECT pg_advisory_xact_lock(:lock_key)) AS serialise "
    "RETURNING position"
).bindparams(bindparam("dest_nums", type_=postgresql.ARRAY(postgresql.SMALLINT)))

_LOCK = text("SELECT pg_advisory_xact_lock(:lock_key)")

_RECV_COLUMNS = (
    "queue_id",
    "type",
    "source_position",
    "snapshot_id",
    "snapshot_count",
    "payload",
    "received_at",
)
_RECV_TYPES = ("int4", "int2", "int8", "varchar", "int8", "bytea", "float8")
_COPY_RECV = "COPY {} ({}) FROM STDIN (FORMAT BINARY)".format(
    s.recv_entries.name, ", ".join(_RECV_COLUMNS)
)

_SNAPSYNC_COLUMNS = "snapshot_id, part, seq, type, payload"
_COPY_SNAPSYNC = f"COPY {s.send_snapsync.name} ({_SNAPSYNC_COLUMNS}) FROM STDIN (FORMAT BINARY)"

_SEQUENCE = text("SELECT last_value, is_called FROM lrq_send_log_entries_position_seq")

_TRIM = text(
    """
    WITH acked(dest_num, client_name, position) AS (
        SELECT * FROM unnest(CAST(:nums AS smallint[]), CAST(:clients AS text[]),
                             CAST(:positions AS bigint[]))
    ), victims AS (
        SELECT e.position FROM lrq_send_log_entries e
        WHERE NOT EXISTS (
            SELECT 1 FROM unnest(e.dest_nums) AS d(num)
            WHERE NOT EXISTS (
                SELECT 1 FROM acked a
                WHERE a.dest_num = d.num AND a.client_name = e.client_name
                  AND a.position >= e.position))
        ORDER BY e.position
        LIMIT :batch
    ), deleted AS (
        DELETE FROM lrq_send_log_entries WHERE position IN (SELECT position FROM victims)
        RETURNING position, client_name, dest_nums
    ), marks AS (
        INSERT INTO lrq_trim_marks (dest_num, client_name, trimmed_through)
        SELECT d.num, x.client_name, max(x.position)
        FROM deleted x CROSS JOIN LATERAL unnest(x.dest_nums) AS d(num)
        GROUP BY d.num, x.client_name
        ON CONFLICT (dest_num, client_name) DO UPDATE
        SET trimmed_through = GREATEST(lrq_trim_marks.trimmed_through,
                                       EXCLUDED.trimmed_through)
    )
    SELECT count(*) FROM deleted
    """
)


class PostgresQueueStore(SQLAlchemyQueueStore):
    dialect = "postgresql"
    dialect_insert = staticmethod(pg_insert)
    consistent_isolation = "REPEATABLE READ"

    _lock_key: int | None = None

    def lock_key(self, conn: Connection) -> int:
        """The transmit lock of this store's queue table."""
        if self._lock_key is None:
            oid = int(conn.execute(_TABLE_OID).scalar_one())
            self._lock_key = (TRANSMIT_LOCK_KEY << 32) | oid
        return self._lock_key

    def _insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[int]:
        now = time.time()
        key = self.lock_key(conn)
        if len(messages) == 1:
            payload, nums = messages[0]
            row = conn.execute(
                _INSERT_ONE,
                {
                    "client_name": client_name,
                    "payload": payload,
                    "dest_nums": list(nums),
                    "created_at": now,
                    "lock_key": key,
                },
            )
            return [int(row.scalar_one())]
        conn.execute(_LOCK, {"lock_key": key})
        # A short statement, pipelined by the driver: one prepared INSERT per row
        # instead of one huge multi-row statement re-parsed on every call.
        rows = [
            (client_name, p, "{" + ",".join(str(n) for n in nums) + "}", now)
            for p, nums in messages
        ]
        raw = conn.connection.driver_connection
        assert raw is not None
        positions: list[int] = []
        with raw.cursor() as cur:
            cur.executemany(_INSERT_MANY, rows, returning=True)
            while True:
                positions.append(int(cur.fetchone()[0]))
                if not cur.nextset():
                    break
        return positions

    def analyze(self) -> None:
        # The per-destination read plans badly on a freshly filled queue that
        # autovacuum has not analysed yet; the server calls this periodically.
        with mapped_errors(), self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "ANALYZE lrq_send_log_entries"
            )

    def _lock_stream(self, conn: Connection, source_id: str, client_name: str) -> None:
        # Two appends to one queue must commit in sequence order, or a
        # subscriber could pass a sequence number that commits later.
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
            {"k": f"lrq_recv:{client_name}:{source_id}"},
        )

    def _with_tag(self, query: Any, dest_num: int) -> Any:
        e = s.send_log_entries
        arr = literal([dest_num], postgresql.ARRAY(postgresql.SMALLINT))
        return query.where(e.c.dest_nums.op("@>")(arr))

    def _tagged_query(self, dest_num: int, client_name: str, after: int) -> Any:
        e = s.send_log_entries
        query = select(e.c.position, e.c.created_at).where(
            e.c.client_name == client_name, e.c.position > after
        )
        return self._with_tag(query, dest_num)

    def head_position(self, conn: Connection | None = None) -> int:
        # Under the transmit lock every assigned position is committed or rolled back.
        query = text(
            "SELECT pg_advisory_xact_lock(:k), "
            "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
            "FROM lrq_send_log_entries_position_seq)"
        )
        if conn is not None:
            return int(conn.execute(query, {"k": self.lock_key(conn)}).one()[1])
        with self.write() as own:
            return int(own.execute(query, {"k": self.lock_key(own)}).one()[1])

    def head_position_estimate(self) -> int:
        # Reads the sequence instead of taking the transmit lock: it may count a
        # position whose transaction has not committed yet.
        with self.read() as conn:
            row = conn.execute(_SEQUENCE).one()
        return int(row[0]) if row[1] else 0

    def _copy_snapshot_rows(
        self, conn: Connection, snapshot_id: str, part: int, seq: int, payloads: Iterable[bytes]
    ) -> int:
        # Binary COPY, streamed: payloads are produced while earlier rows travel.
        kind = int(ReplicationType.SNAPSHOT_SYNC)
        raw = conn.connection.driver_connection
        assert raw is not None
        n = 0
        with raw.cursor() as cur, cur.copy(_COPY_SNAPSYNC) as copy:
            copy.set_types(["varchar", "int4", "int8", "int2", "bytea"])
            write_row = copy.write_row
            for payload in payloads:
                write_row((snapshot_id, part, seq + n, kind, payload))
                n += 1
        return n

    def _append_recv(self, conn: Connection, queue_id: int, entries: Sequence[WireEntry]) -> None:
        # Binary COPY in the apply transaction: one round trip for the whole batch.
        now = time.time()
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur, cur.copy(_COPY_RECV) as copy:
            copy.set_types(list(_RECV_TYPES))
            for e in entries:
                copy.write_row(
                    (
                        queue_id,
                        int(e.type),
                        e.position,
                        e.snapshot_id,
                        e.snapshot_count,
                        e.payload,
                        now,
                    )
                )

    def _trim_log(self, conn: Connection, batch_size: int) -> int:
        # Before the snapshot is taken (the first query): no cursor changes until
        # this trim commits. A session lowering a cursor to replay for a sink
        # behind it then either waits for this trim and reads its trim marks,
        # or committed first and this trim sees the lowered cursor. (SQLite
        # serialises writers: the same holds there by construction.)
        conn.execute(text("LOCK TABLE lrq_cursors IN SHARE MODE"))
        acked = self._acked_positions(conn)
        params = {
            "nums": [k[0] for k in acked],
            "clients": [k[1] for k in acked],
            "positions": [v for v in acked.values()],
            "batch": batch_size,
        }
        # The trim marks rise in the statement that deletes (see ``trimmed_through``).
        return int(conn.execute(_TRIM, params).scalar_one())


__all__ = ["TRANSMIT_LOCK_KEY", "PostgresQueueStore"]
