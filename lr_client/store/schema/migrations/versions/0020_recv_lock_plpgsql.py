"""PostgreSQL: a receive batch's stream lock, progress, slot and notification in one call.

Revision ID: 0020
Revises: 0019

Every batch a sink applies took its stream's lock, then read the stream's
progress, then the receive queues' current slot: three round trips, paid per
batch at live rates, and a fourth to notify the subscribers. ``lrq_recv_lock``
takes the same lock (the key is the caller's, as before), then reads both, so
the reads take their snapshot after the lock is granted, as the separate
statements did (a VOLATILE function's statements each take a new one), and,
for a log batch reaching ``through``, past the stream's position, notifies
``channel`` (NULL: none) unless PostgreSQL's notification queue is past
``usage_limit``; a notification is sent at commit, as before, and a repeated
batch sends none. No row is rewritten; SQLite is unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_LOCK = """
DO $do$ BEGIN EXECUTE format($f$
  CREATE OR REPLACE FUNCTION %1$I.lrq_recv_lock(
    stream_key text, source text, client text,
    channel text, through bigint, usage_limit double precision,
    OUT cur_slot smallint, OUT known boolean,
    OUT source_id varchar, OUT client_name varchar, OUT last_position bigint,
    OUT snapshot_state smallint, OUT snapshot_id varchar, OUT snapshot_position bigint,
    OUT entries_received bigint, OUT updated_at double precision
  )
  LANGUAGE plpgsql VOLATILE
  SET search_path = %1$I
  AS $b$
  #variable_conflict use_column
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(stream_key, 0));
    SELECT st.cur_slot INTO cur_slot FROM lrq_recv_state st WHERE st.id = 1;
    SELECT true, p.source_id, p.client_name, p.last_position, p.snapshot_state,
           p.snapshot_id, p.snapshot_position, p.entries_received, p.updated_at
      INTO known, source_id, client_name, last_position, snapshot_state,
           snapshot_id, snapshot_position, entries_received, updated_at
      FROM lrq_sink_progress p
     WHERE p.source_id = source AND p.client_name = client;
    IF channel IS NOT NULL AND through > coalesce(last_position, 0)
       AND pg_notification_queue_usage() < usage_limit THEN
      PERFORM pg_notify(channel, client);
    END IF;
  END
  $b$ $f$, current_schema());
END $do$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_LOCK)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "DROP FUNCTION IF EXISTS"
            " lrq_recv_lock(text, text, text, text, bigint, double precision)"
        )
