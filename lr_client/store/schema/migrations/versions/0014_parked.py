"""Parked entries and blocked queues at the sink.

Revision ID: 0014
Revises: 0013

``lrq_parked``: the dead-letter table of the receive queues, an entry whose
listener kept failing under the ``park`` policy (and the later entries of its
key held behind it), with the error, the attempts, the failure times, its state
(parked, held, retrying, retried, discarded) and who discarded it when.
``lrq_blocked``: a queue or partition whose delivery failed ``max_attempts``
times in a row, with the last error. Two new, empty tables: no row is
rewritten (see :mod:`lr_client.store.recv.parked`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lrq_parked",
        sa.Column("parked_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("queue_id", sa.Integer, nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("source_id", sa.String(63), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("source_position", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("partition_key", sa.LargeBinary),
        sa.Column("headers", sa.LargeBinary),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("first_failed_at", sa.Double, nullable=False),
        sa.Column("last_failed_at", sa.Double, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("retried_at", sa.Double),
        sa.Column("discarded_by", sa.String(128)),
        sa.Column("discarded_at", sa.Double),
    )
    op.create_index("lrq_parked_queue", "lrq_parked", ["queue_id", "state", "seq"])
    op.create_table(
        "lrq_blocked",
        sa.Column("queue_id", sa.Integer, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("first_failed_at", sa.Double, nullable=False),
        sa.Column("last_failed_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("queue_id", "partition"),
    )


def downgrade() -> None:
    op.drop_table("lrq_blocked")
    op.drop_index("lrq_parked_queue", table_name="lrq_parked")
    op.drop_table("lrq_parked")
