"""Members of a site and the leases of its units of work.

Revision ID: 0010
Revises: 0009

``lrq_members``: every ``lr server`` process of the site (member id, the
process run that holds it, address, weight, last heartbeat by the database's
clock). ``lrq_unit_leases``: who owns each unit of work (a sender stream,
the trim job) and its fencing token, raised at every change of owner.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lrq_members",
        sa.Column("member_id", sa.String(128), primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("weight", sa.Integer, nullable=False),
        sa.Column("joined_at", sa.Double, nullable=False),
        sa.Column("heartbeat_at", sa.Double, nullable=False),
    )
    op.create_table(
        "lrq_unit_leases",
        sa.Column("unit", sa.String(200), primary_key=True),
        sa.Column("owner", sa.String(64)),
        sa.Column("member_id", sa.String(128), nullable=False),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", sa.Double, nullable=False),
    )
