"""Trim marks, stopped streams, drop notices at the sink, the receive queue's end-marker index.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: ReplicationType.LAST_FULL_SYNC_ENTRY, frozen here as this revision wrote it.
_END_MARKER = 3


def upgrade() -> None:
    op.create_table(
        "lrq_trim_marks",
        sa.Column("dest_num", sa.SmallInteger, nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("trimmed_through", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("dest_num", "client_name"),
    )
    # Before this revision trim kept no marks: anything of a stream at or below
    # its cursor may already be gone, and nothing above it (a drop is recorded
    # apart). So the cursor is a safe mark; a lower sink is then re-synced or
    # stopped, never silently resumed past what was trimmed.
    op.execute(
        "INSERT INTO lrq_trim_marks (dest_num, client_name, trimmed_through) "
        "SELECT s.site_num, c.client_name, c.position FROM lrq_cursors c "
        "JOIN lrq_sites s ON s.site_id = c.destination"
    )
    op.create_table(
        "lrq_stream_stops",
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("resume_after", sa.BigInteger, nullable=False),
        sa.Column("stopped_at", sa.Double, nullable=False),
        sa.Column("accepted_at", sa.Double),
        sa.Column("accepted_through", sa.BigInteger),
        sa.Column("resumed_at", sa.Double),
        sa.PrimaryKeyConstraint("destination", "client_name"),
    )
    op.create_table(
        "lrq_sink_drops",
        sa.Column("source_id", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("notice_id", sa.String(64), nullable=False),
        sa.Column("first_dropped_position", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("source_id", "client_name"),
    )
    end = sa.text(f"type = {_END_MARKER}")
    op.create_index(
        "lrq_recv_entries_ends",
        "lrq_recv_entries",
        ["queue_id", "snapshot_id"],
        postgresql_where=end,
        sqlite_where=end,
    )
