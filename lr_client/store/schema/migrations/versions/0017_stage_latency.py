"""Per-stage latency of each hop, recorded by the processes that measure it.

Revision ID: 0017
Revises: 0016

``lrq_stage_latency``: one row per (peer, client, stage): the batches summed up and
their median, 99th percentile and largest time in the stage, in seconds, and when the
row was written (see :mod:`lr_client.store.latency`). A new, empty table: no row is
rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lrq_stage_latency",
        sa.Column("peer", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("batches", sa.Integer, nullable=False),
        sa.Column("p50", sa.Double, nullable=False),
        sa.Column("p99", sa.Double, nullable=False),
        sa.Column("max", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("peer", "client_name", "stage"),
    )


def downgrade() -> None:
    op.drop_table("lrq_stage_latency")
