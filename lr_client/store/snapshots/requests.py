"""The :class:`~lr_client.store.contract.Snapshots` role, part one: snapshot requests.

A snapshot of a client is shared: it is written once and read by every
destination that joined it (``lrq_snapshot_destinations``, revision 0009).
A snapshot is REQUESTED, then RUNNING while a provider writes its entries
(:mod:`~lr_client.store.snapshots.entries`), READY once its end marker is
written, and COMPLETED once every destination still in it has it all (or
CANCELLED, FAILED). Each destination has its own view: while open it
follows the snapshot's status; it ends on its own (COMPLETED once its sink
has it all, CANCELLED when it leaves), and the snapshot ends when its last
open destination does. The snapshot takes a slot for its entries when it
starts and gives it back once they are released after its end
(:mod:`~lr_client.store.snapshots.pool`): never while a destination still
needs them.

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
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.engine import Connection, Row

from lr_client.cascade_roles import CascadeRole
from lr_client.names import validate_name
from lr_client.records import (
    OPEN_SNAPSHOT_STATUSES,
    DropRecord,
    Fence,
    SnapshotRequest,
    SnapshotStatus,
)
from lr_client.store.cascade.relays import relay_delivered, relay_head
from lr_client.store.schema import tables as s
from lr_client.store.send.drops import read_drops
from lr_client.store.snapshots.pool import SnapshotPoolStore

_OPEN = [x.value for x in OPEN_SNAPSHOT_STATUSES]
#: Columns that are each destination's own; every other one is the snapshot's.
_DESTINATION_COLUMNS = frozenset({"status", "reason", "shipped_position"})


def _view_query() -> Any:
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


#: The open requests of some clients of a destination, newest first: built once (a
#: sender runs it after each read).
_OPEN_OF = (
    _view_query()
    .where(
        s.snapshot_destinations.c.destination == bindparam("destination"),
        s.snapshot_destinations.c.client_name.in_(bindparam("clients", expanding=True)),
        s.snapshot_destinations.c.status.in_(_OPEN),
    )
    .order_by(s.snapshot_destinations.c.created_at.desc())
)


class SnapshotRequestsStore(SnapshotPoolStore):
    """Shared snapshots, the destinations in each, and their lifecycle."""

    # -- views ----------------------------------------------------------------------------
    @staticmethod
    def _members(conn: Connection, snapshot_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """{snapshot id: its open destinations, in the order they joined}."""
        d = s.snapshot_destinations
        out: dict[str, list[str]] = {}
        ids = list(dict.fromkeys(snapshot_ids))
        for i in range(0, len(ids), 500):
            rows = conn.execute(
                select(d.c.snapshot_id, d.c.destination)
                .where(d.c.snapshot_id.in_(ids[i : i + 500]), d.c.status.in_(_OPEN))
                .order_by(d.c.created_at, d.c.destination)
            ).all()
            for r in rows:
                out.setdefault(r.snapshot_id, []).append(r.destination)
        return {k: tuple(v) for k, v in out.items()}

    def _views(self, conn: Connection, rows: Sequence[Row[Any]]) -> list[SnapshotRequest]:
        members = self._members(conn, [r.snapshot_id for r in rows])
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

    def _snapshot_view(self, conn: Connection, snapshot_id: str) -> SnapshotRequest | None:
        """The snapshot's own view: its status; its first destination."""
        row = conn.execute(
            select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
        ).first()
        if row is None:
            return None
        d = s.snapshot_destinations
        views = conn.execute(
            select(d.c.destination, d.c.status, d.c.shipped_position)
            .where(d.c.snapshot_id == snapshot_id)
            .order_by(d.c.created_at, d.c.destination)
        ).all()
        open_ones = tuple(v.destination for v in views if v.status in _OPEN)
        first = open_ones[0] if open_ones else (views[0].destination if views else "")
        # How far every destination still in it has shipped it (all done: the furthest).
        shipped = [v.shipped_position for v in views if v.status in _OPEN] or [
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
                    d.c.status.in_(_OPEN),
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
                .where(j.c.client_name == client_name, j.c.status.in_(_OPEN))
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
            if r is None or r.status not in _OPEN:
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
                return self._snapshot_view(conn, snapshot_id)
            d = s.snapshot_destinations
            row = conn.execute(
                _view_query().where(d.c.snapshot_id == snapshot_id, d.c.destination == destination)
            ).first()
            return self._views(conn, [row])[0] if row else None

    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
        limit: int | None = None,
    ) -> list[SnapshotRequest]:
        d = s.snapshot_destinations
        query = _view_query()
        if destination is not None:
            query = query.where(d.c.destination == destination)
        if client_name is not None:
            query = query.where(d.c.client_name == client_name)
        if statuses is not None:
            query = query.where(d.c.status.in_([x.value for x in statuses]))
        query = query.order_by(d.c.created_at.desc(), d.c.destination).limit(limit)
        with self.core.read() as conn:
            return self._views(conn, conn.execute(query).all())

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
        for view in self._views(conn, rows.all()):
            found.setdefault(view.client_name, view)  # the newest
        return found

    def send_checks(
        self, destination: str, client_names: Sequence[str]
    ) -> tuple[dict[str, SnapshotRequest], dict[str, DropRecord]]:
        with self.core.read_statements() as conn:
            requests = self._open_snapshots(conn, destination, client_names)
            drops = {d.client_name: d for d in read_drops(conn, destination)}
        return requests, drops

    # -- changes --------------------------------------------------------------------------
    def update_snapshot(
        self,
        snapshot_id: str,
        *,
        expect: Sequence[SnapshotStatus] | None = None,
        destination: str | None = None,
        **values: object,
    ) -> bool:
        with self.core.write() as conn:
            if destination is None:
                return self.change_snapshot(conn, snapshot_id, expect, values)
            return self._update_destination(conn, snapshot_id, destination, expect, values)

    def change_snapshot(
        self,
        conn: Connection,
        snapshot_id: str,
        expect: Sequence[SnapshotStatus] | None,
        values: dict[str, object],
    ) -> bool:
        """Change the snapshot; a new status (and reason) goes to its open destinations too."""
        values = {k: (v.value if isinstance(v, SnapshotStatus) else v) for k, v in values.items()}
        now = time.time()
        own = {k: v for k, v in values.items() if k != "shipped_position"}
        own["updated_at"] = now
        if "status" in own:  # an end waits for writers in flight (their FOR KEY SHARE)
            conn.execute(
                select(s.snapshots.c.snapshot_id)
                .where(s.snapshots.c.snapshot_id == snapshot_id)
                .with_for_update()
            )
        query = update(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
        if expect is not None:
            query = query.where(s.snapshots.c.status.in_([x.value for x in expect]))
        if not conn.execute(query.values(**own)).rowcount:
            return False
        if "status" in own:  # a session may have a step to take
            self.core.announce_sends(conn)
        theirs = {k: v for k, v in values.items() if k in _DESTINATION_COLUMNS}
        if theirs:
            d = s.snapshot_destinations
            conn.execute(
                update(d)
                .where(d.c.snapshot_id == snapshot_id, d.c.status.in_(_OPEN))
                .values(**theirs, updated_at=now)
            )
        return True

    def _update_destination(
        self,
        conn: Connection,
        snapshot_id: str,
        destination: str,
        expect: Sequence[SnapshotStatus] | None,
        values: dict[str, object],
    ) -> bool:
        """Change one destination's view; the snapshot ends if that was its last open one."""
        values = {k: (v.value if isinstance(v, SnapshotStatus) else v) for k, v in values.items()}
        unknown = set(values) - _DESTINATION_COLUMNS
        if unknown:
            raise ValueError(f"not a destination's own: {', '.join(sorted(unknown))}")
        d = s.snapshot_destinations
        query = update(d).where(d.c.snapshot_id == snapshot_id, d.c.destination == destination)
        if expect is not None:
            query = query.where(d.c.status.in_([x.value for x in expect]))
        ok = bool(conn.execute(query.values(**values, updated_at=time.time())).rowcount)
        if ok and "status" in values:
            self._settle(conn, snapshot_id, str(values.get("reason") or ""))
        return ok

    def _settle(self, conn: Connection, snapshot_id: str, reason: str = "") -> None:
        """End an open snapshot none of whose destinations is open: COMPLETED if it was READY
        and a destination completed it, else CANCELLED (for ``reason``, the last one's to
        leave); its entries are the caller's to release (else trim's)."""
        self.core.announce_sends(conn)  # a destination's view changed: its session has a step
        d, j = s.snapshot_destinations, s.snapshots
        row = conn.execute(
            select(j.c.status).where(j.c.snapshot_id == snapshot_id).with_for_update()
        ).first()
        if row is None or row.status not in _OPEN:
            return
        seen = set(conn.execute(select(d.c.status).where(d.c.snapshot_id == snapshot_id)).scalars())
        if seen & set(_OPEN):
            return
        if row.status == SnapshotStatus.READY.value and SnapshotStatus.COMPLETED.value in seen:
            final = SnapshotStatus.COMPLETED
        else:
            final = SnapshotStatus.CANCELLED
            reason = reason or "no destination left in it"
        values = {"status": final.value, "updated_at": time.time(), "reason": reason}
        if final is SnapshotStatus.COMPLETED:
            del values["reason"]
        conn.execute(update(j).where(j.c.snapshot_id == snapshot_id).values(**values))

    def _leave(
        self, conn: Connection, snapshot_id: str, destination: str, reason: str, release: bool
    ) -> bool:
        """Cancel one destination's open view; the snapshot goes on for the others."""
        d = s.snapshot_destinations
        ok = bool(
            conn.execute(
                update(d)
                .where(
                    d.c.snapshot_id == snapshot_id,
                    d.c.destination == destination,
                    d.c.status.in_(_OPEN),
                )
                .values(
                    status=SnapshotStatus.CANCELLED.value, reason=reason, updated_at=time.time()
                )
            ).rowcount
        )
        self._settle(conn, snapshot_id, reason)
        if release:  # also retries the release of an ended snapshot's entries
            self._release_entries(conn, snapshot_id)
        return ok

    def start_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        # PostgreSQL: what committed before the start gets its position first,
        # so the base covers it (and it is not replayed after the snapshot).
        self.core.sequence()
        with self.core.write() as conn:
            base = self._snapshot_base(conn, snapshot_id)
            ok = self.change_snapshot(
                conn,
                snapshot_id,
                [SnapshotStatus.REQUESTED],
                {"status": SnapshotStatus.RUNNING, "base_position": base},
            )
            if not ok:
                return None
            self._take_slot(conn, snapshot_id)
            return self._snapshot_view(conn, snapshot_id)

    def _snapshot_base(self, conn: Connection, snapshot_id: str) -> int:
        """The base of a snapshot starting now: the head of the send log, or for a client
        this node relays (a branch of a cascade), the origin position of the last entry
        it stored of it, past what any node below may hold; the provider reads once the
        branch's subscriber has delivered that far (:meth:`snapshot_base_applied`; see
        docs/cascading.md)."""
        node = self._relayed_node(conn, snapshot_id)
        if node is not None:
            client, origin = node
            return max(relay_delivered(conn, client, origin), relay_head(conn, client, origin))
        return self.core.head_position(conn)

    @staticmethod
    def _relayed_node(conn: Connection, snapshot_id: str) -> tuple[str, str] | None:
        """(client, origin) of a snapshot of a client this node relays, else None."""
        client = conn.execute(
            select(s.snapshots.c.client_name).where(s.snapshots.c.snapshot_id == snapshot_id)
        ).scalar()
        c = s.cascade
        node = conn.execute(
            select(c.c.role, c.c.origin_id).where(c.c.client_name == client)
        ).first()
        if node is None or node.role != CascadeRole.BRANCH:
            return None
        return str(client), str(node.origin_id)

    def snapshot_base_applied(self, snapshot_id: str) -> bool:
        with self.core.read() as conn:
            base = conn.execute(
                select(s.snapshots.c.base_position).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).scalar()
            if base is None:
                return False
            node = self._relayed_node(conn, snapshot_id)
            return node is None or relay_delivered(conn, *node) >= int(base)

    def heartbeat_snapshot(self, snapshot_id: str) -> bool:
        return self.update_snapshot(snapshot_id, expect=[SnapshotStatus.RUNNING])

    def fail_stalled_snapshot(self, snapshot_id: str, silent_since: float, reason: str) -> bool:
        t = s.snapshots
        with self.core.write() as conn:
            silent = conn.execute(
                select(t.c.snapshot_id).where(
                    t.c.snapshot_id == snapshot_id,
                    t.c.status == SnapshotStatus.RUNNING.value,
                    t.c.updated_at < silent_since,
                )
            ).first()
            failed = silent is not None and self.change_snapshot(
                conn,
                snapshot_id,
                [SnapshotStatus.RUNNING],
                {"status": SnapshotStatus.FAILED, "reason": reason},
            )
            if failed:
                self._release_entries(conn, snapshot_id)
        return failed

    def _cancel(
        self, conn: Connection, snapshot_id: str, reason: str, release: bool = True
    ) -> bool:
        """Cancel an open snapshot for all; release its entries (``release``: also if ended)."""
        ok = self.change_snapshot(
            conn,
            snapshot_id,
            OPEN_SNAPSHOT_STATUSES,
            {"status": SnapshotStatus.CANCELLED, "reason": reason},
        )
        if release:
            self._release_entries(conn, snapshot_id)
        return ok

    def cancel_snapshot(
        self, snapshot_id: str, reason: str = "cancelled", destination: str | None = None
    ) -> bool:
        with self.core.write() as conn:
            if destination is None:
                return self._cancel(conn, snapshot_id, reason)
            return self._leave(conn, snapshot_id, destination, reason, release=True)

    def complete_snapshot(
        self, snapshot_id: str, destination: str | None = None, fence: Fence | None = None
    ) -> bool:
        """READY -> COMPLETED for the destination (None: all); the last one releases the entries."""
        d = s.snapshot_destinations
        with self.core.write() as conn:
            self.core.hold_fence(conn, fence)
            query = update(d).where(
                d.c.snapshot_id == snapshot_id, d.c.status == SnapshotStatus.READY.value
            )
            if destination is not None:
                query = query.where(d.c.destination == destination)
            ok = bool(
                conn.execute(
                    query.values(status=SnapshotStatus.COMPLETED.value, updated_at=time.time())
                ).rowcount
            )
            self._settle(conn, snapshot_id)
            self._release_entries(conn, snapshot_id)
        return ok


__all__ = ["SnapshotRequestsStore"]
