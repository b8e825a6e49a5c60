"""PostgreSQL's rings of slots: what the send queue and the receive queues rotate alike.

Both queues keep their rows in slots (a partition per slot) retired whole by
TRUNCATE, never row by row: the send queue (:mod:`lr_client.store.retention.slots`)
and the receive queues (:mod:`lr_client.store.recv.rotation`). Each has a
one-row state table (:class:`StateRow`) naming the current slot, where new
rows go, and when it became current. A rotation makes another slot current
(:func:`next_slot`): the first of the others that can be reclaimed (its
lock had, nothing in it still needed, emptied), or else a new slot while the
ring has fewer than its maximum. What a queue still needs, how it locks a
slot and in which order it tries them are its own.

A table partitioned by slot in Python (:class:`Partitions`: the receive
queues, and the snapshot entries' pool, :mod:`lr_client.store.snapshots.pool`)
names, adds, locks and empties its partitions here, every name built from a
checked slot number alone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy import bindparam, column, select, table, text, update
from sqlalchemy.engine import Connection, NestedTransaction
from sqlalchemy.exc import DBAPIError

#: SQLSTATE of a lock not granted within ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"
_TIMEOUT = text("SELECT current_setting('lock_timeout')")
_SET_TIMEOUT = text("SELECT set_config('lock_timeout', :value, true)")


def lock_not_available(exc: DBAPIError) -> bool:
    """Whether ``exc`` is PostgreSQL's refusal of a lock not granted within ``lock_timeout``."""
    return getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


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


class Partitions:
    """The partitions of a table partitioned ``BY LIST`` of a slot: one per slot, named
    ``prefix`` and the slot number (never from input: the number is checked).

    ``defaults``: a new partition copies the parent's column defaults (``LIKE ...
    INCLUDING DEFAULTS``).
    """

    def __init__(self, parent: str, prefix: str, *, defaults: bool = False) -> None:
        self.parent, self.prefix = parent, prefix
        self._like = f"LIKE {parent} INCLUDING DEFAULTS" if defaults else f"LIKE {parent}"

    def name(self, slot: int) -> str:
        """The partition of ``slot``, a non-negative integer (``ValueError`` otherwise)."""
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"a slot is a non-negative integer, got {slot!r}")
        return f"{self.prefix}{slot}"

    def add(self, conn: Connection, slot: int) -> None:
        """A new, empty partition for ``slot``: created apart, then attached.

        ``ATTACH PARTITION`` takes a SHARE UPDATE EXCLUSIVE lock of the parent,
        which readers and writers of other slots do not conflict with (``CREATE
        TABLE ... PARTITION OF`` would take an ACCESS EXCLUSIVE one).
        """
        name = self.name(slot)
        conn.exec_driver_sql(f"CREATE TABLE {name} ({self._like})")
        conn.exec_driver_sql(
            f"ALTER TABLE {self.parent} ATTACH PARTITION {name} FOR VALUES IN ({slot})"
        )

    def lock(
        self, conn: Connection, slot: int, lock_timeout: str | None = None
    ) -> NestedTransaction | None:
        """Take the ACCESS EXCLUSIVE lock of ``slot``'s partition in a new savepoint,
        waiting no longer than ``lock_timeout`` (an interval such as ``"50ms"``; None:
        the transaction's own ``lock_timeout``, which is as it was afterwards either way).

        The savepoint: commit it to keep what follows, roll it back to let the lock
        go. None if the lock was not granted in time (nothing changed).
        """
        name = self.name(slot)
        savepoint = conn.begin_nested()
        try:
            if lock_timeout is not None:
                before = conn.execute(_TIMEOUT).scalar_one()
                conn.execute(_SET_TIMEOUT, {"value": lock_timeout})
            conn.exec_driver_sql(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
            if lock_timeout is not None:
                conn.execute(_SET_TIMEOUT, {"value": before})
        except DBAPIError as exc:
            savepoint.rollback()
            if lock_not_available(exc):
                return None
            raise
        return savepoint

    def truncate(self, conn: Connection, slot: int) -> None:
        """Empty ``slot``'s partition (lock it first: :meth:`lock`)."""
        conn.exec_driver_sql(f"TRUNCATE {self.name(slot)}")


__all__ = [
    "LOCK_NOT_AVAILABLE",
    "Partitions",
    "Reclaim",
    "StateRow",
    "lock_not_available",
    "next_slot",
]
