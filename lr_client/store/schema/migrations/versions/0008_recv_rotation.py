"""Receive queues: delivery deletes nothing; PostgreSQL retires them by TRUNCATE.

Revision ID: 0008
Revises: 0007

``lrq_subscriber_state.delivered_seq``: every entry of the queue with
``seq <= delivered_seq`` has been delivered, and readers see only those
above it. Until now delivery deleted what it delivered, so every delivered
entry left a dead tuple until vacuum, and with the vacuum horizon pinned (a
long transaction anywhere in the cluster) the table grew without bound.

PostgreSQL: ``lrq_recv_entries`` becomes ``PARTITION BY LIST (slot)``, a
ring of partitions ``lrq_recv_entries_s0 .. s3``; ``lrq_recv_state`` (one
row) says which slot new rows go to. The upgrade takes the old table's
exclusive lock (appliers and subscribers of the previous release wait, then
fail on the new schema), moves its rows into slot 0 keeping their ``seq``,
and keeps the ``seq`` sequence, so numbers continue above the stored ones.
Each queue's ``delivered_seq`` starts just below its oldest stored entry
(every stored entry is undelivered: delivery deleted the others), 0 for a
queue with none (every later entry is above it).

SQLite: the column only (it keeps deleting delivered entries: see
:mod:`lr_client.store.recv.queues`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SLOTS = 4

_POSTGRES = (
    "LOCK TABLE lrq_recv_entries IN ACCESS EXCLUSIVE MODE",
    "ALTER TABLE lrq_recv_entries RENAME TO lrq_recv_entries_0005",
    "ALTER TABLE lrq_recv_entries_0005 RENAME CONSTRAINT lrq_recv_entries_pkey "
    "TO lrq_recv_entries_0005_pkey",
    "DROP INDEX lrq_recv_entries_queue",
    "DROP INDEX lrq_recv_entries_ends",
    # The sequence outlives the old table: numbers continue above the stored ones.
    "ALTER SEQUENCE lrq_recv_entries_seq_seq OWNED BY NONE",
    """
    CREATE TABLE lrq_recv_entries (
      seq bigint NOT NULL DEFAULT nextval('lrq_recv_entries_seq_seq'),
      queue_id integer NOT NULL,
      type smallint NOT NULL,
      source_position bigint NOT NULL,
      snapshot_id varchar(64) NOT NULL,
      snapshot_count bigint NOT NULL,
      payload bytea NOT NULL,
      received_at double precision NOT NULL,
      base_position bigint,
      slot smallint NOT NULL DEFAULT 0,
      CONSTRAINT lrq_recv_entries_pkey PRIMARY KEY (seq, slot)
    ) PARTITION BY LIST (slot)
    """,
    "ALTER SEQUENCE lrq_recv_entries_seq_seq OWNED BY lrq_recv_entries.seq",
    *(
        f"CREATE TABLE lrq_recv_entries_s{n} PARTITION OF lrq_recv_entries FOR VALUES IN ({n})"
        for n in range(_SLOTS)
    ),
    "CREATE INDEX lrq_recv_entries_queue ON lrq_recv_entries (queue_id, seq)",
    "CREATE INDEX lrq_recv_entries_ends ON lrq_recv_entries (queue_id, snapshot_id) WHERE type = 3",
    "INSERT INTO lrq_recv_entries (seq, queue_id, type, source_position, snapshot_id,"
    " snapshot_count, payload, received_at, base_position, slot)"
    " SELECT seq, queue_id, type, source_position, snapshot_id, snapshot_count, payload,"
    " received_at, base_position, 0 FROM lrq_recv_entries_0005",
    "DROP TABLE lrq_recv_entries_0005",
    """
    CREATE TABLE lrq_recv_state (
      id smallint PRIMARY KEY,
      cur_slot smallint NOT NULL,
      rotated_at double precision NOT NULL
    )
    """,
    "INSERT INTO lrq_recv_state (id, cur_slot, rotated_at)"
    " VALUES (1, 0, extract(epoch FROM clock_timestamp()))",
)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        for statement in _POSTGRES:
            op.execute(statement)
    op.add_column(
        "lrq_subscriber_state",
        sa.Column("delivered_seq", sa.BigInteger, nullable=False, server_default="0"),
    )
    # Every stored entry is undelivered (delivery deleted the others).
    op.execute(
        "UPDATE lrq_subscriber_state SET delivered_seq = coalesce("
        "(SELECT min(r.seq) - 1 FROM lrq_recv_entries r"
        " WHERE r.queue_id = lrq_subscriber_state.queue_id), 0)"
    )
