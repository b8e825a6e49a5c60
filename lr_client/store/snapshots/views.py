"""Views of a shared snapshot: each destination's, and the snapshot's own.

A destination's row (``lrq_snapshot_destinations``) holds what is its own (its
status, reason and how far it shipped it); the snapshot's row
(``lrq_snapshots``) the rest. A :class:`~lr_client.records.SnapshotRequest`
joins the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Row

from lr_client.records import OPEN_SNAPSHOT_STATUSES, SnapshotRequest, SnapshotStatus
from lr_client.store.schema import tables as s

#: The open statuses, as stored.
OPEN_VALUES = [x.value for x in OPEN_SNAPSHOT_STATUSES]


def view_query() -> Any:
    """Each destination's view: its row joined to its snapshot's."""
    d, j = s.snapshot_destinations, s.snapshots
    return select(
        d.c.snapshot_id,
        d.c.destination,
        d.c.client_name,
        d.c.status,
        d.c.reason,
        d.c.shipped_position,
        d.c.created_at,
        j.c.base_position,
        j.c.rows_written,
        j.c.entry_count,
        j.c.updated_at,
    ).select_from(d.join(j, j.c.snapshot_id == d.c.snapshot_id))


def open_destinations(conn: Connection, snapshot_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """{snapshot id: its open destinations, in the order they joined}."""
    d = s.snapshot_destinations
    out: dict[str, list[str]] = {}
    ids = list(dict.fromkeys(snapshot_ids))
    for i in range(0, len(ids), 500):
        rows = conn.execute(
            select(d.c.snapshot_id, d.c.destination)
            .where(d.c.snapshot_id.in_(ids[i : i + 500]), d.c.status.in_(OPEN_VALUES))
            .order_by(d.c.created_at, d.c.destination)
        ).all()
        for r in rows:
            out.setdefault(r.snapshot_id, []).append(r.destination)
    return {k: tuple(v) for k, v in out.items()}


def destination_views(conn: Connection, rows: Sequence[Row[Any]]) -> list[SnapshotRequest]:
    """The views of rows of :func:`view_query`, each with its snapshot's open destinations."""
    members = open_destinations(conn, [r.snapshot_id for r in rows])
    return [
        SnapshotRequest(
            snapshot_id=r.snapshot_id,
            destination=r.destination,
            client_name=r.client_name,
            status=SnapshotStatus(r.status),
            base_position=r.base_position,
            reason=r.reason,
            rows_written=r.rows_written,
            entry_count=r.entry_count,
            shipped_position=r.shipped_position,
            created_at=r.created_at,
            updated_at=r.updated_at,
            destinations=members.get(r.snapshot_id, ()),
        )
        for r in rows
    ]


def snapshot_view(conn: Connection, snapshot_id: str) -> SnapshotRequest | None:
    """The snapshot's own view: its status; its first destination."""
    row = conn.execute(select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)).first()
    if row is None:
        return None
    d = s.snapshot_destinations
    views = conn.execute(
        select(d.c.destination, d.c.status, d.c.shipped_position)
        .where(d.c.snapshot_id == snapshot_id)
        .order_by(d.c.created_at, d.c.destination)
    ).all()
    open_ones = tuple(v.destination for v in views if v.status in OPEN_VALUES)
    first = open_ones[0] if open_ones else (views[0].destination if views else "")
    # How far every destination still in it has shipped it (all done: the furthest).
    shipped = [v.shipped_position for v in views if v.status in OPEN_VALUES] or [
        v.shipped_position for v in views
    ]
    return SnapshotRequest(
        snapshot_id=row.snapshot_id,
        destination=first,
        client_name=row.client_name,
        status=SnapshotStatus(row.status),
        base_position=row.base_position,
        reason=row.reason,
        rows_written=row.rows_written,
        entry_count=row.entry_count,
        shipped_position=min(shipped) if open_ones else max(shipped, default=0),
        created_at=row.created_at,
        updated_at=row.updated_at,
        destinations=open_ones,
    )


__all__ = ["OPEN_VALUES", "destination_views", "open_destinations", "snapshot_view", "view_query"]
