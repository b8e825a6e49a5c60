"""PostgreSQL's commit-order sequencer: positions assigned after commit.

A transmitting transaction only inserts its entries into ``lrq_send_entries``,
named ``(txid, ord)``: its transaction id and the entry's ordinal in the
transaction (1, 2, ...). The first insert queues a deferred constraint trigger
that writes the transaction's **commit stamp** ``(txid, commit_seq)`` at
COMMIT, ``commit_seq`` from a sequence. Nothing is shared between transmitting
transactions but that sequence, so they never wait for each other.

A **tick** (:func:`tick`) gives positions to the transactions that committed
since the previous tick. Ticks run one at a time (a transaction-scoped
advisory lock), each in one statement, so with one snapshot ``S``:

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

_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
#: The tick's plan, for its transaction only. Its estimates are blind (the fresh
#: stamps are bounded by a snapshot read in the same statement, so the planner
#: guesses thousands where a tick finds a few): left to them it scans and sorts
#: every stamp and entry of the current slot on every tick, a cost that grows with
#: the slot (tens of thousands of rows per tick at 1,000 transactions/s). Index
#: look-ups per fresh stamp cost what the tick does. JIT off: the estimate over
#: many slots' partitions can pass its threshold, and compiling costs far more
#: than the tick.
_PLAN = text(
    "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true), "
    "set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
)

# One statement, so one snapshot: pg_current_snapshot() is the snapshot the
# statement reads the stamps with.
_TICK = text(
    """
    WITH last AS (
        SELECT tick_id, snap, head,
               pg_snapshot_xmax(pg_current_snapshot()) < pg_snapshot_xmax(snap) AS went_back
        FROM lrq_send_ticks ORDER BY tick_id DESC LIMIT 1
    ), fresh AS (
        SELECT c.slot, c.txid, c.commit_seq FROM lrq_send_commits c, last
        WHERE NOT last.went_back AND c.txid >= pg_snapshot_xmax(last.snap)
        UNION ALL
        SELECT c.slot, c.txid, c.commit_seq FROM lrq_send_commits c, last
        WHERE NOT last.went_back AND c.txid = ANY(ARRAY(SELECT pg_snapshot_xip(last.snap)))
        UNION ALL
        -- Transaction ids went back (a database restored from a logical dump):
        -- the last snapshot means nothing here; take every stamp not sequenced.
        SELECT c.slot, c.txid, c.commit_seq FROM lrq_send_commits c, last
        WHERE last.went_back
          AND NOT EXISTS (SELECT 1 FROM lrq_send_blocks b
                          WHERE b.txid = c.txid AND b.slot = c.slot)
    ), sized AS (
        SELECT f.slot, f.txid, f.commit_seq,
               coalesce((SELECT max(e.ord) FROM lrq_send_entries e
                         WHERE e.txid = f.txid AND e.slot = f.slot), 0) AS size
        FROM fresh f
    ), blocks AS (
        SELECT s.slot, s.txid, s.size,
               last.head + sum(s.size) OVER (ORDER BY s.commit_seq) - s.size AS base
        FROM sized s, last
    ), new_blocks AS (
        INSERT INTO lrq_send_blocks (slot, txid, base, size, tick_id)
        SELECT b.slot, b.txid, b.base, b.size, last.tick_id + 1 FROM blocks b, last
    ), new_positions AS (
        INSERT INTO lrq_send_positions
            (slot, position, txid, ord, client_name, dest_nums, created_at)
        SELECT e.slot, b.base + e.ord, e.txid, e.ord, e.client_name, e.dest_nums, e.created_at
        FROM blocks b JOIN lrq_send_entries e ON e.txid = b.txid AND e.slot = b.slot
    ), new_tick AS (
        -- The newest tick is always in the current slot, which is never retired.
        INSERT INTO lrq_send_ticks (slot, tick_id, snap, head, ticked_at)
        SELECT (SELECT cur_slot FROM lrq_send_state), last.tick_id + 1, pg_current_snapshot(),
               last.head + (SELECT sum(size) FROM blocks), :now
        FROM last WHERE EXISTS (SELECT 1 FROM blocks)
    )
    SELECT count(*), coalesce(sum(size), 0) FROM blocks
    """
)

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

    ``conn`` must be in a READ COMMITTED transaction of its own: the lock is
    taken first, so the tick's statement (a new snapshot) sees the previous
    tick. Commit right after.
    """
    conn.execute(_LOCK, {"key": key})
    conn.execute(_PLAN)
    row = conn.execute(_TICK, {"now": time.time()}).one()
    return int(row[0]), int(row[1])


def head(conn: Connection) -> int:
    """The highest position given so far (0 if none)."""
    return int(conn.execute(_HEAD).scalar() or 0)


def bases(conn: Connection, txids: Sequence[int]) -> dict[int, int]:
    """{txid: base} of the given transactions that were sequenced and whose slot is kept."""
    rows = conn.execute(_BASES, {"txids": [str(t) for t in txids]}).all()
    return {int(t): int(b) for t, b in rows}


__all__ = ["TICK_LOCK_KEY", "bases", "head", "lock_key", "tick"]
