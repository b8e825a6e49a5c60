"""The :class:`~lr_client.store.contract.Receiving` role: a sink's receiver appends batches.

Log batches (of a stream, or of one of its lanes) and snapshot batches, each
in one transaction under the stream's lock; what they record per stream is
:mod:`~lr_client.store.recv.sink_state`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlalchemy import delete, select

from lr_client.errors import ProtocolError
from lr_client.lanes import MAX_LANES, lane_of
from lr_client.records import ReplicationType, SinkProgress, SinkSnapshotState, WireEntry
from lr_client.store.recv.sink_state import SinkStateStore
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


class ReceivingStore(SinkStateStore):
    """Receive queues filled exactly once per (source, client) position."""

    @property
    def notify_arrivals(self) -> bool:
        """Whether appends wake the subscribers at commit (where the backend can)."""
        return self.core.notify_arrivals

    @notify_arrivals.setter
    def notify_arrivals(self, on: bool) -> None:
        self.core.notify_arrivals = on

    def apply_log_batch(
        self,
        source_id: str,
        client_name: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        through = max((e.position for e in entries), default=None)
        with self.core.write() as conn:
            progress = self.locked_progress(conn, source_id, client_name, through)
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
