"""The database schema, defined once.

Table names are fixed; every name that comes from input (site ids, client
names, snapshot ids) is a column value bound as a parameter, never SQL text.

Queue layout:

* ``lrq_send_log_entries`` is ``LRQ_Send_LogEntries``: one row per transmitted
  payload, whatever the number of destinations (I4). Its destinations are kept
  as small site numbers; the stream tags ``lrq_logentry_<dest>`` are read
  from them: through a GIN index over ``dest_nums`` on PostgreSQL (a few bytes
  per tag), and on SQLite by walking the ``(client_name, position)`` index
  (``dest_nums`` is the text ``",1,5,"`` there). On PostgreSQL it is a view
  of the same columns: entries are written to ``lrq_send_entries`` keyed by
  transaction and ordinal, and the sequencer writes their positions
  (``lrq_send_positions``, with the GIN index) after commit
  (:mod:`lr_client.store.sequencer`, revision 0004).
* ``lrq_send_snapsync`` is ``LRQ_Send_SnapSync``: snapshot entries, keyed by
  ``(snapshot_id, part, seq)`` so a retried writer never duplicates. On
  PostgreSQL it is partitioned by the slot of the entry's snapshot
  (``lrq_snapshots.snap_slot``), so a finished snapshot's entries go by
  TRUNCATE (:mod:`lr_client.store.snapshot_pool`, revision 0007).
* ``lrq_recv_entries`` holds every ``LRQ_Recv_<client>__<source>`` queue,
  each a ``queue_id`` of ``lrq_queue_registry``. Delivery deletes nothing:
  ``lrq_subscriber_state.delivered_seq`` says how far each queue was
  delivered. On PostgreSQL the table is ``PARTITION BY LIST (slot)`` with a
  ring of partitions ``lrq_recv_entries_s<N>``, created in SQL by revision
  0008 (a partitioned table's key must include ``slot``, which SQLite's
  rowid ``seq`` cannot), and retired a partition at a time by TRUNCATE
  (:mod:`lr_client.store.recv_rotation`); ``lrq_recv_state`` says which
  partition new rows go to.
"""

from __future__ import annotations

import re

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    column,
    table,
)
from sqlalchemy.dialects import postgresql

from lr_client.records import ReplicationType

#: The current schema revision (``lr_client/store/migrations``), as a number.
SCHEMA_VERSION = 17

metadata = MetaData()

# BIGINT on PostgreSQL; INTEGER on SQLite so the column is the rowid alias.
_BigId = BigInteger().with_variant(Integer(), "sqlite")

meta = Table(
    "lrq_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

sites = Table(
    "lrq_sites",
    metadata,
    Column("site_num", Integer, primary_key=True, autoincrement=True),
    Column("site_id", String(63), nullable=False, unique=True),
)

send_log_entries = Table(
    "lrq_send_log_entries",
    metadata,
    Column("position", _BigId, primary_key=True, autoincrement=True),
    Column("client_name", String(63), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    # PostgreSQL: smallint[] with a GIN index; SQLite: the text ",1,5,".
    Column(
        "dest_nums",
        Text().with_variant(postgresql.ARRAY(SmallInteger), "postgresql"),
        nullable=False,
    ),
    Column("created_at", Double, nullable=False),
    # The partition key (NULL: none; lr_client.partitioned) and headers (lr_client.headers).
    Column("partition_key", LargeBinary),
    Column("headers", LargeBinary),
    sqlite_autoincrement=True,
    # PostgreSQL: a view of the sequencer's tables with these columns.
    info={"view_on": "postgresql"},
)
#: PostgreSQL's send queue behind that view, created by revision 0004 in SQL
#: (their ``xid8`` and ``pg_snapshot`` columns have no SQLAlchemy type);
#: :mod:`lr_client.store.sequencer` reads and writes them.
SEQUENCER_TABLES = (
    "lrq_send_entries",
    "lrq_send_commits",
    "lrq_send_positions",
    "lrq_send_blocks",
    "lrq_send_ticks",
)
#: Revision 0006 puts each of them in slots (one partition per slot,
#: ``<table>_s<n>``), listed in ``lrq_send_slots``, the current one in
#: ``lrq_send_state`` (:mod:`lr_client.store.slots`).
SLOT_TABLES = ("lrq_send_state", "lrq_send_slots")
_SLOT_PARTITION = re.compile("(" + "|".join(SEQUENCER_TABLES) + r")_s\d+")


def slot_parent(name: str) -> str | None:
    """The send queue table a slot's partition belongs to (None: not such a partition)."""
    found = _SLOT_PARTITION.fullmatch(name)
    return found.group(1) if found else None


def made_in_sql(name: str) -> bool:
    """Whether a PostgreSQL table is made by a revision's SQL rather than declared here."""
    return (
        name in SEQUENCER_TABLES
        or name in SLOT_TABLES
        or _SLOT_PARTITION.fullmatch(name) is not None
    )


Index("lrq_send_log_entries_client", send_log_entries.c.client_name, send_log_entries.c.position)
Index(
    "lrq_send_log_entries_dests",
    send_log_entries.c.dest_nums,
    postgresql_using="gin",
    info={"only": "postgresql"},
).ddl_if(dialect="postgresql")

send_snapsync = Table(
    "lrq_send_snapsync",
    metadata,
    Column("position", _BigId, primary_key=True, autoincrement=True),
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

cursors = Table(
    "lrq_cursors",
    metadata,
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("position", BigInteger, nullable=False, default=0),
    Column("acked_at", Double, nullable=False, default=0.0),
    Column("needs_snapshot", Boolean, nullable=False, default=False),
    PrimaryKeyConstraint("destination", "client_name"),
)

drops = Table(
    "lrq_drops",
    metadata,
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("first_dropped_position", BigInteger, nullable=False),
    Column("dropped_at", Double, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    PrimaryKeyConstraint("destination", "client_name"),
)

trim_marks = Table(
    "lrq_trim_marks",
    metadata,
    # Per (destination number, client): the highest position trim ever deleted
    # among the entries tagged for that destination. Every entry of the stream
    # above it is still stored.
    Column("dest_num", SmallInteger, nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("trimmed_through", BigInteger, nullable=False),
    PrimaryKeyConstraint("dest_num", "client_name"),
)

stream_stops = Table(
    "lrq_stream_stops",
    metadata,
    # A stream stopped because the sink lacks entries the source no longer holds
    # (and the client has no snapshot provider), until an operator accepts the
    # loss; then the record of that acceptance.
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("reason", Text, nullable=False),
    Column("resume_after", BigInteger, nullable=False),
    Column("stopped_at", Double, nullable=False),
    Column("accepted_at", Double),
    # The stream's trim mark when the loss was accepted: the loss covers
    # (resume_after, accepted_through]; a later one stops the stream again.
    Column("accepted_through", BigInteger),
    Column("resumed_at", Double),  # the sink was told; the row stays as the record
    PrimaryKeyConstraint("destination", "client_name"),
)

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
    Column("seq", _BigId, primary_key=True, autoincrement=True),
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

flow_control = Table(
    "lrq_flow_control",
    metadata,
    Column("client_name", String(63), primary_key=True),
    Column("backpressure", Boolean, nullable=False, default=False),
    Column("slow_destinations", Text, nullable=False, default=""),
    Column("updated_at", Double, nullable=False),
)

session_status = Table(
    "lrq_session_status",
    metadata,
    Column("destination", String(63), primary_key=True),
    Column("state", String(32), nullable=False),
    Column("connected", Boolean, nullable=False, default=False),
    Column("inflight_batches", Integer, nullable=False, default=0),
    Column("inflight_bytes", BigInteger, nullable=False, default=0),
    Column("last_error", Text, nullable=False, default=""),
    Column("updated_at", Double, nullable=False),
)

members = Table(
    "lrq_members",
    metadata,
    Column("member_id", String(128), primary_key=True),
    # One process run of the member: a restart takes the row over with a new one.
    Column("instance", String(64), nullable=False),
    Column("address", String(255), nullable=False, default=""),
    Column("weight", Integer, nullable=False, default=1),
    Column("joined_at", Double, nullable=False),
    # Database clock (seconds since the epoch) of the member's last heartbeat.
    Column("heartbeat_at", Double, nullable=False),
)

unit_leases = Table(
    "lrq_unit_leases",
    metadata,
    Column("unit", String(200), primary_key=True),
    # The owning instance (lrq_members.instance); NULL: released.
    Column("owner", String(64)),
    Column("member_id", String(128), nullable=False, default=""),
    # The fencing token: raised at every change of owner, never lowered.
    Column("token", BigInteger, nullable=False, default=0),
    Column("acquired_at", Double, nullable=False, default=0.0),
)

cascade = Table(
    "lrq_cascade",
    metadata,
    # One row per cascaded client at this node (revision 0013, docs/cascading.md).
    Column("client_name", String(63), primary_key=True),
    Column("origin_id", String(63), nullable=False),  # the root of the set
    Column("role", String(16), nullable=False),  # a CascadeRole value: root, branch, leaf
    Column("provider_id", String(63), nullable=False, default=""),
    # Raised by every provider switch; a provider refuses relays of an older epoch's node.
    Column("epoch", BigInteger, nullable=False, default=0),
    # The provider the configuration named when it was last applied.
    Column("config_provider", String(63), nullable=False, default=""),
    Column("global_watermark", BigInteger, nullable=False, default=0),
    Column("updated_at", Double, nullable=False),
)

cascade_children = Table(
    "lrq_cascade_children",
    metadata,
    # The nodes below this one for a cascaded client, as they reported themselves.
    Column("client_name", String(63), nullable=False),
    Column("child_id", String(63), nullable=False),
    Column("epoch", BigInteger, nullable=False, default=0),
    Column("local_watermark", BigInteger, nullable=False, default=0),
    Column("acked_position", BigInteger, nullable=False, default=0),
    Column("reported_at", Double, nullable=False, default=0.0),
    Column("dropped", Boolean, nullable=False, default=False),
    PrimaryKeyConstraint("client_name", "child_id"),
)

__all__ = [
    "RECV_PARTITION_PREFIX",
    "SCHEMA_VERSION",
    "SEQUENCER_TABLES",
    "SLOT_TABLES",
    "SNAPSYNC_PARTITION_PREFIX",
    "cascade",
    "cascade_children",
    "cursors",
    "drops",
    "flow_control",
    "made_in_sql",
    "members",
    "meta",
    "metadata",
    "queue_registry",
    "recv_entries",
    "recv_state",
    "send_log_entries",
    "send_snapsync",
    "send_snapsync_slotted",
    "session_status",
    "sink_drops",
    "sink_lanes",
    "sink_progress",
    "sites",
    "slot_parent",
    "snapshot_destinations",
    "snapshots",
    "stream_stops",
    "subscriber_partitions",
    "subscriber_state",
    "trim_marks",
    "unit_leases",
]
