"""The :class:`~lr_client.store.contract.Snapshots` role, part two: the snapshot queue.

A provider writes a RUNNING request's entries as ``(part, seq)``; every write
holds the request's share-lock (:meth:`SnapshotsStore._require_writable`) until
it commits, so a concurrent cancel either comes first (and the write fails) or
waits for the write and then releases its entries with the rest. Every write
goes to the slot the request holds, read under that lock, and every read or
delete by snapshot is kept to its slot (PostgreSQL: its partition,
:mod:`~lr_client.store.snapshots.pool`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import and_, delete, func, insert, select, text, tuple_
from sqlalchemy.engine import Connection

from lr_client.errors import SnapshotError
from lr_client.records import TYPES_BY_VALUE, ReplicationType, SendEntry, SnapshotStatus
from lr_client.store.byte_bounds import fill, sized, within
from lr_client.store.core import StoreCore
from lr_client.store.schema import tables as s
from lr_client.store.snapshots.pool import SnapshotPoolStore
from lr_client.store.snapshots.requests import SnapshotRequestsStore

#: Read marks kept (one per destination reading a snapshot, a few spare).
_MAX_MARKS = 1024


def _key(value: Any) -> bytes | None:
    """A stored partition key as bytes (None: the entry has none)."""
    return None if value is None else bytes(value)


#: Entries committed so far: per part 0 .. ``last``, up to its highest seq.
_PARTS = (
    "WITH RECURSIVE parts(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM parts WHERE n < :last) "
    "SELECT COALESCE(SUM((SELECT MAX(e.seq) + 1 FROM lrq_send_snapsync e "
    "WHERE e.snapshot_id = :sid AND e.part = parts.n{})), 0) FROM parts"
)
_PARTS_COMMITTED = text(_PARTS.format(""))
#: The same, in the snapshot's slot only (PostgreSQL: one partition).
_PARTS_COMMITTED_IN_SLOT = text(_PARTS.format(" AND e.snap_slot = :slot"))


class SnapshotEntriesStore(SnapshotPoolStore):
    """The entries of the snapshot queue: written by a provider, read by sessions."""

    def __init__(self, core: StoreCore, requests: SnapshotRequestsStore) -> None:
        super().__init__(core)
        self.requests = requests

    def set_snapshot_progress(self, snapshot_id: str, rows_written: int) -> None:
        self.requests.update_snapshot(
            snapshot_id, expect=[SnapshotStatus.RUNNING], rows_written=rows_written
        )

    def _require_writable(self, conn: Connection, snapshot_id: str) -> int:
        """The slot of a RUNNING snapshot, its row key-share-locked until ``conn`` commits.

        A concurrent end (which locks the row ``FOR UPDATE`` first) waits for
        this write, or this write sees the end: no entry of an ended snapshot
        survives it, and none lands in a slot that another snapshot took since.
        ``FOR KEY SHARE``, not ``FOR SHARE``: the driver's progress and
        heartbeat updates of the row (no key column) go through while chunks
        are being written, instead of queueing behind every open chunk.
        """
        c = s.snapshots.c
        row = conn.execute(
            select(c.status, c.snap_slot)
            .where(c.snapshot_id == snapshot_id)
            .with_for_update(read=True, key_share=True)
        ).first()
        if row is None or row.status != SnapshotStatus.RUNNING.value:
            status = row.status if row else "unknown"
            raise SnapshotError(f"snapshot {snapshot_id} is {status}, not running")
        if row.snap_slot is None:  # started before revision 0007 without a slot: not possible
            raise SnapshotError(f"snapshot {snapshot_id} holds no slot for its entries")
        return int(row.snap_slot)

    def write_snapshot_entries(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        payloads: Sequence[bytes],
        first_seq: int = 0,
        keys: Sequence[bytes | None] | None = None,
    ) -> int:
        if keys is not None and len(keys) != len(payloads):
            raise ValueError("keys must be as many as payloads")
        slot = self._require_writable(conn, snapshot_id)
        self._delete_part(conn, snapshot_id, part, first_seq, first_seq + len(payloads), slot)
        if payloads:
            extra = self._slot_values(slot)
            conn.execute(
                insert(self._snapsync),
                [
                    {
                        "snapshot_id": snapshot_id,
                        "part": part,
                        "seq": first_seq + i,
                        "type": int(ReplicationType.SNAPSHOT_SYNC),
                        "payload": p,
                        "partition_key": None if keys is None else keys[i],
                        **extra,
                    }
                    for i, p in enumerate(payloads)
                ],
            )
            self.core.announce_sends(conn)
        return len(payloads)

    def _count_entries(self, conn: Connection, snapshot_id: str, slot: int | None) -> int:
        if slot is None and self.core.snapsync_slotted:
            return 0  # PostgreSQL: a snapshot's entries live in its slot only
        t = self._snapsync
        query = select(func.count()).where(
            t.c.snapshot_id == snapshot_id,
            t.c.type == int(ReplicationType.SNAPSHOT_SYNC),
            *self._in_slot(slot),
        )
        return int(conn.execute(query).scalar_one())

    def count_snapshot_entries(self, snapshot_id: str) -> int:
        with self.core.read() as conn:
            return self._count_entries(conn, snapshot_id, self._slot_of(conn, snapshot_id))

    def finish_snapshot(self, snapshot_id: str) -> int:
        t = self._snapsync
        with self.core.write() as conn:
            slot = self._require_writable(conn, snapshot_id)
            count = self._count_entries(conn, snapshot_id, slot)
            conn.execute(
                delete(t).where(
                    t.c.snapshot_id == snapshot_id,
                    t.c.type == int(ReplicationType.LAST_FULL_SYNC_ENTRY),
                    *self._in_slot(slot),
                )
            )
            conn.execute(
                insert(t).values(
                    snapshot_id=snapshot_id,
                    part=-1,
                    seq=0,
                    type=int(ReplicationType.LAST_FULL_SYNC_ENTRY),
                    payload=str(count).encode(),
                    **self._slot_values(slot),
                )
            )
            self.requests.change_snapshot(
                conn,
                snapshot_id,
                [SnapshotStatus.RUNNING],
                {"status": SnapshotStatus.READY, "entry_count": count, "rows_written": count},
            )
            self.core.announce_sends(conn)
        return count

    def read_snapshot_entries(
        self, snapshot_id: str, after: int, limit: int, max_bytes: int | None = None
    ) -> list[SendEntry]:
        t = self._snapsync
        cols = (
            t.c.position,
            t.c.type,
            t.c.part,
            t.c.seq,
            t.c.partition_key,
            *sized(t.c.payload, limit, max_bytes),
        )
        with self.core.read() as conn:
            req = conn.execute(
                select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).first()
            if req is None or req.status != SnapshotStatus.READY.value:
                return []
            if req.entry_count is not None and after > req.entry_count:
                return []  # past its end marker (ordinal count + 1): nothing to scan for
            mine = (t.c.snapshot_id == snapshot_id, *self._in_slot(req.snap_slot))
            # Ordinals: the entries by (part, seq), then the end marker (part -1). A READY
            # snapshot no longer changes, so where the previous read of this snapshot
            # ended is a key to continue from: each read is an index range, not an OFFSET
            # that rescans everything already shipped.
            # Keyed by where a read ended: destinations reading the same snapshot
            # at their own pace each continue from their own mark.
            mark = self.core.snapshot_marks.get((snapshot_id, after))
            if after == 0 or (mark is not None and mark[0] == after):
                query = select(*cols).where(*mine)
                if after:
                    assert mark is not None  # its part is >= 0: the end marker stays out
                    query = query.where(tuple_(t.c.part, t.c.seq) > tuple_(mark[1], mark[2]))
                else:
                    query = query.where(t.c.part >= 0)
                rows = list(
                    self.core.fetch_rows(conn, query.order_by(t.c.part, t.c.seq).limit(limit))
                )
                if len(rows) < limit:
                    end = select(*cols).where(*mine, t.c.part < 0)
                    rows += self.core.fetch_rows(
                        conn, end.limit(limit - len(rows))
                    )  # the end marker
            else:  # resuming elsewhere (a reconnect): find the place once
                rows = list(
                    conn.execute(
                        select(*cols)
                        .where(*mine)
                        .order_by((t.c.part < 0), t.c.part, t.c.seq)
                        .offset(after)
                        .limit(limit)
                    ).all()
                )
            rows = within(rows, max_bytes)
            filled = fill(conn, rows, t.c.position, t.c.payload, *mine[1:])
        if len(filled) < len(rows):  # cancelled meanwhile
            return []
        if rows and rows[-1][2] >= 0:  # (position, type, part, seq, key, size, inline)
            upto = after + len(rows)
            if len(self.core.snapshot_marks) >= _MAX_MARKS:
                self.core.snapshot_marks.pop(next(iter(self.core.snapshot_marks)))
            self.core.snapshot_marks[(snapshot_id, upto)] = (upto, rows[-1][2], rows[-1][3])
        client, types = req.client_name, TYPES_BY_VALUE  # per row: no enum call, no keywords
        return [
            SendEntry(after + i, client, types[r[1]], payload, (), snapshot_id, 0.0, _key(r[4]))
            for i, (r, payload) in enumerate(filled, 1)
        ]

    # -- bulk writes (the Spark job's partitions) ----------------------------------------
    def write_snapshot_part(
        self,
        snapshot_id: str,
        part: int,
        payloads: Iterable[bytes | tuple[bytes, bytes | None]],
        chunk_rows: int,
        *,
        bulk: bool = True,
    ) -> int:
        """Write a whole part, ``chunk_rows`` entries per transaction; return how many.

        Each item is a payload or a ``(payload, partition key)`` pair.

        Each chunk holds the request's share-lock, replaces what an earlier
        attempt left in its seq range, and the last chunk deletes entries past
        the part's end: a re-run leaves exactly one entry per payload. ``bulk``
        lets a backend stream the chunk in (PostgreSQL: binary ``COPY``), while
        the payloads are still being produced.
        """
        source = iter(payloads)
        seq = 0
        while True:
            n: int | None = None
            if bulk:
                with self.core.write() as conn:
                    slot = self._require_writable(conn, snapshot_id)
                    self._delete_part(conn, snapshot_id, part, seq, seq + chunk_rows, slot)
                    n = self.core.copy_snapshot_rows(
                        conn, snapshot_id, part, seq, itertools.islice(source, chunk_rows), slot
                    )
                    if n is not None and n < chunk_rows:
                        self._delete_part(conn, snapshot_id, part, seq + n, None, slot)
                    if n:
                        self.core.announce_sends(conn)
            if n is None:  # no bulk path: the chunk is produced outside the transaction
                chunk = [
                    item if isinstance(item, tuple) else (item, None)
                    for item in itertools.islice(source, chunk_rows)
                ]
                n = len(chunk)
                keys = [k for _, k in chunk]
                with self.core.write() as conn:
                    self.write_snapshot_entries(
                        conn,
                        snapshot_id,
                        part,
                        [p for p, _ in chunk],
                        seq,
                        keys if any(k is not None for k in keys) else None,
                    )
                    if n < chunk_rows:
                        slot = self._require_writable(conn, snapshot_id)
                        self._delete_part(conn, snapshot_id, part, seq + n, None, slot)
            seq += n
            if n < chunk_rows:
                return seq

    def _delete_part(
        self,
        conn: Connection,
        snapshot_id: str,
        part: int,
        start: int,
        stop: int | None,
        slot: int,
    ) -> None:
        """Delete a part's entries with ``start <= seq < stop`` (no ``stop``: to its end)."""
        t = self._snapsync
        query = delete(t).where(
            t.c.snapshot_id == snapshot_id, t.c.part == part, t.c.seq >= start, *self._in_slot(slot)
        )
        if stop is not None:
            query = query.where(t.c.seq < stop)
        conn.execute(query)

    def snapshot_rows_committed(self, snapshot_id: str, parts: int) -> int:
        """Entries committed so far by parts ``0 .. parts - 1`` (one index probe per part).

        Counts up to the highest seq of each part, so a part being re-written by
        a retry may count rows of its earlier attempt: good enough for progress.
        """
        if parts <= 0:
            return 0
        params: dict[str, object] = {"sid": snapshot_id, "last": parts - 1}
        with self.core.read() as conn:
            if not self.core.snapsync_slotted:
                value = conn.execute(_PARTS_COMMITTED, params).scalar()
            elif (slot := self._slot_of(conn, snapshot_id)) is not None:
                value = conn.execute(_PARTS_COMMITTED_IN_SLOT, {**params, "slot": slot}).scalar()
            else:  # PostgreSQL: no slot, no entries
                value = 0
        return int(value or 0)

    def drop_unwritten_parts(self, snapshot_id: str, written: Mapping[int, int]) -> None:
        """Delete entries of the parts not in ``written`` (left by an earlier run).

        ``written`` maps each part a run wrote to its entry count; every other
        part (a partition count that changed, an empty partition skipped) is
        emptied, under the request's share-lock.
        """
        t = self._snapsync
        top = max(written, default=-1)
        gaps = [p for p in range(top) if p not in written]
        with self.core.write() as conn:
            slot = self._require_writable(conn, snapshot_id)
            base = and_(
                t.c.snapshot_id == snapshot_id,
                t.c.type == int(ReplicationType.SNAPSHOT_SYNC),
                *self._in_slot(slot),
            )
            conn.execute(delete(t).where(base, t.c.part > top))
            for i in range(0, len(gaps), 500):
                conn.execute(delete(t).where(base, t.c.part.in_(gaps[i : i + 500])))


__all__ = ["SnapshotEntriesStore"]
