"""The :class:`~lr_client.store.contract.SnapshotRequests` role, part two: the lifecycle.

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
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from lr_client.cascade_roles import CascadeRole
from lr_client.records import OPEN_SNAPSHOT_STATUSES, Fence, SnapshotRequest, SnapshotStatus
from lr_client.store.cascade.relays import relay_delivered, relay_head
from lr_client.store.schema import tables as s
from lr_client.store.snapshots.pool import SnapshotPoolStore
from lr_client.store.snapshots.views import OPEN_VALUES, snapshot_view

#: Columns that are each destination's own; every other one is the snapshot's.
_DESTINATION_COLUMNS = frozenset({"status", "reason", "shipped_position"})


class SnapshotLifecycleStore(SnapshotPoolStore):
    """A shared snapshot's changes: started, kept alive, failed, cancelled, completed."""

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
                .where(d.c.snapshot_id == snapshot_id, d.c.status.in_(OPEN_VALUES))
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
        if row is None or row.status not in OPEN_VALUES:
            return
        seen = set(conn.execute(select(d.c.status).where(d.c.snapshot_id == snapshot_id)).scalars())
        if seen & set(OPEN_VALUES):
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
                    d.c.status.in_(OPEN_VALUES),
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
            return snapshot_view(conn, snapshot_id)

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


__all__ = ["SnapshotLifecycleStore"]
