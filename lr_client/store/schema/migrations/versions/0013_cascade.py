"""Cascades: a node's role in each cascaded client's set, and the nodes below it.

Revision ID: 0013
Revises: 0012

``lrq_cascade``: one row per cascaded client at this node (its origin, its
role, its current provider and the epoch raised by every provider switch, the
provider the configuration named when last applied, the set's global
watermark). ``lrq_cascade_children``: the nodes below this one, as they
reported themselves (epoch, local watermark, acknowledged origin position,
report time, dropped). Two new, empty tables: no row is rewritten, and sites
without ``[cascade.<client>]`` tables never use them (see docs/cascading.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lrq_cascade",
        sa.Column("client_name", sa.String(63), primary_key=True),
        sa.Column("origin_id", sa.String(63), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("provider_id", sa.String(63), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("config_provider", sa.String(63), nullable=False),
        sa.Column("global_watermark", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    op.create_table(
        "lrq_cascade_children",
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("child_id", sa.String(63), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("local_watermark", sa.BigInteger, nullable=False),
        sa.Column("acked_position", sa.BigInteger, nullable=False),
        sa.Column("reported_at", sa.Double, nullable=False),
        sa.Column("dropped", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("client_name", "child_id"),
    )


def downgrade() -> None:
    op.drop_table("lrq_cascade_children")
    op.drop_table("lrq_cascade")
