"""Receive queues keep a snapshot's base position with its entries.

Revision ID: 0005
Revises: 0004

``lrq_recv_entries.base_position`` (nullable): the base position of the
snapshot an entry belongs to, as the source sent it, so the subscriber can
tell the listener where the snapshot stands at its start and its end. Rows
queued before this revision have none (the listener is told None).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lrq_recv_entries", sa.Column("base_position", sa.BigInteger, nullable=True))
