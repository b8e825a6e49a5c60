"""The first released schema (version 1), frozen as it was created then.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.create_table(
        "lrq_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "lrq_sites",
        sa.Column("site_num", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("site_id", sa.String(63), nullable=False, unique=True),
    )
    op.create_table(
        "lrq_send_log_entries",
        sa.Column("position", _BigId, primary_key=True, autoincrement=True),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column(
            "dest_nums",
            sa.Text().with_variant(postgresql.ARRAY(sa.SmallInteger), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.Double, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "lrq_send_log_entries_client", "lrq_send_log_entries", ["client_name", "position"]
    )
    if sqlite:
        op.create_table(
            "lrq_send_tags",
            sa.Column("dest_num", sa.SmallInteger, nullable=False),
            sa.Column("position", sa.BigInteger, nullable=False),
            sa.PrimaryKeyConstraint("dest_num", "position"),
            sqlite_with_rowid=False,
        )
    else:
        op.create_index(
            "lrq_send_log_entries_dests",
            "lrq_send_log_entries",
            ["dest_nums"],
            postgresql_using="gin",
        )
    op.create_table(
        "lrq_send_snapsync",
        sa.Column("position", _BigId, primary_key=True, autoincrement=True),
        sa.Column("snapshot_id", sa.String(64), nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("type", sa.SmallInteger, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.UniqueConstraint("snapshot_id", "part", "seq", name="lrq_send_snapsync_key"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "lrq_snapshots",
        sa.Column("snapshot_id", sa.String(64), primary_key=True),
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("base_position", sa.BigInteger),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("rows_written", sa.BigInteger, nullable=False),
        sa.Column("entry_count", sa.BigInteger),
        sa.Column("shipped_position", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    op.create_index(
        "lrq_snapshots_stream", "lrq_snapshots", ["destination", "client_name", "status"]
    )
    op.create_table(
        "lrq_cursors",
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("acked_at", sa.Double, nullable=False),
        sa.Column("needs_snapshot", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("destination", "client_name"),
    )
    op.create_table(
        "lrq_drops",
        sa.Column("destination", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("first_dropped_position", sa.BigInteger, nullable=False),
        sa.Column("dropped_at", sa.Double, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("destination", "client_name"),
    )
    op.create_table(
        "lrq_queue_registry",
        sa.Column("queue_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("queue_name", sa.String(200), nullable=False, unique=True),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("source_id", sa.String(63), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    op.create_table(
        "lrq_recv_entries",
        sa.Column("seq", _BigId, primary_key=True, autoincrement=True),
        sa.Column("queue_id", sa.Integer, nullable=False),
        sa.Column("type", sa.SmallInteger, nullable=False),
        sa.Column("source_position", sa.BigInteger, nullable=False),
        sa.Column("snapshot_id", sa.String(64), nullable=False),
        sa.Column("snapshot_count", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("lrq_recv_entries_queue", "lrq_recv_entries", ["queue_id", "seq"])
    op.create_table(
        "lrq_sink_progress",
        sa.Column("source_id", sa.String(63), nullable=False),
        sa.Column("client_name", sa.String(63), nullable=False),
        sa.Column("last_position", sa.BigInteger, nullable=False),
        sa.Column("snapshot_state", sa.SmallInteger, nullable=False),
        sa.Column("snapshot_id", sa.String(64), nullable=False),
        sa.Column("snapshot_position", sa.BigInteger, nullable=False),
        sa.Column("entries_received", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("source_id", "client_name"),
    )
    op.create_table(
        "lrq_subscriber_state",
        sa.Column("queue_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("snapshot_id", sa.String(64), nullable=False),
        sa.Column("in_snapshot", sa.Boolean, nullable=False),
        sa.Column("delivered", sa.BigInteger, nullable=False),
        sa.Column("lease_owner", sa.String(128), nullable=False),
        sa.Column("lease_expires", sa.Double, nullable=False),
    )
    op.create_table(
        "lrq_flow_control",
        sa.Column("client_name", sa.String(63), primary_key=True),
        sa.Column("backpressure", sa.Boolean, nullable=False),
        sa.Column("slow_destinations", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    op.create_table(
        "lrq_session_status",
        sa.Column("destination", sa.String(63), primary_key=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("connected", sa.Boolean, nullable=False),
        sa.Column("inflight_batches", sa.Integer, nullable=False),
        sa.Column("inflight_bytes", sa.BigInteger, nullable=False),
        sa.Column("last_error", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
