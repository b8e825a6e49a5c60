"""Shared snapshots: one snapshot of a client serves every destination that joins it.

Revision ID: 0009
Revises: 0008

``lrq_snapshot_destinations`` holds each destination's view of a snapshot:
its status (an open one follows the snapshot's; COMPLETED, CANCELLED or
FAILED for that destination alone), its reason and how far it shipped the
snapshot's entries (``shipped_position``). ``lrq_snapshots`` keeps what is
the snapshot's own: its status, base position, progress, entry count and
slot; its ``destination`` and ``shipped_position`` move to the new table
(one row per existing snapshot, same status: a snapshot in flight goes on
for its destination, its entries and slot unchanged).

The move runs under an EXCLUSIVE lock of ``lrq_snapshots`` on PostgreSQL:
writers of the previous release wait, then fail on the new columns.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_MOVE = sa.text(
    "INSERT INTO lrq_snapshot_destinations (snapshot_id, destination, client_name, status,"
    " reason, shipped_position, created_at, updated_at)"
    " SELECT snapshot_id, destination, client_name, status, reason, shipped_position,"
    " created_at, updated_at FROM lrq_snapshots"
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("LOCK TABLE lrq_snapshots IN EXCLUSIVE MODE")
    op.create_table(
        "lrq_snapshot_destinations",
        sa.Column("snapshot_id", sa.String(64), nullable=False),
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("shipped_position", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("snapshot_id", "destination"),
    )
    op.create_index(
        "lrq_snapshot_destinations_stream",
        "lrq_snapshot_destinations",
        ["destination", "client_name", "status"],
    )
    bind.execute(_MOVE)
    op.drop_index("lrq_snapshots_stream", table_name="lrq_snapshots")
    with op.batch_alter_table("lrq_snapshots") as batch:
        batch.drop_column("destination")
        batch.drop_column("shipped_position")
    op.create_index("lrq_snapshots_client", "lrq_snapshots", ["client_name", "status"])
