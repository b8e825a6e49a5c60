"""The :class:`~lr_client.store.contract.Receiving` role: a sink's receiver appends batches."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection, Row

from lr_client.errors import ProtocolError
from lr_client.lanes import MAX_LANES, lane_of
from lr_client.names import recv_queue_name
from lr_client.records import (
    ReplicationType,
    SinkDrop,
    SinkProgress,
    SinkSnapshotState,
    WireEntry,
)
from lr_client.store.core import Role
from lr_client.store.schema import tables as s


def recv_base(entry: WireEntry) -> int | None:
    """The base position a receive queue stores with ``entry``.

    An end marker always carries its snapshot's base (0 included); a snapshot
    entry carries it from sources of this release on (0 there: not sent);
    other entries have none.
    """
    if entry.type is ReplicationType.LAST_FULL_SYNC_ENTRY:
        return entry.base_position
    if entry.type is ReplicationType.SNAPSHOT_SYNC and entry.base_position:
        return entry.base_position
    return None


class ReceivingStore(Role):
    """Receive queues filled exactly once per (source, client) position."""

    @property
    def notify_arrivals(self) -> bool:
        """Whether appends wake the subscribers at commit (where the backend can)."""
        return self.core.notify_arrivals

    @notify_arrivals.setter
    def notify_arrivals(self, on: bool) -> None:
        self.core.notify_arrivals = on

    def apply_drop_notice(
        self,
        source_id: str,
        client_name: str,
        notice_id: str,
        first_dropped_position: int,
        reason: str,
    ) -> bool:
        """Queue a drop notice for the listener, once per ``notice_id``; False if a repeat.

        The stream's position goes to just before ``first_dropped_position``: back if it
        was further, and on for a loss an operator accepted (ids ``a...``: a skipped entry).
        """
        t = s.sink_drops
        with self.core.write() as conn:
            self.core.lock_stream(conn, source_id, client_name)
            last = conn.execute(
                select(t.c.notice_id).where(
                    t.c.source_id == source_id, t.c.client_name == client_name
                )
            ).scalar()
            if last == notice_id:
                return False
            qid = self.ensure_queue(conn, source_id, client_name)
            row = self._progress_row(conn, source_id, client_name)
            progress = self._progress(row) if row else SinkProgress(source_id, client_name)
            if progress.snapshot_state == SinkSnapshotState.ONGOING and progress.snapshot_id:
                # An unfinished snapshot is dead once its stream was dropped: what
                # follows is a new full sync or, after an accepted loss, log entries.
                r = s.recv_entries
                conn.execute(
                    delete(r).where(r.c.queue_id == qid, r.c.snapshot_id == progress.snapshot_id)
                )
                progress = dataclasses.replace(
                    progress,
                    snapshot_state=SinkSnapshotState.NONE,
                    snapshot_id="",
                    snapshot_position=0,
                )
                self._save_progress(conn, progress)
            entry = WireEntry(
                first_dropped_position,
                ReplicationType.STREAM_DROPPED,
                reason.encode(),
                snapshot_id=notice_id,
            )
            self.append(conn, qid, client_name, [entry])
            self.core.upsert(
                conn,
                t,
                {
                    "source_id": source_id,
                    "client_name": client_name,
                    "notice_id": notice_id,
                    "first_dropped_position": first_dropped_position,
                    "reason": reason,
                    "received_at": time.time(),
                },
                ["source_id", "client_name"],
            )
            rewind = max(first_dropped_position - 1, 0)
            self._clear_lanes(conn, source_id, client_name, above=rewind)
            if progress.last_position > rewind or notice_id[:1] == "a":
                self._save_progress(
                    conn,
                    SinkProgress(
                        source_id,
                        client_name,
                        last_position=rewind,
                        snapshot_state=progress.snapshot_state,
                        snapshot_id=progress.snapshot_id,
                        snapshot_position=progress.snapshot_position,
                        entries_received=progress.entries_received,
                    ),
                )
        return True

    def list_sink_drops(self) -> list[SinkDrop]:
        t = s.sink_drops
        with self.core.read() as conn:
            rows = conn.execute(select(t).order_by(t.c.source_id, t.c.client_name)).all()
        return [
            SinkDrop(
                r.source_id,
                r.client_name,
                r.notice_id,
                int(r.first_dropped_position),
                r.reason,
                float(r.received_at),
            )
            for r in rows
        ]

    @staticmethod
    def _progress(row: Row[Any]) -> SinkProgress:
        return SinkProgress(
            source_id=row.source_id,
            client_name=row.client_name,
            last_position=row.last_position,
            snapshot_state=SinkSnapshotState(row.snapshot_state),
            snapshot_id=row.snapshot_id,
            snapshot_position=row.snapshot_position,
            entries_received=row.entries_received,
            updated_at=row.updated_at,
        )

    def sink_progress(self, source_id: str, client_name: str) -> SinkProgress:
        with self.core.read() as conn:
            row = self._progress_row(conn, source_id, client_name)
        return self._progress(row) if row else SinkProgress(source_id, client_name)

    @staticmethod
    def _progress_row(conn: Connection, source_id: str, client_name: str) -> Row[Any] | None:
        return conn.execute(
            select(s.sink_progress).where(
                s.sink_progress.c.source_id == source_id,
                s.sink_progress.c.client_name == client_name,
            )
        ).first()

    def list_sink_progress(self) -> list[SinkProgress]:
        with self.core.read() as conn:
            rows = conn.execute(
                select(s.sink_progress).order_by(
                    s.sink_progress.c.source_id, s.sink_progress.c.client_name
                )
            ).all()
        return [self._progress(r) for r in rows]

    def ensure_queue(self, conn: Connection, source_id: str, client_name: str) -> int:
        name = recv_queue_name(client_name, source_id)
        if name in self.core.queue_ids:  # registrations are never removed
            return self.core.queue_ids[name]
        # Cached by the store once this transaction commits (``_transaction``), not
        # before: a registration rolled back with it would leave entries of a queue
        # no subscriber finds.
        learnt = self.core.txn_queue_ids.setdefault(conn, {})
        if name in learnt:
            return learnt[name]
        qid = conn.execute(
            select(s.queue_registry.c.queue_id).where(s.queue_registry.c.queue_name == name)
        ).scalar()
        if qid is None:
            self.core.insert_ignore(
                conn,
                s.queue_registry,
                [
                    {
                        "queue_name": name,
                        "client_name": client_name,
                        "source_id": source_id,
                        "created_at": time.time(),
                    }
                ],
                ["queue_name"],
            )
            qid = conn.execute(
                select(s.queue_registry.c.queue_id).where(s.queue_registry.c.queue_name == name)
            ).scalar_one()
        learnt[name] = int(qid)
        return int(qid)

    def _save_progress(self, conn: Connection, progress: SinkProgress) -> None:
        self.core.upsert(
            conn,
            s.sink_progress,
            {
                "source_id": progress.source_id,
                "client_name": progress.client_name,
                "last_position": progress.last_position,
                "snapshot_state": int(progress.snapshot_state),
                "snapshot_id": progress.snapshot_id,
                "snapshot_position": progress.snapshot_position,
                "entries_received": progress.entries_received,
                "updated_at": time.time(),
            },
            ["source_id", "client_name"],
        )

    def append(
        self, conn: Connection, queue_id: int, client_name: str, entries: Sequence[WireEntry]
    ) -> None:
        """Append entries to a client's receive queue, announcing them (:meth:`_announce`)."""
        self.core.append_recv(conn, queue_id, entries)
        self.core.announce_arrivals(conn, client_name)

    def locked_progress(self, conn: Connection, source_id: str, client_name: str) -> SinkProgress:
        """The stream's progress, read under its lock (batches of one stream apply in turn)."""
        self.core.lock_stream(conn, source_id, client_name)
        row = self._progress_row(conn, source_id, client_name)
        return self._progress(row) if row else SinkProgress(source_id, client_name)

    def apply_log_batch(
        self,
        source_id: str,
        client_name: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        with self.core.write() as conn:
            progress = self.locked_progress(conn, source_id, client_name)
            if previous_position is not None and previous_position > progress.last_position:
                raise ProtocolError(
                    f"gap: batch follows position {previous_position}, "
                    f"sink has {progress.last_position}"
                )
            fresh = [e for e in entries if e.position > progress.last_position]
            if not fresh:
                return False, progress.last_position
            qid = self.ensure_queue(conn, source_id, client_name)
            self.append(conn, qid, client_name, fresh)
            last = fresh[-1].position
            self._save_progress(
                conn,
                SinkProgress(
                    source_id,
                    client_name,
                    last_position=last,
                    snapshot_state=progress.snapshot_state,
                    snapshot_id=progress.snapshot_id,
                    snapshot_position=progress.snapshot_position,
                    entries_received=progress.entries_received + len(fresh),
                ),
            )
        return True, last

    def apply_lane_batch(
        self,
        source_id: str,
        client_name: str,
        lane: int,
        lanes: int,
        entries: Sequence[WireEntry],
        previous_position: int,
        low_water: int,
    ) -> tuple[bool, int]:
        if not 1 <= lane <= lanes <= MAX_LANES:
            raise ProtocolError(f"lane {lane} of {lanes} is out of range")
        if any(lane_of(e.key, lanes) != lane for e in entries):
            raise ProtocolError(f"an entry of the batch does not belong to lane {lane}")
        t = s.sink_lanes
        with self.core.write() as conn:
            progress = self.locked_progress(conn, source_id, client_name)
            rows = conn.execute(
                select(t.c.lanes, t.c.lane, t.c.last_position).where(
                    t.c.source_id == source_id, t.c.client_name == client_name
                )
            ).all()
            held = {(int(r.lanes), int(r.lane)): int(r.last_position) for r in rows}
            mark = max(progress.last_position, low_water)
            floor = max(mark, held.get((lanes, lane), 0))
            if previous_position > floor:
                raise ProtocolError(
                    f"gap: lane {lane} batch follows position {previous_position}, sink has {floor}"
                )

            def applied(e: WireEntry) -> bool:
                # Held if at or below the stream's position or its lane's under any count:
                # a stream's lane count may change between two connections.
                return e.position <= mark or any(
                    e.position <= last
                    for (count, n), last in held.items()
                    if lane_of(e.key, count) == n
                )

            fresh = [e for e in entries if not applied(e)]
            if fresh:
                qid = self.ensure_queue(conn, source_id, client_name)
                self.append(conn, qid, client_name, fresh)
                floor = max(floor, fresh[-1].position)
                self.core.upsert(
                    conn,
                    t,
                    {
                        "source_id": source_id,
                        "client_name": client_name,
                        "lanes": lanes,
                        "lane": lane,
                        "last_position": floor,
                    },
                    ["source_id", "client_name", "lanes", "lane"],
                )
            if fresh or mark > progress.last_position:
                self._save_progress(
                    conn,
                    dataclasses.replace(
                        progress,
                        last_position=mark,
                        entries_received=progress.entries_received + len(fresh),
                    ),
                )
            if mark > progress.last_position:
                conn.execute(
                    delete(t).where(
                        t.c.source_id == source_id,
                        t.c.client_name == client_name,
                        t.c.last_position <= mark,
                    )
                )
        return bool(fresh), floor

    def _clear_lanes(
        self, conn: Connection, source_id: str, client_name: str, above: int = -1
    ) -> None:
        """Forget the lane rows of a stream (those past ``above``): what follows is sent again."""
        t = s.sink_lanes
        conn.execute(
            delete(t).where(
                t.c.source_id == source_id,
                t.c.client_name == client_name,
                t.c.last_position > above,
            )
        )

    def apply_snapshot_batch(
        self,
        source_id: str,
        client_name: str,
        snapshot_id: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        with self.core.write() as conn:
            progress = self.locked_progress(conn, source_id, client_name)
            same = progress.snapshot_id == snapshot_id
            if previous_position is not None:
                if same and previous_position > progress.snapshot_position:
                    raise ProtocolError("gap in snapshot batch")
                if not same and previous_position != 0:
                    raise ProtocolError("a new snapshot must start at its first entry")
            qid = self.ensure_queue(conn, source_id, client_name)
            if not same:
                # A new snapshot supersedes what is still queued of an unfinished
                # one. A completed one stays whole: the log entries replayed after
                # its base follow it in the queue and need its end before them.
                if progress.snapshot_id and progress.snapshot_state == SinkSnapshotState.ONGOING:
                    conn.execute(
                        delete(s.recv_entries).where(
                            s.recv_entries.c.queue_id == qid,
                            s.recv_entries.c.snapshot_id == progress.snapshot_id,
                        )
                    )
                progress = SinkProgress(
                    source_id,
                    client_name,
                    last_position=progress.last_position,
                    snapshot_state=SinkSnapshotState.ONGOING,
                    snapshot_id=snapshot_id,
                    snapshot_position=0,
                    entries_received=progress.entries_received,
                )
            elif progress.snapshot_state == SinkSnapshotState.COMPLETED:
                return False, progress.snapshot_position
            fresh = [e for e in entries if e.position > progress.snapshot_position]
            if not fresh:
                self._save_progress(conn, progress)
                return False, progress.snapshot_position
            self.append(conn, qid, client_name, fresh)
            last = fresh[-1]
            done = last.type == ReplicationType.LAST_FULL_SYNC_ENTRY
            # After the end marker, log entries resume after the snapshot's base
            # position, even those already received: the snapshot may have
            # overwritten their effect, so they must be applied again after it.
            base = last.base_position if done else progress.last_position
            if done:  # every log entry after the base is applied again, on any lane
                self._clear_lanes(conn, source_id, client_name)
            self._save_progress(
                conn,
                SinkProgress(
                    source_id,
                    client_name,
                    last_position=base,
                    snapshot_state=SinkSnapshotState.COMPLETED
                    if done
                    else SinkSnapshotState.ONGOING,
                    snapshot_id=snapshot_id,
                    snapshot_position=last.position,
                    entries_received=progress.entries_received + len(fresh),
                ),
            )
        return True, last.position


__all__ = ["ReceivingStore"]
