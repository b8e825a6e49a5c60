"""Replay requests: ``lr replay`` ships a stream's retained entries again.

Revision ID: 0015
Revises: 0014

``lrq_replays``: one row per request (destination, client, first position,
the last position replayed once the session picks it up, how far it was
acknowledged, its status and error, when it was made and last changed). A
new, empty table: no row is rewritten (see docs/operations.md, "Deliver a
range again").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lrq_replays",
        sa.Column("replay_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("from_position", sa.BigInteger, nullable=False),
        sa.Column("through_position", sa.BigInteger),
        sa.Column("shipped_through", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("requested_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("lrq_replays")
