"""SQLite backend: WAL, one writer at a time, stream tags in ``lrq_send_tags``.

SQLite serialises writers for the whole transaction, so positions are
assigned in commit order and invariant I1 holds by construction.
``AUTOINCREMENT`` keeps positions from ever being reused after a trim.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, delete, exists, func, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from lr_client.records import WireEntry
from lr_client.store import schema as s
from lr_client.store.sqla import SQLAlchemyQueueStore


def encode_dests(nums: Sequence[int]) -> str:
    return "," + ",".join(str(n) for n in nums) + ","


class SQLiteQueueStore(SQLAlchemyQueueStore):
    dialect = "sqlite"
    dialect_insert = staticmethod(sqlite_insert)

    def _insert_entries(
        self, conn: Connection, client_name: str, messages: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[int]:
        now = time.time()
        positions: list[int] = []
        tags: list[dict[str, int]] = []
        raw = conn.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            for payload, nums in messages:
                cur.execute(
                    "INSERT INTO lrq_send_log_entries (client_name, payload, dest_nums, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (client_name, payload, encode_dests(nums), now),
                )
                position = int(cur.lastrowid or 0)
                positions.append(position)
                tags.extend({"dest_num": n, "position": position} for n in nums)
            cur.executemany(
                "INSERT INTO lrq_send_tags (dest_num, position) VALUES (:dest_num, :position)", tags
            )
        finally:
            cur.close()
        return positions

    def _with_tag(self, query: Any, dest_num: int) -> Any:
        t, e = s.send_tags, s.send_log_entries
        return query.join(t, and_(t.c.position == e.c.position, t.c.dest_num == dest_num))

    def _tagged_query(self, dest_num: int, client_name: str, after: int) -> Any:
        e, t = s.send_log_entries, s.send_tags
        return (
            select(e.c.position, e.c.created_at)
            .select_from(t.join(e, e.c.position == t.c.position))
            .where(t.c.dest_num == dest_num, t.c.position > after, e.c.client_name == client_name)
        )

    def head_position(self, conn: Connection | None = None) -> int:
        query = text("SELECT seq FROM sqlite_sequence WHERE name = 'lrq_send_log_entries'")
        if conn is not None:
            return int(conn.execute(query).scalar() or 0)
        with self.read() as own:
            return int(own.execute(query).scalar() or 0)

    def _trim_log(self, conn: Connection, batch_size: int) -> int:
        e, t = s.send_log_entries, s.send_tags
        acked = self._acked_positions(conn)
        # A tag row means "this destination still needs this position": release acked ones.
        for (num, client), pos in acked.items():
            conn.execute(
                delete(t).where(
                    t.c.dest_num == num,
                    t.c.position <= pos,
                    t.c.position.in_(select(e.c.position).where(e.c.client_name == client)),
                )
            )
        if not acked:
            return 0
        # Entries left without any tag row. The tag table is keyed by
        # (destination, position): probing it per destination number keeps this
        # an index lookup per entry rather than a scan of every tag.
        nums = sorted(set(self._trim_sites(conn).values()) | {num for num, _ in acked})
        victims = (
            select(e.c.position)
            .where(
                e.c.position <= max(acked.values()),
                ~exists().where(t.c.dest_num.in_(nums), t.c.position == e.c.position),
            )
            .order_by(e.c.position)
            .limit(batch_size)
        )
        # Per stream, the highest position deleted: recorded in this transaction.
        picked = victims.subquery()
        marks: dict[tuple[int, str], int] = {}
        for row in conn.execute(
            select(e.c.client_name, e.c.dest_nums, func.max(e.c.position))
            .where(e.c.position.in_(select(picked.c.position)))
            .group_by(e.c.client_name, e.c.dest_nums)
        ).all():
            for num in self._dest_nums_of(row[1]):
                key = (num, row[0])
                marks[key] = max(marks.get(key, 0), int(row[2]))
        n = int(conn.execute(delete(e).where(e.c.position.in_(victims))).rowcount or 0)
        self._record_trim_marks(conn, marks)
        return n

    def _append_recv(self, conn: Connection, queue_id: int, entries: Sequence[WireEntry]) -> None:
        # The driver's executemany with tuples: no per-row dictionaries to build and bind.
        now = time.time()
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.executemany(
            "INSERT INTO lrq_recv_entries (queue_id, type, source_position, snapshot_id,"
            " snapshot_count, payload, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (queue_id, int(e.type), e.position, e.snapshot_id, e.snapshot_count, e.payload, now)
                for e in entries
            ],
        )

    def _release_tags(
        self, conn: Connection, dest_num: int, client_name: str, up_to: int | None
    ) -> None:
        e, t = s.send_log_entries, s.send_tags
        query = delete(t).where(
            t.c.dest_num == dest_num,
            t.c.position.in_(select(e.c.position).where(e.c.client_name == client_name)),
        )
        if up_to is not None:
            query = query.where(t.c.position <= up_to)
        conn.execute(query)


__all__ = ["SQLiteQueueStore", "encode_dests"]
