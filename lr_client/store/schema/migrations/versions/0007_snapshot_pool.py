"""Snapshot entries in a pool of slots: PostgreSQL releases a snapshot by TRUNCATE.

Revision ID: 0007
Revises: 0006

``lrq_snapshots.snap_slot`` (nullable, unique): the slot holding a
snapshot's entries, from its start until they are released. On PostgreSQL
``lrq_send_snapsync`` becomes ``PARTITION BY LIST (snap_slot)`` with one
partition per slot (``lrq_send_snapsync_p0``, ...; more are made on demand,
:mod:`lr_client.store.snapshots.pool`), so a finished snapshot's entries go
by truncating its partition, which leaves no dead tuple behind.

PostgreSQL, under an EXCLUSIVE lock of ``lrq_snapshots`` (taken first, in the
order every writer of snapshot entries takes the two tables) and an ACCESS
EXCLUSIVE lock of the old ``lrq_send_snapsync``: the partitioned table is
created under the old name, keeping the ``position`` sequence (positions go
on above the stored ones); each RUNNING or READY snapshot (the ones that can
hold entries) gets a slot of its own, in the order of creation, and its
entries are moved there; entries of finished snapshots are dropped (trim
would delete them). Its keys hold the partition key, as they must on a
partitioned table: the primary key ``(position, snap_slot)`` and the unique
key ``(snapshot_id, part, seq, snap_slot)``, whose leading columns serve
reads by snapshot, pruned to the slot's partition or not. A writer of the
previous release fails after the upgrade (it gives no slot), it never writes
entries nobody releases.

SQLite: ``lrq_snapshots.snap_slot`` only, with slots for the running and
ready snapshots; its entries table is unchanged (SQLite reuses the pages a
DELETE frees).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_OPEN_WITH_ENTRIES = sa.text(
    "SELECT snapshot_id FROM lrq_snapshots WHERE status IN ('running', 'ready') "
    "ORDER BY created_at, snapshot_id"
)
_SET_SLOT = sa.text("UPDATE lrq_snapshots SET snap_slot = :slot WHERE snapshot_id = :sid")

_PG_BEFORE = (
    "LOCK TABLE lrq_snapshots IN EXCLUSIVE MODE",
    "LOCK TABLE lrq_send_snapsync IN ACCESS EXCLUSIVE MODE",
    "ALTER TABLE lrq_send_snapsync RENAME TO lrq_send_snapsync_0005",
    "ALTER TABLE lrq_send_snapsync_0005 DROP CONSTRAINT lrq_send_snapsync_key",
    "ALTER TABLE lrq_send_snapsync_0005 DROP CONSTRAINT lrq_send_snapsync_pkey",
    """
    CREATE TABLE lrq_send_snapsync (
      position bigint NOT NULL DEFAULT nextval('lrq_send_snapsync_position_seq'::regclass),
      snapshot_id varchar(64) NOT NULL,
      part integer NOT NULL,
      seq bigint NOT NULL,
      type smallint NOT NULL,
      payload bytea NOT NULL,
      snap_slot integer NOT NULL,
      CONSTRAINT lrq_send_snapsync_pkey PRIMARY KEY (position, snap_slot),
      CONSTRAINT lrq_send_snapsync_key UNIQUE (snapshot_id, part, seq, snap_slot)
    ) PARTITION BY LIST (snap_slot)
    """,
    "ALTER SEQUENCE lrq_send_snapsync_position_seq OWNED BY lrq_send_snapsync.position",
)
_PG_MOVE = sa.text(
    "INSERT INTO lrq_send_snapsync (position, snapshot_id, part, seq, type, payload, snap_slot) "
    "SELECT position, snapshot_id, part, seq, type, payload, :slot "
    "FROM lrq_send_snapsync_0005 WHERE snapshot_id = :sid"
)


def _pg_partition(slot: int) -> None:
    """Slot ``slot``'s partition (its name made of the integer alone)."""
    name = f"lrq_send_snapsync_p{int(slot)}"
    op.execute(f"CREATE TABLE {name} (LIKE lrq_send_snapsync)")
    op.execute(f"ALTER TABLE lrq_send_snapsync ATTACH PARTITION {name} FOR VALUES IN ({int(slot)})")


def upgrade() -> None:
    bind = op.get_bind()
    pg = bind.dialect.name == "postgresql"
    if pg:
        for statement in _PG_BEFORE:
            op.execute(statement)
    op.add_column("lrq_snapshots", sa.Column("snap_slot", sa.Integer, nullable=True))
    op.create_index("lrq_snapshots_slot", "lrq_snapshots", ["snap_slot"], unique=True)
    holders = bind.execute(_OPEN_WITH_ENTRIES).scalars().all()
    for slot, snapshot_id in enumerate(holders):
        if pg:
            _pg_partition(slot)
            bind.execute(_PG_MOVE, {"slot": slot, "sid": snapshot_id})
        bind.execute(_SET_SLOT, {"slot": slot, "sid": snapshot_id})
    if pg:
        if not holders:
            _pg_partition(0)
        op.execute("DROP TABLE lrq_send_snapsync_0005")
