"""What a sink records per (source, client) stream, and the receive queue it appends to.

A stream's progress (``lrq_sink_progress``: the last position applied, the
snapshot under way), its lanes' positions (``lrq_sink_lanes``) and the last
drop notice it received (``lrq_sink_drops``); the batches that move them are
:mod:`~lr_client.store.recv.receiving`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection, Row

from lr_client.names import recv_queue_name
from lr_client.records import (
    ReplicationType,
    SinkDrop,
    SinkProgress,
    SinkSnapshotState,
    WireEntry,
)
from lr_client.store.role import Role
from lr_client.store.schema import tables as s


class SinkStateStore(Role):
    """Each stream's progress, lanes and drop notices at the sink; its receive queue."""

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

    def locked_progress(
        self, conn: Connection, source_id: str, client_name: str, through: int | None = None
    ) -> SinkProgress:
        """The stream's progress, read under its lock (batches of one stream apply in turn);
        ``through``: the last position of the log batch to apply."""
        read, row = self.core.lock_stream(conn, source_id, client_name, through)
        if not read:
            row = self._progress_row(conn, source_id, client_name)
        return self._progress(row) if row else SinkProgress(source_id, client_name)

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
            progress = self.locked_progress(conn, source_id, client_name)
            last = conn.execute(
                select(t.c.notice_id).where(
                    t.c.source_id == source_id, t.c.client_name == client_name
                )
            ).scalar()
            if last == notice_id:
                return False
            qid = self.ensure_queue(conn, source_id, client_name)
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


__all__ = ["SinkStateStore"]
