"""The snapshots' tables: shared snapshots, the destinations in each, their entries.

``lrq_send_snapsync`` is ``LRQ_Send_SnapSync``: snapshot entries, keyed by
``(snapshot_id, part, seq)`` so a retried writer never duplicates. On
PostgreSQL it is partitioned by the slot of the entry's snapshot
(``lrq_snapshots.snap_slot``), so a finished snapshot's entries go by
TRUNCATE (:mod:`lr_client.store.snapshots.pool`, revision 0007).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    column,
    table,
)

from lr_client.store.schema.metadata import BigId, metadata

send_snapsync = Table(
    "lrq_send_snapsync",
    metadata,
    Column("position", BigId, primary_key=True, autoincrement=True),
    Column("snapshot_id", String(64), nullable=False),
    Column("part", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("type", SmallInteger, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("partition_key", LargeBinary),
    UniqueConstraint("snapshot_id", "part", "seq", name="lrq_send_snapsync_key"),
    sqlite_autoincrement=True,
    # PostgreSQL: partitioned by snap_slot, created in SQL (revision 0007).
    info={"partitioned_on": "postgresql"},
)
#: PostgreSQL's ``lrq_send_snapsync`` (revision 0007): the columns above and
#: ``snap_slot``, its ``LIST`` partition key, with a partition
#: ``lrq_send_snapsync_p<slot>`` per slot of the pool. Its primary key is
#: ``(position, snap_slot)`` and its unique key ``(snapshot_id, part, seq,
#: snap_slot)``: a key of a partitioned table holds the partition key.
send_snapsync_slotted = table(
    send_snapsync.name,
    *(column(c.name, c.type) for c in send_snapsync.c),
    column("snap_slot", Integer()),
)
#: The partitions of PostgreSQL's ``lrq_send_snapsync``: this prefix and a slot number.
SNAPSYNC_PARTITION_PREFIX = "lrq_send_snapsync_p"

snapshots = Table(
    "lrq_snapshots",
    metadata,
    # One snapshot of one client, written once and read by every destination
    # that joined it (``lrq_snapshot_destinations``, revision 0009).
    Column("snapshot_id", String(64), primary_key=True),
    Column("client_name", String(63), nullable=False),
    Column("status", String(16), nullable=False),
    Column("base_position", BigInteger),
    Column("reason", Text, nullable=False, default=""),
    Column("rows_written", BigInteger, nullable=False, default=0),
    Column("entry_count", BigInteger),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    # The pool slot holding the snapshot's entries, from its start until they are
    # released (NULL: none).
    Column("snap_slot", Integer),
)
Index("lrq_snapshots_client", snapshots.c.client_name, snapshots.c.status)
#: A slot is held by one snapshot at most (NULLs do not collide).
Index("lrq_snapshots_slot", snapshots.c.snap_slot, unique=True)

snapshot_destinations = Table(
    "lrq_snapshot_destinations",
    metadata,
    # Each destination's view of a shared snapshot: its own status (open ones
    # follow the snapshot's; COMPLETED, CANCELLED or FAILED for it alone) and
    # how far it has shipped the snapshot's entries.
    Column("snapshot_id", String(64), nullable=False),
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("shipped_position", BigInteger, nullable=False, default=0),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    PrimaryKeyConstraint("snapshot_id", "destination"),
)
Index(
    "lrq_snapshot_destinations_stream",
    snapshot_destinations.c.destination,
    snapshot_destinations.c.client_name,
    snapshot_destinations.c.status,
)


__all__ = [
    "SNAPSYNC_PARTITION_PREFIX",
    "send_snapsync",
    "send_snapsync_slotted",
    "snapshot_destinations",
    "snapshots",
]
