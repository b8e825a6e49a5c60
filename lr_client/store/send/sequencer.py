"""PostgreSQL's commit-order sequencer: positions assigned after commit.

A transmitting transaction only inserts its entries into ``lrq_send_entries``,
named ``(txid, ord)``: its transaction id and the entry's ordinal in the
transaction (1, 2, ...). The first insert queues a deferred constraint trigger
that writes the transaction's **commit stamp** ``(txid, commit_seq)`` at
COMMIT, ``commit_seq`` from a sequence. Nothing is shared between transmitting
transactions but that sequence, so they never wait for each other.

A **tick** (:func:`tick`) gives positions to the transactions that committed
since the previous tick. Ticks run one at a time (a transaction-scoped
advisory lock), each in one statement (the function ``lrq_send_tick`` of
revision 0019, one call), so with one snapshot ``S``:

* the fresh stamps are those visible in ``S`` and not in the previous tick's
  snapshot: ids at or above its ``xmax``, or in its in-progress list (PgQ's
  batch rule). Visible stamps are exactly committed transactions', since a
  stamp commits with its transaction;
* they are ordered by ``commit_seq``, and each transaction gets the block of
  positions ``head + 1 ..`` of its size (its largest ordinal), in that order;
  an entry's position is its block's base plus its ordinal;
* the positions rows, the blocks and the new tick (``S``, the new head) are
  written in that statement's transaction.

Why this keeps invariant I1 (no reader skips a committed entry): tick k+1
takes the lock after tick k committed, so its snapshot sees tick k and its
positions start above tick k's head; a reader sees a tick's rows all at once
and never tick k+1 without tick k. Why it keeps commit order for transactions
that conflict on a row (I2): the waiter's stamp is written at its COMMIT,
after its wait, and PostgreSQL makes a commit visible before it releases the
row locks, so the holder's ``commit_seq`` is lower and every snapshot that
shows the waiter shows the holder. A transaction that never transmits (even
one idle for hours) writes no stamp and holds nothing back: a tick never
waits for old transactions. ``docs/architecture.md`` has the whole argument.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

#: High half of the sequencer's advisory lock key ("LRQ2"); the low half is the
#: entries table's oid, so stores in different schemas tick independently.
TICK_LOCK_KEY = 0x4C525132

_TABLE_OID = text("SELECT CAST(CAST('lrq_send_entries' AS regclass) AS oid)")

#: The tick: the lock, then the statement (revision 0019's ``lrq_send_tick``). Its plan
#: is set by the function: estimates are blind (the fresh stamps are bounded by a
#: snapshot read in the same statement, so the planner guesses thousands where a tick
#: finds a few), and left to them it would scan and sort every stamp and entry of the
#: current slot on every tick; JIT is off, as its threshold is passed by estimates
#: over many slots' partitions, and compiling costs far more than the tick.
_TICK = text("SELECT ticked_txns, ticked_entries FROM lrq_send_tick(:key, :now)")

_HEAD = text("SELECT head FROM lrq_send_ticks ORDER BY tick_id DESC LIMIT 1")

_BASES = text(
    "SELECT CAST(CAST(txid AS text) AS bigint), base FROM lrq_send_blocks "
    "WHERE txid = ANY(CAST(CAST(:txids AS text[]) AS xid8[]))"
)


def lock_key(conn: Connection) -> int:
    """The sequencer's advisory lock of the store's entries table."""
    oid = int(conn.execute(_TABLE_OID).scalar_one())
    return (TICK_LOCK_KEY << 32) | oid


def tick(conn: Connection, key: int) -> tuple[int, int]:
    """Sequence what committed since the last tick: (transactions, entries).

    One statement: in autocommit, its own transaction; in a READ COMMITTED
    transaction, commit right after (the lock is held until then). The function
    takes the lock first, so its statement (a new snapshot) sees the previous tick.
    """
    row = conn.execute(_TICK, {"key": key, "now": time.time()}).one()
    return int(row[0]), int(row[1])


def head(conn: Connection) -> int:
    """The highest position given so far (0 if none)."""
    return int(conn.execute(_HEAD).scalar() or 0)


def bases(conn: Connection, txids: Sequence[int]) -> dict[int, int]:
    """{txid: base} of the given transactions that were sequenced and whose slot is kept."""
    rows = conn.execute(_BASES, {"txids": [str(t) for t in txids]}).all()
    return {int(t): int(b) for t, b in rows}


__all__ = ["TICK_LOCK_KEY", "bases", "head", "lock_key", "tick"]
