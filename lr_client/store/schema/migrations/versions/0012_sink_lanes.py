"""Lanes: a sink's progress per lane of a stream shipped over several gRPC streams.

Revision ID: 0012
Revises: 0011

``lrq_sink_lanes``: per (source, client, lane count, lane), every entry of that
lane up to ``last_position`` was applied. A source with
``streams_per_destination > 1`` ships one stream's entries over several lanes,
split by the hash of their partition keys; their batches arrive out of global
order, and the sink skips an entry it already holds by its lane's row (see
docs/architecture.md). A new, empty table: no row is rewritten, and streams
shipped over one gRPC stream never use it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lrq_sink_lanes",
        sa.Column("source_id", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("lanes", sa.Integer, nullable=False),
        sa.Column("lane", sa.Integer, nullable=False),
        sa.Column("last_position", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("source_id", "client_name", "lanes", "lane"),
    )


def downgrade() -> None:
    op.drop_table("lrq_sink_lanes")
