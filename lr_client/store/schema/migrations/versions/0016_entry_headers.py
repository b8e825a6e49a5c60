"""Headers on log entries: a small str -> str map stored once, like the payload.

Revision ID: 0016
Revises: 0015

``headers`` (bytes, NULL: none) on the send queue and the receive queues: the
entry's headers in their stored form (compact JSON, :mod:`lr_client.headers`).
On PostgreSQL the column is added to ``lrq_send_entries`` and the partitioned
``lrq_recv_entries`` (their partitions get it), and the view
``lrq_send_log_entries`` is made again with it; on SQLite it is added to the
tables. A nullable column without a default: no row is rewritten, and existing
entries have no headers. Snapshot entries carry none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_VIEW = """
    CREATE VIEW lrq_send_log_entries AS
    SELECT p.position, p.client_name, e.payload, p.dest_nums, p.created_at, e.partition_key{}
    FROM lrq_send_positions p
    LEFT JOIN lrq_send_entries e ON e.txid = p.txid AND e.ord = p.ord AND e.slot = p.slot
    """


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE lrq_send_entries ADD COLUMN headers bytea")
        op.execute("DROP VIEW lrq_send_log_entries")
        op.execute(_VIEW.format(", e.headers"))
    else:
        op.add_column("lrq_send_log_entries", sa.Column("headers", sa.LargeBinary))
    op.add_column("lrq_recv_entries", sa.Column("headers", sa.LargeBinary))


def downgrade() -> None:
    op.drop_column("lrq_recv_entries", "headers")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW lrq_send_log_entries")
        op.execute(_VIEW.format(""))
        op.execute("ALTER TABLE lrq_send_entries DROP COLUMN headers")
    else:
        op.drop_column("lrq_send_log_entries", "headers")
