"""PostgreSQL's rings of slots: what the send queue and the receive queues rotate alike.

Both queues keep their rows in slots (a partition per slot) retired whole by
TRUNCATE, never row by row: the send queue (:mod:`lr_client.store.slots`)
and the receive queues (:mod:`lr_client.store.recv_rotation`). Each has a
one-row state table (:class:`StateRow`) naming the current slot, where new
rows go, and when it became current. A rotation makes another slot current
(:func:`next_slot`): the first of the others that can be reclaimed (its
lock had, nothing in it still needed, emptied), or else a new slot while the
ring has fewer than its maximum. What a queue still needs, how it locks a
slot and in which order it tries them are its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy import bindparam, column, select, table, update
from sqlalchemy.engine import Connection


class StateRow:
    """A ring's state table: one row (``id = 1``), its ``cur_slot`` and ``rotated_at``."""

    def __init__(self, name: str) -> None:
        t = table(name, column("id"), column("cur_slot"), column("rotated_at"))
        row = t.c.id == 1
        self._read = select(t.c.cur_slot, t.c.rotated_at).where(row)
        self._switch = (
            update(t).where(row).values(cur_slot=bindparam("slot"), rotated_at=bindparam("now"))
        )

    def read(self, conn: Connection, *, for_update: bool = False) -> tuple[int, float]:
        """The current slot and when it became current (``for_update``: the row locked)."""
        query = self._read.with_for_update() if for_update else self._read
        cur, rotated_at = conn.execute(query).one()
        return int(cur), float(rotated_at)

    def switch(self, conn: Connection, slot: int, now: float) -> None:
        """Make ``slot`` current as of ``now``."""
        conn.execute(self._switch, {"slot": slot, "now": now})


class Reclaim(enum.Enum):
    """What an attempt to reclaim a slot for the current one found."""

    FREED = "freed"  # empty now: it can become current
    BUSY = "busy"  # in use: its lock was not had
    PINNED = "pinned"  # it holds rows still needed


def next_slot(
    ring: Sequence[int],
    candidates: Iterable[int],
    reclaim: Callable[[int], Reclaim],
    add: Callable[[int], None],
    *,
    max_slots: int,
    busy_waits: bool,
) -> int | None:
    """The slot to make current: the first of ``candidates`` that ``reclaim`` freed, else
    a new one (``add`` creates it) numbered after the ``ring``'s while it has fewer than
    ``max_slots``.

    None: no slot freed and the ring full, or, with ``busy_waits``, a candidate was
    only busy (it is tried again at the next rotation instead of growing the ring).
    """
    busy = False
    for slot in candidates:
        found = reclaim(slot)
        if found is Reclaim.FREED:
            return slot
        busy |= found is Reclaim.BUSY
    if (busy_waits and busy) or len(ring) >= max_slots:
        return None
    new = max(ring) + 1
    add(new)
    return new


__all__ = ["Reclaim", "StateRow", "next_slot"]
