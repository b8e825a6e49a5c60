"""PostgreSQL: the sequencer's tick is one call of a PL/pgSQL function.

Revision ID: 0019
Revises: 0018

A tick (:mod:`lr_client.store.send.sequencer`) was five round trips: BEGIN, the
advisory lock, the plan's settings, the tick's statement, COMMIT. Every read of
the send queue ticks first, so at live rates a sender paid them per batch.
``lrq_send_tick`` takes the lock and runs the same statement (its settings are
the function's own), so a tick is one statement, in its own transaction or in
the caller's. A VOLATILE function's statement takes a new snapshot, after the
lock is granted: it sees the previous tick, as before. SQLite is unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# The statement of the tick as of this revision (a later change is a new revision).
_TICK = """
DO $do$ BEGIN EXECUTE format($f$
  CREATE OR REPLACE FUNCTION %1$I.lrq_send_tick(
    lock_key bigint, ticked double precision,
    OUT ticked_txns bigint, OUT ticked_entries bigint
  )
  LANGUAGE plpgsql VOLATILE
  SET search_path = %1$I
  SET jit = off
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $b$
  BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
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
               last.head + (SELECT sum(size) FROM blocks), ticked
        FROM last WHERE EXISTS (SELECT 1 FROM blocks)
    )
    SELECT count(*), coalesce(sum(size), 0) INTO ticked_txns, ticked_entries FROM blocks;

  END
  $b$ $f$, current_schema());
END $do$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_TICK)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS lrq_send_tick(bigint, double precision)")
