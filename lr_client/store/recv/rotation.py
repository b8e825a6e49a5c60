"""PostgreSQL receive queues: delivered entries retired a partition at a time, by TRUNCATE.

Delivery deletes nothing (:mod:`lr_client.store.recv.queues`): it
raises the queue's ``delivered_seq`` and readers see only the entries above
it. A deleted row would be a dead tuple until vacuum, and a long transaction
anywhere in the cluster pins the vacuum horizon, so a queue emptied by
DELETE could grow without bound. TRUNCATE swaps the partition's file for an
empty one at commit, whatever the horizon.

``lrq_recv_entries`` is ``PARTITION BY LIST (slot)``, a ring of partitions
``lrq_recv_entries_s<N>``; ``lrq_recv_state.cur_slot`` says where new rows
go (an applier reads it in its own transaction, :func:`current_slot`).
:func:`rotate`, run periodically by the sink's ``lr`` server:

1. does nothing until the current slot is older than the rotation period
   and holds something;
2. picks a slot X other than the current one whose every row is *passed*:
   for every queue, no row of X above the queue's ``delivered_seq``;
3. takes X's ``ACCESS EXCLUSIVE`` lock under a short ``lock_timeout`` (a
   slot still read by a delivery, or written by an applier, is left for a
   later rotation: appliers and subscribers never wait longer than that);
4. checks again under the lock (a writer that committed rows into X before
   the lock is seen now; one that has not written yet waits for the commit),
   TRUNCATEs X and makes it the current slot. An applier that read an older
   ``cur_slot`` therefore only ever lands in a live slot, and no slot holding
   an undelivered entry is ever truncated, whatever slot a row went to.

With no slot passed (a queue that nobody delivers holds rows in every slot),
a new partition is attached, up to :data:`MAX_SLOTS`; past that the current
slot keeps growing until the queue is delivered. A slot passed but locked
(a delivery still reading it) is tried again next time instead (the choice,
and the state row, as the send queue's: :mod:`lr_client.store.slot_ring`).
``seq`` order within a queue is commit order (appends to one queue hold its
lock to commit), so a delivered ``seq`` is never followed by a smaller one
committing later.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from lr_client.records import QueueSlot, ReplicationType
from lr_client.store.cascade.relays import relay_keep
from lr_client.store.schema import tables as s
from lr_client.store.slot_ring import (
    Partitions,
    Reclaim,
    StateRow,
    lock_not_available,
    next_slot,
)

#: Partitions of the ring at most: a slot is added only when none is free.
MAX_SLOTS = 16
#: Seconds rotation waits for a partition's lock before it leaves it for next time.
LOCK_TIMEOUT = 0.05

_CURRENT = "SELECT cur_slot FROM lrq_recv_state WHERE id = 1"
_STATE = StateRow(s.recv_state.name)
_PARTITIONS = Partitions(s.recv_entries.name, s.RECV_PARTITION_PREFIX, defaults=True)
_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :ms, true)")
_SLOTS = text(
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = CAST('lrq_recv_entries' AS regclass)"
)


def partition(slot: int) -> str:
    """The partition of ``slot`` (a number: the name is never built from input)."""
    return _PARTITIONS.name(slot)


def current_slot(raw: Any) -> int:
    """The slot new rows go to, read on the driver's connection in the applier's transaction."""
    row = raw.execute(_CURRENT).fetchone()
    return int(row[0])


def slots(conn: Connection) -> list[int]:
    """The slots of the ring (one partition each), in order."""
    names = conn.execute(_SLOTS).scalars()
    prefix = s.RECV_PARTITION_PREFIX
    return sorted(int(n[len(prefix) :]) for n in names if n.startswith(prefix))


def _holds_rows(conn: Connection, slot: int) -> bool:
    return bool(conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {partition(slot)})")).scalar())


def passed(conn: Connection, slot: int) -> bool:
    """Whether every row of ``slot`` is at or below its queue's ``delivered_seq``, and,
    for a queue this node relays (:mod:`lr_client.store.cascade.nodes`), is not a log entry
    above its relay trim mark nor at or after its last end marker.

    One probe of the partition's ``(queue_id, seq)`` index per queue.
    """
    query = text(
        "SELECT NOT EXISTS (SELECT 1 FROM lrq_queue_registry g"
        " LEFT JOIN lrq_subscriber_state st ON st.queue_id = g.queue_id"
        f" WHERE EXISTS (SELECT 1 FROM {partition(slot)} r"
        "   WHERE r.queue_id = g.queue_id AND r.seq > coalesce(st.delivered_seq, 0)))"
    )
    if not conn.execute(query).scalar():
        return False
    for queue_id, (mark, marker_seq) in relay_keep(conn).items():
        held = text(
            f"SELECT EXISTS (SELECT 1 FROM {partition(slot)} r WHERE r.queue_id = :q"
            f" AND ((r.type = {int(ReplicationType.LOG_ENTRY_SYNC)} AND r.source_position > :mark)"
            f"   OR (r.type <> {int(ReplicationType.LOG_ENTRY_SYNC)} AND :marker > 0"
            "       AND r.seq >= :marker)))"
        )
        if conn.execute(held, {"q": queue_id, "mark": mark, "marker": marker_seq}).scalar():
            return False
    return True


def slot_sizes(conn: Connection) -> list[QueueSlot]:
    """Every partition of the ring: rows stored and bytes on disk, with indexes."""
    cur = _STATE.read(conn)[0]
    out = []
    for slot in slots(conn):
        name = partition(slot)
        rows = int(conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one())
        size = conn.execute(
            text("SELECT pg_total_relation_size(CAST(:name AS regclass))"), {"name": name}
        ).scalar_one()
        out.append(QueueSlot("receive", slot, slot == cur, rows, int(size)))
    return out


def _truncate_if_passed(conn: Connection, slot: int) -> Reclaim:
    """Lock ``slot``, check it again and TRUNCATE it if every row of it is passed.

    BUSY: passed, but its lock was not had in time; PINNED: it holds an undelivered entry.
    """
    if not passed(conn, slot):
        return Reclaim.PINNED
    savepoint = _PARTITIONS.lock(conn, slot)  # under the transaction's lock_timeout
    if savepoint is None:
        return Reclaim.BUSY
    if not passed(conn, slot):  # rows committed before our lock
        savepoint.rollback()
        return Reclaim.PINNED
    _PARTITIONS.truncate(conn, slot)
    savepoint.commit()
    return Reclaim.FREED


def rotate(
    engine: Engine,
    period: float,
    *,
    lock_timeout: float = LOCK_TIMEOUT,
    max_slots: int = MAX_SLOTS,
) -> int | None:
    """Retire a passed slot and make it current, once the current one is ``period`` s old.

    Returns the new current slot, or None if nothing was rotated (not due, the
    current slot empty, no slot free and the ring full, or a lock not had in
    ``lock_timeout`` s: the next call tries again).
    """
    with engine.connect() as conn:
        with conn.begin():
            cur, rotated_at = _STATE.read(conn)
        if time.time() - rotated_at < period:
            return None
        try:
            with conn.begin():
                conn.execute(_LOCK_TIMEOUT, {"ms": f"{max(1, int(lock_timeout * 1000))}ms"})
                cur, rotated_at = _STATE.read(conn, for_update=True)
                now = time.time()
                if now - rotated_at < period or not _holds_rows(conn, cur):
                    return None
                ring = slots(conn)
                size = max(ring) + 1
                others = sorted((x for x in ring if x != cur), key=lambda x: (x - cur) % size)
                # A busy slot is free soon (a delivery reading it): try it next time.
                chosen = next_slot(
                    ring,
                    others,
                    lambda x: _truncate_if_passed(conn, x),
                    lambda x: _PARTITIONS.add(conn, x),
                    max_slots=max_slots,
                    busy_waits=True,
                )
                if chosen is not None:
                    _STATE.switch(conn, chosen, now)
                return chosen
        except DBAPIError as exc:
            if lock_not_available(exc):
                return None
            raise


__all__ = [
    "LOCK_TIMEOUT",
    "MAX_SLOTS",
    "current_slot",
    "partition",
    "passed",
    "rotate",
    "slot_sizes",
    "slots",
]
