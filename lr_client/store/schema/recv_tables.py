"""The receive side's tables: receive queues, a sink's progress, delivery's marks.

``lrq_recv_entries`` holds every ``LRQ_Recv_<client>__<source>`` queue,
each a ``queue_id`` of ``lrq_queue_registry``. Delivery deletes nothing:
``lrq_subscriber_state.delivered_seq`` says how far each queue was
delivered. On PostgreSQL the table is ``PARTITION BY LIST (slot)`` with a
ring of partitions ``lrq_recv_entries_s<N>``, created in SQL by revision
0008 (a partitioned table's key must include ``slot``, which SQLite's
rowid ``seq`` cannot), and retired a partition at a time by TRUNCATE
(:mod:`lr_client.store.recv.rotation`); ``lrq_recv_state`` says which
partition new rows go to.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
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
)

from lr_client.records import ReplicationType
from lr_client.store.schema.metadata import BigId, metadata

queue_registry = Table(
    "lrq_queue_registry",
    metadata,
    Column("queue_id", Integer, primary_key=True, autoincrement=True),
    Column("queue_name", String(200), nullable=False, unique=True),
    Column("client_name", String(63), nullable=False),
    Column("source_id", String(63), nullable=False),
    Column("created_at", Double, nullable=False),
)

recv_entries = Table(
    "lrq_recv_entries",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("queue_id", Integer, nullable=False),
    Column("type", SmallInteger, nullable=False),
    Column("source_position", BigInteger, nullable=False),
    Column("snapshot_id", String(64), nullable=False, default=""),
    Column("snapshot_count", BigInteger, nullable=False, default=0),
    Column("payload", LargeBinary, nullable=False),
    Column("received_at", Double, nullable=False),
    # A snapshot entry's base position (NULL: log entries, or sent on the end marker only).
    Column("base_position", BigInteger),
    Column("partition_key", LargeBinary),  # the source's key (NULL: none)
    Column("headers", LargeBinary),  # the source's headers (NULL: none)
    sqlite_autoincrement=True,
    # PostgreSQL: these columns and ``slot smallint`` (the partition key), created in SQL.
    info={"partitioned_on": "postgresql"},
)
#: The partitions of ``lrq_recv_entries`` on PostgreSQL: this prefix and the slot number.
RECV_PARTITION_PREFIX = "lrq_recv_entries_s"
Index("lrq_recv_entries_queue", recv_entries.c.queue_id, recv_entries.c.seq)
#: The end markers only: whether a snapshot is whole at the sink is one probe,
#: and log and snapshot entries cost this index nothing.
_END = recv_entries.c.type == int(ReplicationType.LAST_FULL_SYNC_ENTRY)
Index(
    "lrq_recv_entries_ends",
    recv_entries.c.queue_id,
    recv_entries.c.snapshot_id,
    postgresql_where=_END,
    sqlite_where=_END,
)

sink_progress = Table(
    "lrq_sink_progress",
    metadata,
    Column("source_id", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("last_position", BigInteger, nullable=False, default=0),
    Column("snapshot_state", SmallInteger, nullable=False, default=0),
    Column("snapshot_id", String(64), nullable=False, default=""),
    Column("snapshot_position", BigInteger, nullable=False, default=0),
    Column("entries_received", BigInteger, nullable=False, default=0),
    Column("updated_at", Double, nullable=False, default=0.0),
    PrimaryKeyConstraint("source_id", "client_name"),
)

sink_lanes = Table(
    "lrq_sink_lanes",
    metadata,
    # Per (source, client) shipped over several lanes: every entry of lane ``lane`` of
    # ``lanes`` with a position up to ``last_position`` was applied. Rows at or below
    # the stream's ``lrq_sink_progress.last_position`` say nothing more and are deleted.
    Column("source_id", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("lanes", Integer, nullable=False),
    Column("lane", Integer, nullable=False),
    Column("last_position", BigInteger, nullable=False),
    PrimaryKeyConstraint("source_id", "client_name", "lanes", "lane"),
)

sink_drops = Table(
    "lrq_sink_drops",
    metadata,
    # The last drop notice a sink received per (source, client).
    Column("source_id", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("notice_id", String(64), nullable=False),
    Column("first_dropped_position", BigInteger, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("received_at", Double, nullable=False),
    PrimaryKeyConstraint("source_id", "client_name"),
)

subscriber_state = Table(
    "lrq_subscriber_state",
    metadata,
    Column("queue_id", Integer, primary_key=True, autoincrement=False),
    Column("snapshot_id", String(64), nullable=False, default=""),
    Column("in_snapshot", Boolean, nullable=False, default=False),
    Column("delivered", BigInteger, nullable=False, default=0),
    Column("lease_owner", String(128), nullable=False, default=""),
    Column("lease_expires", Double, nullable=False, default=0.0),
    # Every entry of the queue with seq <= delivered_seq was delivered (or passed).
    Column("delivered_seq", BigInteger, nullable=False, default=0, server_default="0"),
    # The partition count the queue is delivered with (0: not by partition). With
    # partitions, delivered_seq is the minimum over lrq_subscriber_partitions.
    Column("partitions", Integer, nullable=False, default=0, server_default="0"),
)

subscriber_partitions = Table(
    "lrq_subscriber_partitions",
    metadata,
    # Every keyed log entry of the queue in this partition with seq <= delivered_seq
    # was delivered (and every entry without a key below it).
    Column("queue_id", Integer, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("delivered_seq", BigInteger, nullable=False, default=0, server_default="0"),
    Column("delivered", BigInteger, nullable=False, default=0, server_default="0"),
    PrimaryKeyConstraint("queue_id", "partition"),
)

recv_state = Table(
    "lrq_recv_state",
    metadata,
    # PostgreSQL's receive queue partitions: where new rows go (one row, id 1).
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("cur_slot", SmallInteger, nullable=False),
    Column("rotated_at", Double, nullable=False),
    info={"only": "postgresql"},
)


__all__ = [
    "RECV_PARTITION_PREFIX",
    "queue_registry",
    "recv_entries",
    "recv_state",
    "sink_drops",
    "sink_lanes",
    "sink_progress",
    "subscriber_partitions",
    "subscriber_state",
]
