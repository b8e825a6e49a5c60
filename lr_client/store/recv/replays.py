"""Replays: the source's requests (``lr replay``) and the sink's replayed batches.

At the source, :meth:`ReplaysStore.request_replay` records a request in
``lrq_replays`` (:mod:`lr_client.store.recv.replay_tables`); the sender session of
its destination picks it up and moves it along (:mod:`lr_server.sending.replay`). At
the sink, :meth:`ReplaysStore.apply_replay_batch` queues a replayed batch
again, flagged (:data:`~lr_client.replayed.REPLAYED_MARK`), without moving the
stream's position: exactly-once holds for everything else.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Row

from lr_client.errors import InvalidInputError
from lr_client.names import recv_queue_name, validate_name
from lr_client.records import ReplicationType, WireEntry
from lr_client.replayed import REPLAYED_MARK
from lr_client.store.core import StoreCore
from lr_client.store.recv.receiving import ReceivingStore
from lr_client.store.recv.replay_contract import OPEN, PENDING, ReplayRequest, Rewind
from lr_client.store.recv.replay_tables import replays as _P
from lr_client.store.role import Role
from lr_client.store.schema import tables as s


def _request(row: Row[Any]) -> ReplayRequest:
    return ReplayRequest(
        int(row.replay_id),
        row.destination,
        row.client_name,
        int(row.from_position),
        None if row.through_position is None else int(row.through_position),
        int(row.shipped_through),
        row.status,
        row.error,
        float(row.requested_at),
        float(row.updated_at),
    )


class ReplaysStore(Role):
    """``lrq_replays`` rows and replayed batches (appended through the receiving role)."""

    def __init__(self, core: StoreCore, recv: ReceivingStore) -> None:
        super().__init__(core)
        self.recv = recv

    def request_replay(
        self, destination: str, client_name: str, from_position: int
    ) -> ReplayRequest:
        validate_name(destination, "destination")
        validate_name(client_name, "client name")
        if isinstance(from_position, bool) or not isinstance(from_position, int):
            raise InvalidInputError(f"position must be an integer, not {from_position!r}")
        if from_position < 1:
            raise InvalidInputError(f"position must be 1 or more, not {from_position}")
        now = time.time()
        row = {
            "destination": destination,
            "client_name": client_name,
            "from_position": from_position,
            "shipped_through": from_position - 1,
            "status": PENDING,
            "error": "",
            "requested_at": now,
            "updated_at": now,
        }
        with self.core.write() as conn:
            rid = conn.execute(insert(_P).values(**row).returning(_P.c.replay_id)).scalar_one()
            self.core.announce_sends(conn)  # the destination's session picks it up now
        return ReplayRequest(
            int(rid),
            destination,
            client_name,
            from_position,
            None,
            from_position - 1,
            PENDING,
            "",
            now,
            now,
        )

    def list_replays(
        self, destination: str | None = None, open_only: bool = False
    ) -> list[ReplayRequest]:
        query = select(_P).order_by(_P.c.replay_id)
        if destination is not None:
            query = query.where(_P.c.destination == destination)
        if open_only:
            query = query.where(_P.c.status.in_(OPEN))
        with self.core.read_statements() as conn:  # one statement
            return [_request(r) for r in conn.execute(query).all()]

    def update_replay(self, replay_id: int, **values: Any) -> None:
        allowed = {"status", "error", "through_position", "shipped_through"}
        if not values or set(values) - allowed:
            raise InvalidInputError(f"cannot update {sorted(set(values) - allowed)}")
        with self.core.write() as conn:
            conn.execute(
                update(_P)
                .where(_P.c.replay_id == replay_id)
                .values(**values, updated_at=time.time())
            )

    def apply_replay_batch(
        self, source_id: str, client_name: str, entries: Sequence[WireEntry]
    ) -> tuple[bool, int]:
        """Entries past the stream's position are left out: they are not held here yet
        and come in their turn, once."""
        last = entries[-1].position if entries else 0
        with self.core.write() as conn:
            progress = self.recv.locked_progress(conn, source_id, client_name)
            held = [
                replace(e, snapshot_id=REPLAYED_MARK)
                for e in entries
                if e.position <= progress.last_position and e.type is ReplicationType.LOG_ENTRY_SYNC
            ]
            if held:
                qid = self.recv.ensure_queue(conn, source_id, client_name)
                self.recv.append(conn, qid, client_name, held)
        return bool(held), last

    def rewind_receive_queue(self, source_id: str, client_name: str, to_position: int) -> Rewind:
        """The delivered entries the queue still holds are those it has not retired:
        SQLite deletes them as it delivers them (a relayed queue keeps them until its
        relay trim), PostgreSQL keeps them until rotation truncates their partition. So
        the rewind is refused unless every delivered log entry from ``to_position`` on
        is still held (the queue's oldest held entry is below the first of them, or is
        at ``to_position``), and when a full sync or a drop notice lies in the range,
        or the queue is delivered by partition or in the middle of a full sync."""
        r, st = s.recv_entries, s.subscriber_state
        log = int(ReplicationType.LOG_ENTRY_SYNC)
        name = recv_queue_name(client_name, source_id)
        with self.core.write() as conn:
            qid = conn.execute(
                select(s.queue_registry.c.queue_id).where(s.queue_registry.c.queue_name == name)
            ).scalar()
            state = None
            if qid is not None:
                state = conn.execute(
                    select(st).where(st.c.queue_id == qid).with_for_update()
                ).first()
            if qid is None or state is None:
                return Rewind(refused=f"{name}: nothing was delivered from this queue")
            if state.partitions or state.in_snapshot:
                why = "delivered by partition" if state.partitions else "in a full sync"
                return Rewind(refused=f"{name} is {why}: it cannot be rewound")
            mark = int(state.delivered_seq)
            delivered = (r.c.queue_id == qid, r.c.seq <= mark)
            first = conn.execute(
                select(func.min(r.c.seq)).where(
                    *delivered, r.c.type == log, r.c.source_position >= to_position
                )
            ).scalar()
            oldest = conn.execute(
                select(r.c.seq, r.c.source_position)
                .where(r.c.queue_id == qid)
                .order_by(r.c.seq)
                .limit(1)
            ).first()
            if first is None or oldest is None:
                return Rewind(refused=f"{name} holds no delivered entry at or after {to_position}")
            if oldest.seq == first and oldest.source_position != to_position:
                return Rewind(
                    refused=f"{name} holds delivered entries from position "
                    f"{oldest.source_position} on only (those before were retired)"
                )
            span = (r.c.queue_id == qid, r.c.seq >= first, r.c.seq <= mark)
            kinds = conn.execute(select(r.c.type).where(*span, r.c.type != log).limit(1)).first()
            if kinds is not None:
                return Rewind(refused=f"a full sync or a drop notice lies past {to_position}")
            count, low, high = conn.execute(
                select(
                    func.count(), func.min(r.c.source_position), func.max(r.c.source_position)
                ).where(*span)
            ).one()
            conn.execute(update(r).where(*span).values(snapshot_id=REPLAYED_MARK))
            conn.execute(update(st).where(st.c.queue_id == qid).values(delivered_seq=first - 1))
            self.core.announce_arrivals(conn, client_name)
        return Rewind(int(count), int(low), int(high))


__all__ = ["ReplaysStore"]
