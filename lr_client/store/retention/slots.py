"""PostgreSQL's send queue slots: rotation and retirement by TRUNCATE.

Every table of the send queue is partitioned by ``slot`` (revision 0006). A
transaction writes its entries (and, at COMMIT, its stamp) into the current
slot, read once per transaction; the sequencer writes positions and blocks
into their entries' slot and each tick into the current slot. Nothing is
deleted row by row: :func:`retire` runs in one READ COMMITTED transaction and

1. takes the sequencer's lock (no tick runs meanwhile) and a SHARE lock on
   ``lrq_cursors`` (no acknowledgement moves; a session lowering a cursor
   either waits for this and reads the trim marks it writes, or committed
   first and is seen), the same protocol as the row trim it replaces;
2. **retires** each other slot holding rows whose every stream
   ``(destination, client)`` has been acknowledged through the slot's highest
   position for it: its trim marks rise to those positions and its
   partitions are truncated. A slot is locked first, without waiting (one in
   use by an open transmitting transaction or a reader is tried again next
   time), then the sequencer ticks, so every entry committed there has its
   position (no open transaction writes there any more). Acknowledgements are
   read as the row trim read them
   (:meth:`~lr_client.store.retention.store.RetentionStore.acked_positions`): a
   stream without a cursor pins every slot holding its entries, a dropped
   stream pins nothing, an open snapshot's base pins what follows it;
3. **rotates** when the current slot holds entries and has been current for
   ``period`` seconds: an empty slot (truncated again if aborted transactions
   left dead rows in it) becomes current. A closed slot is judged once it has
   been closed for ``period`` too, so a transaction's positions stay known
   (``positions_of``) for at least a period after its commit, or a new one while there are fewer
   than ``max_slots``; the newest tick is copied into it, so the slot holding
   the newest tick is never retired.

The state row and the choice of the next current slot are the receive
queues' too (:mod:`lr_client.store.slot_ring`).

TRUNCATE gives the partitions new files and unlinks the old ones at commit,
whatever the vacuum horizon: a transaction left open for hours pins dead rows
of the small state tables only, never the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from lr_client.records import QueueSlot
from lr_client.store.send import sequencer
from lr_client.store.slot_ring import Reclaim, StateRow, next_slot

#: How long a slot stays current before a trim closes it (seconds).
DEFAULT_PERIOD = 30.0
#: Slots are added while every other one is pinned, up to this many; then the
#: current slot stays current (and grows) until retention releases one.
DEFAULT_MAX_SLOTS = 32

_STATE = StateRow("lrq_send_state")
_SLOTS = text("SELECT slot FROM lrq_send_slots ORDER BY slot")
_CLOSED = text("SELECT slot FROM lrq_send_slots WHERE closed_at <= :closed_by ORDER BY slot")
_CLOSE = text("UPDATE lrq_send_slots SET closed_at = :now WHERE slot = :slot")
_HAS_ENTRIES = text("SELECT EXISTS (SELECT 1 FROM lrq_send_entries WHERE slot = :slot)")
_HAS_PAGES = text(
    "SELECT pg_relation_size(to_regclass('lrq_send_entries_s' || CAST(:slot AS text))) > 0"
)
_LOCK = text("SELECT lrq_lock_send_slot(CAST(:slot AS smallint))")
_TRUNCATE = text("SELECT lrq_truncate_send_slot(CAST(:slot AS smallint))")
_ADD = text("SELECT lrq_add_send_slot(CAST(:slot AS smallint))")
_CARRY_TICK = text(
    "INSERT INTO lrq_send_ticks (slot, tick_id, snap, head, ticked_at) "
    "SELECT :slot, tick_id + 1, snap, head, :now FROM lrq_send_ticks "
    "ORDER BY tick_id DESC LIMIT 1"
)
#: Per stream present in a slot, its highest position there.
_MARKS = text(
    "SELECT d.num, p.client_name, max(p.position) "
    "FROM lrq_send_positions p CROSS JOIN LATERAL unnest(p.dest_nums) AS d(num) "
    "WHERE p.slot = :slot GROUP BY d.num, p.client_name"
)
_TOP = text("SELECT coalesce(max(position), 0) FROM lrq_send_positions WHERE slot = :slot")
_COUNT = text("SELECT count(*) FROM lrq_send_entries WHERE slot = :slot")
_SIZES = text(
    "SELECT s.slot, (SELECT count(*) FROM lrq_send_entries e WHERE e.slot = s.slot), "
    "(SELECT sum(pg_total_relation_size(to_regclass(t || '_s' || s.slot))) "
    " FROM unnest(CAST(:tables AS text[])) AS t) "
    "FROM lrq_send_slots s ORDER BY s.slot"
)
_TABLES = [
    "lrq_send_entries",
    "lrq_send_commits",
    "lrq_send_positions",
    "lrq_send_blocks",
    "lrq_send_ticks",
]

Marks = dict[tuple[int, str], int]


def _holding(conn: Connection, closed_by: float) -> list[int]:
    """The slots closed by ``closed_by`` that still hold entries or ticks.

    Each slot's own partitions are probed for a row. One query over the parent
    tables (``EXISTS ... WHERE e.slot = s.slot``) is planned as a hashed subplan:
    it read every entry of every slot, under the tick lock.
    """
    held = []
    for slot in conn.execute(_CLOSED, {"closed_by": closed_by}).scalars():
        n = int(slot)
        probe = text(
            f"SELECT EXISTS (SELECT 1 FROM lrq_send_entries_s{n})"
            f" OR EXISTS (SELECT 1 FROM lrq_send_ticks_s{n})"
        )
        if conn.execute(probe).scalar():
            held.append(n)
    return held


@dataclass(frozen=True)
class Retirement:
    """What one :func:`retire` did."""

    rotated_to: int | None  # the new current slot, if it rotated
    retired: tuple[int, ...]  # slots truncated because every stream had passed them
    entries: int  # entries those slots held
    busy: tuple[int, ...]  # slots holding rows that were in use and not judged


def retire(
    conn: Connection,
    tick_key: int,
    acked: Callable[[Connection], Marks],
    record_marks: Callable[[Connection, Marks], None],
    *,
    period: float = DEFAULT_PERIOD,
    max_slots: int = DEFAULT_MAX_SLOTS,
    cache: MarksCache | None = None,
) -> Retirement:
    """Retire every passed slot and rotate if due; ``conn`` is a READ COMMITTED transaction.

    ``acked`` reads the acknowledgements and ``record_marks`` raises the trim
    marks (the retention store's); ``cache`` keeps what was read of pinned
    slots from one call to the next. Commit right after.
    """
    cache = {} if cache is None else cache
    now = time.time()
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": tick_key})
    conn.execute(text("LOCK TABLE lrq_cursors IN SHARE MODE"))
    cur, rotated_at = _STATE.read(conn, for_update=True)
    judge = _Judge(conn, tick_key, acked(conn), record_marks, cache)
    # The slots already closed first: one of them may be the next current one.
    # A slot closed less than a period ago is kept (``positions_of`` answers
    # for at least that long after a commit).
    closed = _holding(conn, now - period)
    judge.retire([x for x in closed if x != cur])
    rotated_to = None
    if now - rotated_at >= period and conn.execute(_HAS_ENTRIES, {"slot": cur}).scalar():
        rotated_to = _rotate(conn, cur, max_slots, now)
        if rotated_to is not None and period <= 0:
            judge.retire([cur])
    return Retirement(rotated_to, tuple(judge.retired), judge.entries, tuple(judge.busy))


@dataclass(frozen=True)
class _Judged:
    """A closed slot's streams, as read under its lock when its highest position was ``top``."""

    top: int
    marks: Marks
    entries: int


#: Per slot, what the last judgment read (a closed slot's content only grows
#: by a late writer, whose entries come above its highest position).
MarksCache = dict[int, _Judged]


class _Judge:
    """Retires slots in one transaction, reading the acknowledgements once.

    A slot pinned by a stream behind is judged from ``cache`` without its lock
    (or a scan of its positions) while its highest position is unchanged; one
    that looks passed is locked and judged again.
    """

    def __init__(
        self,
        conn: Connection,
        tick_key: int,
        acks: Marks,
        record_marks: Callable[[Connection, Marks], None],
        cache: MarksCache,
    ) -> None:
        self.conn, self.tick_key = conn, tick_key
        self.acks, self.record_marks, self.cache = acks, record_marks, cache
        self.ticked = False
        self.retired: list[int] = []
        self.busy: list[int] = []
        self.entries = 0

    def _passed(self, marks: Marks) -> bool:
        return all(self.acks.get(key, -1) >= top for key, top in marks.items())

    def _top(self, slot: int) -> int:
        return int(self.conn.execute(_TOP, {"slot": slot}).scalar_one())

    def retire(self, slots: Sequence[int]) -> None:
        conn = self.conn
        for slot in slots:
            known = self.cache.get(slot)
            if known is not None and known.top == self._top(slot) and not self._passed(known.marks):
                continue  # still pinned: no lock taken, nothing scanned
            if not conn.execute(_LOCK, {"slot": slot}).scalar():
                self.busy.append(slot)
                continue
            if not self.ticked:
                # The locked slot has no open writer left: after this tick every
                # entry committed there has its position.
                sequencer.tick(conn, self.tick_key)
                self.ticked = True
            top = self._top(slot)
            known = self.cache.get(slot)
            if known is None or known.top != top:
                marks: Marks = {
                    (int(num), client): int(high)
                    for num, client, high in conn.execute(_MARKS, {"slot": slot}).all()
                }
                count = int(conn.execute(_COUNT, {"slot": slot}).scalar_one())
                known = self.cache[slot] = _Judged(top, marks, count)
            if not self._passed(known.marks):
                continue
            if known.marks:
                self.record_marks(conn, known.marks)
            conn.execute(_TRUNCATE, {"slot": slot})
            del self.cache[slot]
            self.entries += known.entries
            self.retired.append(slot)


def rotate(conn: Connection, tick_key: int, *, max_slots: int = DEFAULT_MAX_SLOTS) -> int | None:
    """Close the current slot now if it holds entries: the new current slot, or None."""
    now = time.time()
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": tick_key})
    cur = _STATE.read(conn, for_update=True)[0]
    if not conn.execute(_HAS_ENTRIES, {"slot": cur}).scalar():
        return None
    return _rotate(conn, cur, max_slots, now)


def _rotate(conn: Connection, cur: int, max_slots: int, now: float) -> int | None:
    """Make an empty slot current; None if every other slot is in use or pinned."""
    holding = set(_holding(conn, now))
    ring = [int(x) for x in conn.execute(_SLOTS).scalars()]

    def reclaim(slot: int) -> Reclaim:
        if slot in holding:
            return Reclaim.PINNED
        if not conn.execute(_LOCK, {"slot": slot}).scalar():
            return Reclaim.BUSY
        if conn.execute(_HAS_PAGES, {"slot": slot}).scalar():
            conn.execute(_TRUNCATE, {"slot": slot})  # what rolled-back writers left
        return Reclaim.FREED

    def add(slot: int) -> None:
        conn.execute(_ADD, {"slot": slot})

    # A slot in use (by an open transmitting transaction or a reader) is passed over.
    others = [x for x in ring if x != cur]
    target = next_slot(ring, others, reclaim, add, max_slots=max_slots, busy_waits=False)
    if target is None:
        return None
    conn.execute(_CLOSE, {"slot": cur, "now": now})
    _STATE.switch(conn, target, now)
    conn.execute(_CARRY_TICK, {"slot": target, "now": now})
    return target


def slot_sizes(conn: Connection) -> list[QueueSlot]:
    """Every slot: entries stored and bytes on disk (all its partitions, with indexes)."""
    cur = _STATE.read(conn)[0]
    return [
        QueueSlot("send", int(slot), int(slot) == cur, int(n), int(size))
        for slot, n, size in conn.execute(_SIZES, {"tables": _TABLES}).all()
    ]


__all__ = [
    "DEFAULT_MAX_SLOTS",
    "DEFAULT_PERIOD",
    "MarksCache",
    "Retirement",
    "retire",
    "rotate",
    "slot_sizes",
]
