"""The :class:`~lr_client.store.contract.SnapshotRequests` role, part one: snapshot requests.

A snapshot of a client is shared: it is written once and read by every
destination that joined it (``lrq_snapshot_destinations``, revision 0009);
its lifecycle is in :mod:`~lr_client.store.snapshots.lifecycle`.

**The join rule.** A destination that asks for a full sync of a client joins
the client's oldest open snapshot it can use, else starts the next one:

* a REQUESTED snapshot: always (its base position is fixed when it starts,
  at the head of the send log, and the log after it is held for every
  destination in it);
* a RUNNING or READY snapshot with base position ``B``: only if the
  destination has a cursor for the client at or below ``B`` and no drop
  record. Its sink applies the snapshot as of ``B``, then log entries from
  ``B + 1``: the send log holds everything after a destination's cursor for
  it (and, once it joined, after ``B``), but not for a dropped stream, nor
  entries routed before a new destination had a cursor. The cursor's row is
  locked while joining, so an ack cannot move it past ``B`` before trim sees
  the joined base.

A destination never rejoins a snapshot it left: asking again supersedes its
open request (it leaves that snapshot, which goes on for the others).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection

from lr_client.names import validate_name
from lr_client.records import DropRecord, SnapshotRequest, SnapshotStatus
from lr_client.store.schema import tables as s
from lr_client.store.send.drops import read_drops
from lr_client.store.snapshots.lifecycle import SnapshotLifecycleStore
from lr_client.store.snapshots.views import (
    OPEN_VALUES,
    destination_views,
    snapshot_view,
    view_query,
)

#: The open requests of some clients of a destination, newest first: built once (a
#: sender runs it after each read).
_OPEN_OF = (
    view_query()
    .where(
        s.snapshot_destinations.c.destination == bindparam("destination"),
        s.snapshot_destinations.c.client_name.in_(bindparam("clients", expanding=True)),
        s.snapshot_destinations.c.status.in_(OPEN_VALUES),
    )
    .order_by(s.snapshot_destinations.c.created_at.desc())
)


class SnapshotRequestsStore(SnapshotLifecycleStore):
    """Shared snapshots, the destinations in each, and their lifecycle."""

    # -- requests -------------------------------------------------------------------------
    def request_snapshot(
        self, conn: Connection | None, destination: str, client_name: str, reason: str = ""
    ) -> str:
        validate_name(destination, "site id")
        validate_name(client_name, "client name")
        if conn is None:
            with self.core.write() as own:
                return self._request_snapshot(own, destination, client_name, reason, True)
        return self._request_snapshot(conn, destination, client_name, reason, False)

    def _request_snapshot(
        self, conn: Connection, destination: str, client_name: str, reason: str, own: bool
    ) -> str:
        """Join a snapshot of the client (or start the next), leaving the stream's open one.

        In the application's transaction (not ``own``) a snapshot the stream
        left that has nobody else only ends: trim releases its entries, so
        that transaction takes no lock of theirs (PostgreSQL: its partition's).
        """
        self.core.lock_requests(conn, client_name)  # two asking at once share one snapshot
        now = time.time()
        d, j = s.snapshot_destinations, s.snapshots
        left = set(
            conn.execute(
                select(d.c.snapshot_id).where(
                    d.c.destination == destination, d.c.client_name == client_name
                )
            ).scalars()
        )
        chosen = self._joinable(conn, destination, client_name, left)
        snapshot_id = chosen or uuid.uuid4().hex
        stale = (
            conn.execute(
                select(d.c.snapshot_id).where(
                    d.c.destination == destination,
                    d.c.client_name == client_name,
                    d.c.status.in_(OPEN_VALUES),
                )
            )
            .scalars()
            .all()
        )
        for old in stale:
            self._leave(conn, old, destination, f"superseded by {snapshot_id}", release=own)
        if chosen is None:
            conn.execute(
                insert(j).values(
                    snapshot_id=snapshot_id,
                    client_name=client_name,
                    status=SnapshotStatus.REQUESTED.value,
                    reason=reason,
                    rows_written=0,
                    created_at=now,
                    updated_at=now,
                )
            )
            status = SnapshotStatus.REQUESTED.value
        else:
            status = conn.execute(
                select(j.c.status).where(j.c.snapshot_id == snapshot_id)
            ).scalar_one()
        conn.execute(
            insert(d).values(
                snapshot_id=snapshot_id,
                destination=destination,
                client_name=client_name,
                status=status,
                reason=reason,
                shipped_position=0,
                created_at=now,
                updated_at=now,
            )
        )
        self.core.announce_sends(conn)
        return snapshot_id

    def _joinable(
        self, conn: Connection, destination: str, client_name: str, exclude: set[str]
    ) -> str | None:
        """The client's oldest open snapshot the destination may join (module docstring)."""
        j = s.snapshots
        candidates = [
            sid
            for sid in conn.execute(
                select(j.c.snapshot_id)
                .where(j.c.client_name == client_name, j.c.status.in_(OPEN_VALUES))
                .order_by(j.c.created_at)
            ).scalars()
            if sid not in exclude
        ]
        if not candidates:
            return None
        cursor: int | None = None
        dropped = (
            conn.execute(
                select(s.drops.c.destination).where(
                    s.drops.c.destination == destination, s.drops.c.client_name == client_name
                )
            ).first()
            is not None
        )
        if not dropped:
            c = s.cursors.c
            cursor = conn.execute(
                select(c.position)
                .where(c.destination == destination, c.client_name == client_name)
                .with_for_update()
            ).scalar()
        for sid in candidates:
            # Locked: a start waits for the join (and counts it in), or it sees the base.
            r = conn.execute(
                select(j.c.status, j.c.base_position)
                .where(j.c.snapshot_id == sid)
                .with_for_update()
            ).first()
            if r is None or r.status not in OPEN_VALUES:
                continue
            if r.status == SnapshotStatus.REQUESTED.value:
                return str(sid)
            if cursor is not None and r.base_position is not None and cursor <= r.base_position:
                return str(sid)
        return None

    def get_snapshot(
        self, snapshot_id: str, destination: str | None = None
    ) -> SnapshotRequest | None:
        with self.core.read() as conn:
            if destination is None:
                return snapshot_view(conn, snapshot_id)
            d = s.snapshot_destinations
            row = conn.execute(
                view_query().where(d.c.snapshot_id == snapshot_id, d.c.destination == destination)
            ).first()
            return destination_views(conn, [row])[0] if row else None

    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
        limit: int | None = None,
    ) -> list[SnapshotRequest]:
        d = s.snapshot_destinations
        query = view_query()
        if destination is not None:
            query = query.where(d.c.destination == destination)
        if client_name is not None:
            query = query.where(d.c.client_name == client_name)
        if statuses is not None:
            query = query.where(d.c.status.in_([x.value for x in statuses]))
        query = query.order_by(d.c.created_at.desc(), d.c.destination).limit(limit)
        with self.core.read_statements() as conn:  # read by every round's request board
            return destination_views(conn, conn.execute(query).all())

    def open_snapshots(
        self, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        with self.core.read() as conn:
            return self._open_snapshots(conn, destination, client_names)

    def _open_snapshots(
        self, conn: Connection, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        rows = conn.execute(_OPEN_OF, {"destination": destination, "clients": list(client_names)})
        found: dict[str, SnapshotRequest] = {}
        for view in destination_views(conn, rows.all()):
            found.setdefault(view.client_name, view)  # the newest
        return found

    def send_checks(
        self, destination: str, client_names: Sequence[str]
    ) -> tuple[dict[str, SnapshotRequest], dict[str, DropRecord]]:
        with self.core.read_statements() as conn:
            requests = self._open_snapshots(conn, destination, client_names)
            drops = {d.client_name: d for d in read_drops(conn, destination)}
        return requests, drops


__all__ = ["SnapshotRequestsStore"]
