"""What a receive queue holds at its head: the entries a delivery reads next, and how
much waits (what a sink's receive limits are checked against)."""

from __future__ import annotations

from sqlalchemy import func, literal, select
from sqlalchemy.engine import Connection

from lr_client.names import recv_queue_name
from lr_client.records import TYPES_BY_VALUE, HeadEntry, ReplicationType
from lr_client.store.byte_bounds import fill, sized, within
from lr_client.store.recv.queues import above, optional_bytes, undelivered
from lr_client.store.role import Role
from lr_client.store.schema import tables as s

_R = s.recv_entries


class QueueHeadsStore(Role):
    """Reads of a receive queue's oldest undelivered entries, in its caller's transaction."""

    def read_head(
        self,
        conn: Connection,
        queue_id: int,
        limit: int,
        max_bytes: int | None = None,
        after: int | None = None,
    ) -> list[HeadEntry]:
        """The oldest entries of a receive queue, in seq order: at most ``limit``, and
        past the first no more than ``max_bytes`` (the store's one byte-cut rule).

        Sizes come first and large payloads only once their entry fits, so a queue
        of large payloads never loads more than the limit (see :func:`sized`).
        ``after``: those above this ``seq`` (None: above the queue's ``delivered_seq``).
        """
        query = (
            select(
                _R.c.seq,
                _R.c.type,
                _R.c.source_position,
                _R.c.snapshot_id,
                _R.c.base_position,
                _R.c.partition_key,
                _R.c.headers,
                _R.c.received_at,
            )
            .add_columns(*sized(_R.c.payload, limit, max_bytes))
            .where(above(queue_id, after))
            .order_by(_R.c.seq)
            .limit(limit)
        )
        rows = within(self.core.fetch_rows(conn, query, in_index_order=True), max_bytes)
        if any(r[-1] is None for r in rows):  # a large payload, loaded now that it fits
            rows = [(*r[:-1], p) for r, p in fill(conn, rows, _R.c.seq, _R.c.payload)]
        # Each row's last column is its payload (the drivers give bytes); one tuple
        # per entry, HeadEntry._make without its length check.
        new, types = tuple.__new__, TYPES_BY_VALUE
        k = optional_bytes
        return [
            new(HeadEntry, (r[0], types[r[1]], r[2], r[3], r[-1], r[4], k(r[5]), k(r[6]), r[7]))
            for r in rows
        ]

    def peek_head(
        self, conn: Connection, queue_id: int, after: int | None = None
    ) -> HeadEntry | None:
        """The oldest entry of a receive queue (above ``after``, as for
        :meth:`read_head`), without its payload (``b""``)."""
        row = conn.execute(
            select(
                _R.c.seq,
                _R.c.type,
                _R.c.source_position,
                _R.c.snapshot_id,
                _R.c.base_position,
                _R.c.received_at,
            )
            .where(above(queue_id, after))
            .order_by(_R.c.seq)
            .limit(1)
        ).first()
        if row is None:
            return None
        kind = TYPES_BY_VALUE[row[1]]
        return HeadEntry(row[0], kind, row[2], row[3], b"", row[4], received_at=row[5])

    def has_snapshot_end(self, conn: Connection, queue_id: int, snapshot_id: str) -> bool:
        """Whether the end marker of ``snapshot_id`` is in the receive queue (an index probe)."""
        end = literal(int(ReplicationType.LAST_FULL_SYNC_ENTRY), literal_execute=True)
        probe = (
            select(_R.c.seq)
            .where(undelivered(queue_id), _R.c.snapshot_id == snapshot_id, _R.c.type == end)
            .limit(1)
        )
        return conn.execute(probe).first() is not None

    def snapshot_base(self, conn: Connection, queue_id: int, snapshot_id: str) -> int | None:
        """The base position the end marker of ``snapshot_id`` carries; None if not queued."""
        end = literal(int(ReplicationType.LAST_FULL_SYNC_ENTRY), literal_execute=True)
        row = conn.execute(
            select(_R.c.base_position)
            .where(undelivered(queue_id), _R.c.snapshot_id == snapshot_id, _R.c.type == end)
            .limit(1)
        ).first()
        return None if row is None or row[0] is None else int(row[0])

    def has_entries(self, conn: Connection, queue_id: int) -> bool:
        """Whether the receive queue holds anything (a cheap indexed probe)."""
        probe = select(_R.c.seq).where(undelivered(queue_id)).limit(1)
        return conn.execute(probe).first() is not None

    def receive_queue_size(self, source_id: str, client_name: str) -> tuple[int, int]:
        """One index range of the queue (its undelivered entries): its cost grows with
        what waits, which the limits it serves keep small."""
        r, reg = s.recv_entries, s.queue_registry
        name = recv_queue_name(client_name, source_id)
        with self.core.read() as conn:
            qid = conn.execute(select(reg.c.queue_id).where(reg.c.queue_name == name)).scalar()
            if qid is None:
                return 0, 0
            row = conn.execute(
                select(func.count(), func.coalesce(func.sum(func.length(r.c.payload)), 0)).where(
                    undelivered(qid)
                )
            ).one()
        return int(row[0]), int(row[1])


__all__ = ["QueueHeadsStore"]
