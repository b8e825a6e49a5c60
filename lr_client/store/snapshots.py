"""The :class:`~lr_client.store.contract.Snapshots` role, part one: snapshot requests.

A request is REQUESTED, then RUNNING while a provider writes its entries
(:mod:`~lr_client.store.snapshot_entries`), READY once its end marker is
written, and COMPLETED once the sink has it all (or CANCELLED, FAILED). It
takes a slot for its entries when it starts, and gives it back once they are
released after its end (:mod:`~lr_client.store.snapshot_pool`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection, Row

from lr_client.names import validate_name
from lr_client.records import OPEN_SNAPSHOT_STATUSES, Fence, SnapshotRequest, SnapshotStatus
from lr_client.store import schema as s
from lr_client.store.snapshot_pool import SnapshotPoolStore


class SnapshotRequestsStore(SnapshotPoolStore):
    """Snapshot requests and their lifecycle."""

    @staticmethod
    def _snapshot(row: Row[Any]) -> SnapshotRequest:
        return SnapshotRequest(
            snapshot_id=row.snapshot_id,
            destination=row.destination,
            client_name=row.client_name,
            status=SnapshotStatus(row.status),
            base_position=row.base_position,
            reason=row.reason,
            rows_written=row.rows_written,
            entry_count=row.entry_count,
            shipped_position=row.shipped_position,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def request_snapshot(
        self, conn: Connection | None, destination: str, client_name: str, reason: str = ""
    ) -> str:
        validate_name(destination, "site id")
        validate_name(client_name, "client name")
        if conn is None:
            with self.write() as own:
                return self._request_snapshot(own, destination, client_name, reason, True)
        return self._request_snapshot(conn, destination, client_name, reason, False)

    def _request_snapshot(
        self, conn: Connection, destination: str, client_name: str, reason: str, own: bool
    ) -> str:
        """Record a request, ending the stream's open one.

        In the application's transaction (not ``own``) the superseded request
        only ends: trim releases its entries, so that transaction takes no
        lock of theirs (PostgreSQL: its partition's).
        """
        now = time.time()
        snapshot_id = uuid.uuid4().hex
        stale = (
            conn.execute(
                select(s.snapshots.c.snapshot_id).where(
                    s.snapshots.c.destination == destination,
                    s.snapshots.c.client_name == client_name,
                    s.snapshots.c.status.in_([x.value for x in OPEN_SNAPSHOT_STATUSES]),
                )
            )
            .scalars()
            .all()
        )
        for old in stale:
            self._cancel(conn, old, f"superseded by {snapshot_id}", release=own)
        conn.execute(
            insert(s.snapshots).values(
                snapshot_id=snapshot_id,
                destination=destination,
                client_name=client_name,
                status=SnapshotStatus.REQUESTED.value,
                reason=reason,
                rows_written=0,
                shipped_position=0,
                created_at=now,
                updated_at=now,
            )
        )
        return snapshot_id

    def get_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        with self.read() as conn:
            row = conn.execute(
                select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).first()
        return self._snapshot(row) if row else None

    def list_snapshots(
        self,
        destination: str | None = None,
        client_name: str | None = None,
        statuses: Sequence[SnapshotStatus] | None = None,
    ) -> list[SnapshotRequest]:
        query = select(s.snapshots)
        if destination is not None:
            query = query.where(s.snapshots.c.destination == destination)
        if client_name is not None:
            query = query.where(s.snapshots.c.client_name == client_name)
        if statuses is not None:
            query = query.where(s.snapshots.c.status.in_([x.value for x in statuses]))
        query = query.order_by(s.snapshots.c.created_at.desc())
        with self.read() as conn:
            return [self._snapshot(r) for r in conn.execute(query).all()]

    def open_snapshots(
        self, destination: str, client_names: Sequence[str]
    ) -> dict[str, SnapshotRequest]:
        t = s.snapshots
        query = (
            select(t)
            .where(
                t.c.destination == destination,
                t.c.client_name.in_(list(client_names)),
                t.c.status.in_([x.value for x in OPEN_SNAPSHOT_STATUSES]),
            )
            .order_by(t.c.created_at.desc())
        )
        found: dict[str, SnapshotRequest] = {}
        with self.read() as conn:
            for row in conn.execute(query).all():
                found.setdefault(row.client_name, self._snapshot(row))  # the newest
        return found

    def update_snapshot(
        self,
        snapshot_id: str,
        *,
        expect: Sequence[SnapshotStatus] | None = None,
        **values: object,
    ) -> bool:
        with self.write() as conn:
            return self._update_snapshot(conn, snapshot_id, expect, values)

    def _update_snapshot(
        self,
        conn: Connection,
        snapshot_id: str,
        expect: Sequence[SnapshotStatus] | None,
        values: dict[str, object],
    ) -> bool:
        values = {k: (v.value if isinstance(v, SnapshotStatus) else v) for k, v in values.items()}
        values["updated_at"] = time.time()
        query = update(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
        if expect is not None:
            query = query.where(s.snapshots.c.status.in_([x.value for x in expect]))
        return bool(conn.execute(query.values(**values)).rowcount)

    def start_snapshot(self, snapshot_id: str) -> SnapshotRequest | None:
        # PostgreSQL: what committed before the start gets its position first,
        # so the base covers it (and it is not replayed after the snapshot).
        self.sequence()
        with self.write() as conn:
            base = self.head_position(conn)
            ok = self._update_snapshot(
                conn,
                snapshot_id,
                [SnapshotStatus.REQUESTED],
                {"status": SnapshotStatus.RUNNING, "base_position": base},
            )
            if not ok:
                return None
            self._take_slot(conn, snapshot_id)
            row = conn.execute(
                select(s.snapshots).where(s.snapshots.c.snapshot_id == snapshot_id)
            ).one()
        return self._snapshot(row)

    def heartbeat_snapshot(self, snapshot_id: str) -> bool:
        return self.update_snapshot(snapshot_id, expect=[SnapshotStatus.RUNNING])

    def fail_stalled_snapshot(self, snapshot_id: str, silent_since: float, reason: str) -> bool:
        t = s.snapshots
        with self.write() as conn:
            failed = conn.execute(
                update(t)
                .where(
                    t.c.snapshot_id == snapshot_id,
                    t.c.status == SnapshotStatus.RUNNING.value,
                    t.c.updated_at < silent_since,
                )
                .values(status=SnapshotStatus.FAILED.value, reason=reason, updated_at=time.time())
            ).rowcount
            if failed:
                self._release_entries(conn, snapshot_id)
        return bool(failed)

    def set_snapshot_progress(self, snapshot_id: str, rows_written: int) -> None:
        self.update_snapshot(
            snapshot_id, expect=[SnapshotStatus.RUNNING], rows_written=rows_written
        )

    def _cancel(
        self, conn: Connection, snapshot_id: str, reason: str, release: bool = True
    ) -> bool:
        """Cancel an open request; release its entries (``release``: also of an ended one)."""
        ok = self._update_snapshot(
            conn,
            snapshot_id,
            OPEN_SNAPSHOT_STATUSES,
            {"status": SnapshotStatus.CANCELLED, "reason": reason},
        )
        if release:
            self._release_entries(conn, snapshot_id)
        return ok

    def cancel_snapshot(self, snapshot_id: str, reason: str = "cancelled") -> bool:
        with self.write() as conn:
            return self._cancel(conn, snapshot_id, reason)

    def complete_snapshot(self, snapshot_id: str, fence: Fence | None = None) -> bool:
        """READY -> COMPLETED: the sink has it all; release its entries."""
        with self.write() as conn:
            self._fence(conn, fence)
            ok = self._update_snapshot(
                conn, snapshot_id, [SnapshotStatus.READY], {"status": SnapshotStatus.COMPLETED}
            )
            self._release_entries(conn, snapshot_id)
        return ok


__all__ = ["SnapshotRequestsStore"]
