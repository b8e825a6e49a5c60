"""The :class:`~lr_client.store.contract.Inspection` role: read-only views and session status.

What ``lr status``, ``lr browse`` and the CLI show; sender sessions write
their status rows here too. Browsing reads each payload's size and first
:data:`BROWSE_HEAD_BYTES` with the database's ``length`` and ``substr``, never
the whole payload: a page of 64 MiB payloads returns a few KiB.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, LargeBinary, and_, func, or_, select

from lr_client.records import QueueInfo, QueueSlot, ReplicationType, StoredEntry
from lr_client.store.byte_bounds import payload_size
from lr_client.store.ops.partition_lags import PartitionLag, partition_lags
from lr_client.store.recv import parked_views as pv
from lr_client.store.recv.queues import depth, undelivered
from lr_client.store.role import Role
from lr_client.store.schema import tables as s

#: The bytes of a payload browsing reads: enough for a preview of 32 characters of UTF-8.
BROWSE_HEAD_BYTES = 128


def payload_head(payload: ColumnElement[bytes]) -> tuple[ColumnElement[bytes], ColumnElement[int]]:
    """The payload's first :data:`BROWSE_HEAD_BYTES` (``head``) and its size in bytes
    (``size``), computed by the database: ``substr`` and ``length`` of SQLite's BLOB and
    PostgreSQL's bytea count bytes. PostgreSQL fetches only the TOAST chunks of the head;
    SQLite's ``substr`` reads the one value it cuts, inside the library, row by row."""
    head = func.substr(payload, 1, BROWSE_HEAD_BYTES, type_=LargeBinary).label("head")
    return head, payload_size(payload)


@dataclass(frozen=True, slots=True)
class SinkBacklog:
    """A receive queue's undelivered entries: how many, and when the oldest arrived
    (the database's ``received_at``; None: the queue is empty)."""

    client_name: str
    source_id: str
    depth: int
    oldest_received_at: float | None


@dataclass(frozen=True, slots=True)
class SinkFailures:
    """Per (client, source): entries parked or held, and blocked rows of its queue
    (the queue, or partitions of it); only the non-zero ones."""

    parked: dict[tuple[str, str], int]
    blocked: dict[tuple[str, str], int]


class InspectionStore(Role):
    """Counts, browsing and the sessions' status rows."""

    def sink_failures(self, client_name: str | None = None) -> SinkFailures:
        """The receive queues' (of one client's) parked entries and blocked state."""
        with self.core.read() as conn:
            parked = pv.open_counts(conn, client_name)
            blocked = pv.blocked_counts(conn, client_name)
        return SinkFailures(parked, blocked)

    def sink_partition_lags(self, client_name: str | None = None) -> list[PartitionLag]:
        """Every partition's (of one client's queues) entries above its delivered mark."""
        with self.core.read() as conn:
            return partition_lags(conn, client_name)

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
        with self.core.write() as conn:
            self.core.upsert(
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
        with self.core.read() as conn:
            rows = conn.execute(
                select(s.session_status).order_by(s.session_status.c.destination)
            ).all()
        return [dict(r._mapping) for r in rows]

    # -- counts -------------------------------------------------------------------------
    def queue_depths(self) -> dict[int, int]:
        """{queue_id: entries waiting in the receive queue}, in one query.

        Entries above each queue's ``delivered_seq``: one index range per queue.
        """
        reg = s.queue_registry
        with self.core.read() as conn:
            rows = conn.execute(select(reg.c.queue_id, depth(reg.c.queue_id))).all()
        return {int(r[0]): int(r[1]) for r in rows if r[1]}

    def sink_backlogs(self, client_name: str | None = None) -> list[SinkBacklog]:
        """Every receive queue's (of one client's) undelivered entries, in one query: their
        count (one index range per queue) and the arrival of the lowest ``seq`` (one probe)."""
        reg, t = s.queue_registry, s.recv_entries
        oldest = (
            select(t.c.received_at)
            .where(undelivered(reg.c.queue_id))
            .order_by(t.c.seq)
            .limit(1)
            .scalar_subquery()
        )
        query = select(reg.c.client_name, reg.c.source_id, depth(reg.c.queue_id), oldest)
        if client_name is not None:
            query = query.where(reg.c.client_name == client_name)
        with self.core.read() as conn:
            rows = conn.execute(query.order_by(reg.c.client_name, reg.c.source_id)).all()
        return [
            SinkBacklog(str(r[0]), str(r[1]), int(r[2] or 0), None if r[3] is None else float(r[3]))
            for r in rows
        ]

    def queue_sizes(self) -> tuple[int, int, list[tuple[QueueInfo, int]]]:
        """Entries in the send log, in the snapshot queue, and in each receive queue
        (by queue name), read in one transaction."""
        reg = s.queue_registry
        self.core.sequence()
        with self.core.read() as conn:
            n_log = conn.execute(select(func.count()).select_from(s.send_log_entries)).scalar_one()
            n_snap = conn.execute(select(func.count()).select_from(s.send_snapsync)).scalar_one()
            registry = conn.execute(
                select(reg, depth(reg.c.queue_id).label("depth")).order_by(reg.c.queue_name)
            ).all()
        queues = [
            (QueueInfo(r.queue_id, r.queue_name, r.client_name, r.source_id), int(r.depth))
            for r in registry
        ]
        return int(n_log), int(n_snap), queues

    def head_position_estimate(self) -> int:
        return self.core.head_position_estimate()

    def queue_slots(self) -> list[QueueSlot]:
        return self.core.queue_slots()  # PostgreSQL's store has slots; SQLite trims rows

    # -- browsing -----------------------------------------------------------------------
    def browse_log_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Send log entries after ``after``; with ``destination``, those it still needs.

        Those are the entries tagged for it after its cursor, and none of a
        dropped stream. An unknown destination has none.
        """
        self.core.sequence()
        e = s.send_log_entries
        head = payload_head(e.c.payload)
        query = select(e.c.position, e.c.client_name, *head, e.c.dest_nums, e.c.created_at)
        if destination is not None:
            num = self.core.site_numbers(refresh=True).get(destination)
            if num is None:
                return []
            query = self.core.with_tag(query, num)
            c, d = s.cursors, s.drops
            query = (
                query.outerjoin(
                    c, and_(c.c.destination == destination, c.c.client_name == e.c.client_name)
                )
                .outerjoin(
                    d, and_(d.c.destination == destination, d.c.client_name == e.c.client_name)
                )
                .where(or_(c.c.position.is_(None), e.c.position > c.c.position))
                .where(d.c.destination.is_(None))
            )
        if client_name is not None:
            query = query.where(e.c.client_name == client_name)
        query = query.where(e.c.position > after).order_by(e.c.position).limit(limit)
        with self.core.read() as conn:
            rows = conn.execute(query).all()
        return [
            StoredEntry(
                position=int(r.position),
                type=int(ReplicationType.LOG_ENTRY_SYNC),
                client_name=r.client_name,
                payload=bytes(r.head),
                size=int(r.size),
                destinations=tuple(
                    self.core.site_name(n) for n in self.core.dest_nums_of(r.dest_nums or [])
                ),
                created_at=r.created_at,
            )
            for r in rows
        ]

    def browse_snapshot_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Snapshot queue entries after ``after`` (of the snapshots of a destination, a client)."""
        t, snap, d = s.send_snapsync, s.snapshots, s.snapshot_destinations
        query = (
            select(t.c.position, t.c.type, *payload_head(t.c.payload), t.c.snapshot_id)
            .add_columns(snap.c.client_name)
            .select_from(t.outerjoin(snap, snap.c.snapshot_id == t.c.snapshot_id))
            .where(t.c.position > after)
        )
        if destination is not None:
            query = query.where(
                t.c.snapshot_id.in_(select(d.c.snapshot_id).where(d.c.destination == destination))
            )
        if client_name is not None:
            query = query.where(snap.c.client_name == client_name)
        with self.core.read() as conn:
            rows = conn.execute(query.order_by(t.c.position).limit(limit)).all()
            ids = list({r.snapshot_id for r in rows})
            members: dict[str, list[str]] = {}
            for i in range(0, len(ids), 500):
                for m in conn.execute(
                    select(d.c.snapshot_id, d.c.destination)
                    .where(d.c.snapshot_id.in_(ids[i : i + 500]))
                    .order_by(d.c.created_at, d.c.destination)
                ).all():
                    members.setdefault(m.snapshot_id, []).append(m.destination)
        return [
            StoredEntry(
                position=int(r.position),
                type=int(r.type),
                client_name=r.client_name or "",
                payload=bytes(r.head),
                size=int(r.size),
                destinations=tuple(members.get(r.snapshot_id, ())),
                snapshot_id=r.snapshot_id,
            )
            for r in rows
        ]

    def browse_queue(self, queue_name: str, after: int, limit: int) -> list[StoredEntry] | None:
        """A receive queue's entries with ``seq`` after ``after``; None if it does not exist."""
        reg, t = s.queue_registry, s.recv_entries
        with self.core.read() as conn:
            found = conn.execute(
                select(reg.c.queue_id, reg.c.client_name).where(reg.c.queue_name == queue_name)
            ).first()
            if found is None:
                return None
            columns = (t.c.seq, t.c.source_position, t.c.type, t.c.snapshot_id, t.c.received_at)
            rows = conn.execute(
                select(*columns, *payload_head(t.c.payload))
                .where(undelivered(found.queue_id), t.c.seq > after)
                .order_by(t.c.seq)
                .limit(limit)
            ).all()
        return [
            StoredEntry(
                position=int(r.source_position),
                type=int(r.type),
                client_name=found.client_name,
                payload=bytes(r.head),
                size=int(r.size),
                snapshot_id=r.snapshot_id,
                created_at=r.received_at,
                seq=int(r.seq),
            )
            for r in rows
        ]


__all__ = ["BROWSE_HEAD_BYTES", "InspectionStore", "SinkBacklog", "SinkFailures", "payload_head"]
