"""PostgreSQL backend: positions after commit, in commit order, and a GIN tag index.

Invariant I1 (no reader skips a committed entry) and commit order (I2) come
from the sequencer (:mod:`lr_client.store.sequencer`): a transmitting
transaction only inserts its entries and, at COMMIT, a stamp; positions are
given to committed transactions in commit-stamp order by ticks, which every
reader of positions runs first (:meth:`PostgresQueueStore.sequence`).
Transmitting transactions share no lock, so they never wait for each other
and transmit adds no deadlock to the application's.

Stream tags: ``dest_nums smallint[]`` with a GIN index (compressed posting
lists: a few bytes per destination), so eight destinations cost little more
than one (I4). ``lrq_send_log_entries`` is a view (positions joined to
entries) with the columns of SQLite's table, so readers share their queries.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import literal, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from lr_client.records import EntryRef, ReplicationType, WireEntry
from lr_client.store import recv_rotation, sequencer
from lr_client.store import schema as s
from lr_client.store.base import mapped_errors
from lr_client.store.receiving import recv_base
from lr_client.store.sqla import SQLAlchemyQueueStore

_INSERT = (
    "INSERT INTO lrq_send_entries (client_name, payload, dest_nums, created_at) "
    "VALUES (%s, %s, CAST(%s AS smallint[]), %s) "
    "RETURNING CAST(CAST(txid AS text) AS bigint), ord"
)
#: A batch reserves its ordinals at once: the transaction-local counter that
#: ``lrq_next_ord`` (the ``ord`` default, revision 0004) advances by one per
#: row, advanced here by the batch's size. Returns (txid, first ordinal).
_RESERVE = (
    "SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint), "
    "set_config(k.name, (coalesce(nullif(current_setting(k.name, true), ''), '0')::bigint"
    " + %(n)s)::text, true)::bigint - %(n)s + 1 "
    "FROM (SELECT 'lrq.ord_' || 'lrq_send_entries'::regclass::oid AS name) k"
)
_COPY_ENTRIES = (
    "COPY lrq_send_entries (client_name, payload, dest_nums, created_at, ord) "
    "FROM STDIN (FORMAT BINARY)"
)
_ENTRY_TYPES = ("varchar", "bytea", "int2[]", "float8", "int8")

_RECV_COLUMNS = (
    "queue_id",
    "type",
    "source_position",
    "snapshot_id",
    "snapshot_count",
    "payload",
    "received_at",
    "base_position",
    "slot",
)
_RECV_TYPES = ("int4", "int2", "int8", "varchar", "int8", "bytea", "float8", "int8", "int2")
_COPY_RECV = "COPY {} ({}) FROM STDIN (FORMAT BINARY)".format(
    s.recv_entries.name, ", ".join(_RECV_COLUMNS)
)

_SNAPSYNC_COLUMNS = "snapshot_id, part, seq, type, payload"
_COPY_SNAPSYNC = f"COPY {s.send_snapsync.name} ({_SNAPSYNC_COLUMNS}) FROM STDIN (FORMAT BINARY)"

_TRIM = text(
    """
    WITH acked(dest_num, client_name, position) AS (
        SELECT * FROM unnest(CAST(:nums AS smallint[]), CAST(:clients AS text[]),
                             CAST(:positions AS bigint[]))
    ), victims AS (
        SELECT p.position FROM lrq_send_positions p
        WHERE NOT EXISTS (
            SELECT 1 FROM unnest(p.dest_nums) AS d(num)
            WHERE NOT EXISTS (
                SELECT 1 FROM acked a
                WHERE a.dest_num = d.num AND a.client_name = p.client_name
                  AND a.position >= p.position))
        ORDER BY p.position
        LIMIT :batch
    ), deleted AS (
        DELETE FROM lrq_send_positions WHERE position IN (SELECT position FROM victims)
        RETURNING position, client_name, dest_nums, txid, ord
    ), entries AS (
        DELETE FROM lrq_send_entries e USING deleted x WHERE e.txid = x.txid AND e.ord = x.ord
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


#: A tick that sequenced at least this many entries refreshes the planner's statistics.
ANALYZE_AFTER_TICK = 5000


class PostgresQueueStore(SQLAlchemyQueueStore):
    dialect = "postgresql"
    dialect_insert = staticmethod(pg_insert)
    consistent_isolation = "REPEATABLE READ"

    _tick_key: int | None = None

    def _insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[EntryRef]:
        now = time.time()
        # Through the driver's own cursor: this runs in every transmitting
        # transaction, and SQLAlchemy's statement machinery costs the
        # application several times the driver's own work per call.
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur:
            if len(messages) == 1:
                payload, nums = messages[0]
                dests = "{" + ",".join(str(n) for n in nums) + "}"
                cur.execute(_INSERT, (client_name, payload, dests, now))
                txid, ord_ = cur.fetchone()
                return [EntryRef(int(txid), int(ord_))]
            # A batch: its ordinals reserved in one statement, its rows in one
            # COPY (the stamp trigger fires for the row whose ordinal is 1).
            cur.execute(_RESERVE, {"n": len(messages)})
            txid, first = (int(v) for v in cur.fetchone())
            with cur.copy(_COPY_ENTRIES) as copy:
                copy.set_types(list(_ENTRY_TYPES))
                for i, (payload, nums) in enumerate(messages):
                    copy.write_row((client_name, payload, list(nums), now, first + i))
        return [EntryRef(txid, first + i) for i in range(len(messages))]

    def sequence(self) -> int:
        with mapped_errors(), self.engine.connect() as conn, conn.begin():
            if self._tick_key is None:
                self._tick_key = sequencer.lock_key(conn)
            n = sequencer.tick(conn, self._tick_key)[1]
        if n >= ANALYZE_AFTER_TICK:
            # A burst (a backlog committed while nothing read): the readers'
            # plans need the new rows counted before the next read, not at
            # the next periodic analyze.
            self.analyze()
        return n

    def _bases(self, conn: Connection, txids: Sequence[int]) -> dict[int, int]:
        return sequencer.bases(conn, txids)

    def analyze(self) -> None:
        # The per-destination read plans badly on a freshly filled queue that
        # autovacuum has not analysed yet; the server calls this periodically.
        with mapped_errors(), self.engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            auto.exec_driver_sql("ANALYZE lrq_send_positions")
            auto.exec_driver_sql("ANALYZE lrq_send_entries")

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
        # Sequenced positions only: an entry committed since the last tick gets
        # a higher one (a snapshot base read here is below it: it is replayed).
        if conn is not None:
            return sequencer.head(conn)
        self.sequence()
        with self.read() as own:
            return sequencer.head(own)

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
        # Binary COPY in the apply transaction: one round trip for the whole batch,
        # into the current slot of the receive queues' partitions.
        now = time.time()
        raw = conn.connection.driver_connection
        assert raw is not None
        slot = recv_rotation.current_slot(raw)
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
                        recv_base(e),
                        slot,
                    )
                )

    keeps_delivered = True  # until rotation truncates their partition

    def rotate_receive_queues(self, period: float = 30.0) -> int | None:
        with mapped_errors():
            return recv_rotation.rotate(self.engine, period)

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
        deleted = int(conn.execute(_TRIM, params).scalar_one())
        sequencer.forget(conn, batch_size)
        return deleted


__all__ = ["PostgresQueueStore"]
