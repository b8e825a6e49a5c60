"""Partition keys on entries; per-partition delivery state of receive queues.

Revision ID: 0011
Revises: 0010

``partition_key`` (bytes, NULL: no key) on the send queue, the snapshot
entries and the receive queues: an entry's key travels with it to the sink,
where a subscriber with ``partitions = N`` delivers the entries of different
keys in parallel and those of one key in order. On PostgreSQL the column is
added to the partitioned parents (their partitions get it) and the view
``lrq_send_log_entries`` is made again with it; on SQLite it is added to the
tables.

``lrq_subscriber_state.partitions``: the partition count a receive queue is
delivered with (0: never delivered by partition). ``lrq_subscriber_partitions``:
per queue and partition, every keyed entry of that partition with ``seq <=
delivered_seq`` was delivered. The queue's own ``delivered_seq`` stays the
minimum over its partitions, so receive queue retirement is unchanged.

Every column is nullable or has a default: no row is rewritten, and senders
and subscribers of the previous release keep working (their entries have no
key).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_POSTGRES = (
    "ALTER TABLE lrq_send_entries ADD COLUMN partition_key bytea",
    "DROP VIEW lrq_send_log_entries",
    """
    CREATE VIEW lrq_send_log_entries AS
    SELECT p.position, p.client_name, e.payload, p.dest_nums, p.created_at, e.partition_key
    FROM lrq_send_positions p
    LEFT JOIN lrq_send_entries e ON e.txid = p.txid AND e.ord = p.ord AND e.slot = p.slot
    """,
)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        for statement in _POSTGRES:
            op.execute(statement)
    else:
        op.add_column("lrq_send_log_entries", sa.Column("partition_key", sa.LargeBinary))
    op.add_column("lrq_send_snapsync", sa.Column("partition_key", sa.LargeBinary))
    op.add_column("lrq_recv_entries", sa.Column("partition_key", sa.LargeBinary))
    op.add_column(
        "lrq_subscriber_state",
        sa.Column("partitions", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "lrq_subscriber_partitions",
        sa.Column("queue_id", sa.Integer, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("delivered_seq", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("delivered", sa.BigInteger, nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("queue_id", "partition"),
    )
