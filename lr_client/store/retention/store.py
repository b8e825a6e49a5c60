"""The :class:`~lr_client.store.contract.Retention` role: trim, drops, stops, flow control.

Written by the server's retention policy and the sender sessions' edge
cases; the dialects implement the trim itself (``trim_send_log``) over
:meth:`RetentionStore.acked_positions`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, delete, insert, select, update
from sqlalchemy.engine import Connection, Row

from lr_client.cascade_roles import CascadeRole
from lr_client.records import OPEN_SNAPSHOT_STATUSES, DropRecord, Fence, QueueSlot, StreamStop
from lr_client.store.schema import tables as s
from lr_client.store.send.drops import drop_record, read_drops
from lr_client.store.snapshots.pool import SnapshotPoolStore


class RetentionStore(SnapshotPoolStore):
    """What the send queue keeps, and the records of streams it gave up."""

    @property
    def rotation_period(self) -> float:
        """PostgreSQL: seconds a send queue slot stays current before a trim closes it."""
        return self.core.rotation_period

    @rotation_period.setter
    def rotation_period(self, seconds: float) -> None:
        self.core.rotation_period = seconds

    @property
    def max_slots(self) -> int:
        """PostgreSQL: slots are added while the others are pinned, up to this many."""
        return self.core.max_slots

    @max_slots.setter
    def max_slots(self, count: int) -> None:
        self.core.max_slots = count

    def rotate_send_log(self) -> int | None:
        """PostgreSQL: close the current slot now (if it holds entries); the new current
        slot. SQLite trims rows: None."""
        return self.core.rotate_send_log()

    def send_slots(self) -> list[QueueSlot]:
        """PostgreSQL: the send queue's slots (current, entries, bytes); SQLite: none."""
        return self.core.send_slots()

    def trim(
        self, batch_size: int = 5000, max_batches: int | None = None, fence: Fence | None = None
    ) -> int:
        if fence is not None:
            with self.core.write() as conn:
                self.core.hold_fence(conn, fence)
        total = self.core.trim_send_log(batch_size, max_batches, self)
        # Entries of finished snapshots that are still stored (a release that
        # found them locked, a snapshot ended by update_snapshot alone).
        return total + self._sweep_finished_snapshots()

    @staticmethod
    def _trim_sites(conn: Connection) -> dict[str, int]:
        """Every registered site, read in the trim's transaction.

        Not this store's cache: an application may have registered a
        destination since, and its entries must be judged by its tags too.
        """
        rows = conn.execute(select(s.sites.c.site_id, s.sites.c.site_num)).all()
        return {r.site_id: r.site_num for r in rows}

    def acked_positions(self, conn: Connection) -> dict[tuple[int, str], int]:
        """{(site number, client): position below which the stream needs nothing}."""
        rows = conn.execute(select(s.cursors)).all()
        nums = self._trim_sites(conn)
        out: dict[tuple[int, str], int] = {}
        for r in rows:
            if r.destination in nums:
                out[(nums[r.destination], r.client_name)] = r.position
        # A stream with an open snapshot needs everything after its base
        # position: log entries resume from there once the snapshot is shipped.
        # A dropped stream needs nothing until such a base is fixed.
        # A shared snapshot holds the log after its base for each destination in it.
        d, j = s.snapshot_destinations, s.snapshots
        bases: dict[tuple[str, str], int] = {}
        for r in conn.execute(
            select(d.c.destination, d.c.client_name, j.c.base_position)
            .select_from(d.join(j, j.c.snapshot_id == d.c.snapshot_id))
            .where(
                d.c.status.in_([x.value for x in OPEN_SNAPSHOT_STATUSES]),
                j.c.base_position.is_not(None),
            )
        ).all():
            key = (r.destination, r.client_name)
            bases[key] = min(bases.get(key, r.base_position), r.base_position)
        for r in conn.execute(select(s.drops)).all():
            if r.destination in nums:
                out[(nums[r.destination], r.client_name)] = 2**62
        for (dest, client), base in bases.items():
            if dest in nums:
                key = (nums[dest], client)
                out[key] = min(out.get(key, 0), base)
        # The root of a cascaded client trims it only at or below the set's global
        # watermark: a node below a child may still need what the child has.
        c = s.cascade
        caps = {
            r.client_name: int(r.global_watermark)
            for r in conn.execute(
                select(c.c.client_name, c.c.global_watermark).where(
                    c.c.role == CascadeRole.ROOT.value
                )
            )
        }
        # Its entries go to every node of the set whatever sites they name, so each
        # named site's stream of it (a child, a node below one, one not reached yet)
        # needs nothing the global watermark passed, and nothing more: only an open
        # full sync's base holds more.
        for client, cap in caps.items():
            held = {
                nums[dest]: base
                for (dest, c_name), base in bases.items()
                if c_name == client and dest in nums
            }
            for num in nums.values():
                out[(num, client)] = min(cap, held.get(num, cap))
        return out

    def drop_stream(
        self,
        destination: str,
        client_name: str,
        reason: str,
        first_dropped_position: int | None = None,
    ) -> DropRecord | None:
        if destination not in self.core.site_numbers():
            return None
        with self.core.write() as conn:
            existing = conn.execute(
                select(s.drops).where(
                    s.drops.c.destination == destination, s.drops.c.client_name == client_name
                )
            ).first()
            if existing is not None:
                return drop_record(existing)
            cursor = (
                conn.execute(
                    select(s.cursors.c.position).where(
                        s.cursors.c.destination == destination,
                        s.cursors.c.client_name == client_name,
                    )
                ).scalar()
                or 0
            )
            now = time.time()
            first = cursor + 1 if first_dropped_position is None else first_dropped_position
            row = {
                "destination": destination,
                "client_name": client_name,
                "first_dropped_position": first,
                "dropped_at": now,
                "reason": reason,
            }
            conn.execute(insert(s.drops).values(**row))
            self.core.write_cursor(conn, destination, client_name, cursor, True)
            self.core.announce_sends(conn)  # the destination's session sends the drop notice
        return DropRecord(destination, client_name, first, now, reason)

    def list_drops(self, destination: str | None = None) -> list[DropRecord]:
        with self.core.read_statements() as conn:  # one statement
            return read_drops(conn, destination)

    def clear_drop(self, destination: str, client_name: str) -> None:
        with self.core.write() as conn:
            conn.execute(
                delete(s.drops).where(
                    s.drops.c.destination == destination, s.drops.c.client_name == client_name
                )
            )

    # -- trim marks and stopped streams ---------------------------------------------------
    def record_trim_marks(self, conn: Connection, marks: dict[tuple[int, str], int]) -> None:
        """Raise the trim marks of the streams whose entries were just deleted."""
        if not marks:
            return
        t = s.trim_marks
        for (num, client), position in sorted(marks.items()):
            stmt = self.core.dialect_insert(t).values(
                dest_num=num, client_name=client, trimmed_through=position
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=["dest_num", "client_name"],
                set_={
                    "trimmed_through": case(
                        (t.c.trimmed_through > stmt.excluded.trimmed_through, t.c.trimmed_through),
                        else_=stmt.excluded.trimmed_through,
                    )
                },
            )
            conn.execute(stmt)

    def trimmed_through(self, destination: str, client_name: str) -> int:
        """The highest position trim deleted among the entries tagged for the stream (0: none).

        Every entry of the stream above it is still stored.
        """
        num = self.core.site_numbers().get(destination)
        if num is None:
            return 0
        t = s.trim_marks
        with self.core.read() as conn:
            value = conn.execute(
                select(t.c.trimmed_through).where(
                    t.c.dest_num == num, t.c.client_name == client_name
                )
            ).scalar()
        return int(value or 0)

    @staticmethod
    def _stop(row: Row[Any]) -> StreamStop:
        return StreamStop(
            row.destination,
            row.client_name,
            row.reason,
            int(row.resume_after),
            float(row.stopped_at),
            None if row.accepted_at is None else float(row.accepted_at),
            None if row.accepted_through is None else int(row.accepted_through),
            None if row.resumed_at is None else float(row.resumed_at),
        )

    def stop_stream(
        self, destination: str, client_name: str, reason: str, resume_after: int
    ) -> bool:
        """Record that the stream stopped (True), or keep a stop still open (False).

        The record of an earlier loss, accepted and resumed, is replaced.
        """
        t = s.stream_stops
        with self.core.write() as conn:
            found = conn.execute(
                select(t.c.resumed_at).where(
                    t.c.destination == destination, t.c.client_name == client_name
                )
            ).first()
            if found is not None:
                if found.resumed_at is None:
                    return False
                conn.execute(
                    delete(t).where(t.c.destination == destination, t.c.client_name == client_name)
                )
            conn.execute(
                insert(s.stream_stops).values(
                    destination=destination,
                    client_name=client_name,
                    reason=reason,
                    resume_after=resume_after,
                    stopped_at=time.time(),
                    accepted_at=None,
                    accepted_through=None,
                    resumed_at=None,
                )
            )
        return True

    def get_stream_stop(self, destination: str, client_name: str) -> StreamStop | None:
        with self.core.read() as conn:
            row = conn.execute(
                select(s.stream_stops).where(
                    s.stream_stops.c.destination == destination,
                    s.stream_stops.c.client_name == client_name,
                )
            ).first()
        return self._stop(row) if row else None

    def list_stream_stops(self) -> list[StreamStop]:
        with self.core.read() as conn:
            rows = conn.execute(
                select(s.stream_stops).order_by(
                    s.stream_stops.c.destination, s.stream_stops.c.client_name
                )
            ).all()
        return [self._stop(r) for r in rows]

    def accept_stream_loss(self, destination: str, client_name: str) -> StreamStop | None:
        """Mark a stopped stream's loss accepted; None if the stream is not stopped."""
        t, m = s.stream_stops, s.trim_marks
        num = self.core.site_numbers(refresh=True).get(destination, -1)
        with self.core.write() as conn:
            mark = conn.execute(
                select(m.c.trimmed_through).where(
                    m.c.dest_num == num, m.c.client_name == client_name
                )
            ).scalar()
            done = conn.execute(
                update(t)
                .where(
                    t.c.destination == destination,
                    t.c.client_name == client_name,
                    t.c.accepted_at.is_(None),
                )
                .values(accepted_at=time.time(), accepted_through=int(mark or 0))
            ).rowcount
            row = conn.execute(
                select(t).where(t.c.destination == destination, t.c.client_name == client_name)
            ).first()
            if done:
                self.core.announce_sends(conn)  # the stopped stream's session resumes it
        return self._stop(row) if done and row else None

    def mark_stream_resumed(self, destination: str, client_name: str) -> None:
        """The sink was told of an accepted loss: the stop is only a record now."""
        t = s.stream_stops
        with self.core.write() as conn:
            conn.execute(
                update(t)
                .where(
                    t.c.destination == destination,
                    t.c.client_name == client_name,
                    t.c.accepted_at.is_not(None),
                )
                .values(resumed_at=time.time())
            )

    def clear_stream_stop(self, destination: str, client_name: str) -> None:
        with self.core.write() as conn:
            conn.execute(
                delete(s.stream_stops).where(
                    s.stream_stops.c.destination == destination,
                    s.stream_stops.c.client_name == client_name,
                )
            )

    # -- flow control (written by the server's retention policy) ------------------------
    def set_flow_state(self, client_name: str, backpressure: bool, slow: Sequence[str]) -> None:
        with self.core.write() as conn:
            self.core.upsert(
                conn,
                s.flow_control,
                {
                    "client_name": client_name,
                    "backpressure": backpressure,
                    "slow_destinations": ",".join(sorted(slow)),
                    "updated_at": time.time(),
                },
                ["client_name"],
            )


__all__ = ["RetentionStore"]
