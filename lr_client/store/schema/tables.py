"""The database schema, defined once: every table on one ``metadata``.

Table names are fixed; every name that comes from input (site ids, client
names, snapshot ids) is a column value bound as a parameter, never SQL text.

The tables are declared by role family, each in a module of its own:
:mod:`~lr_client.store.schema.send_tables` (the send log, cursors),
:mod:`~lr_client.store.schema.snapshot_tables` (snapshots and their entries),
:mod:`~lr_client.store.schema.retention_tables` (drops, trim marks, stops),
:mod:`~lr_client.store.schema.recv_tables` (receive queues, delivery),
:mod:`~lr_client.store.schema.cluster_tables` (sites, members, leases),
:mod:`~lr_client.store.schema.cascade_tables` (cascaded clients); each module's
docstring describes its queue's layout. This module gathers them all, so that
``from lr_client.store.schema import tables as s`` and ``s.<table>`` name any.
"""

from __future__ import annotations

from lr_client.store.schema.cascade_tables import cascade, cascade_children
from lr_client.store.schema.cluster_tables import members, sites, unit_leases
from lr_client.store.schema.metadata import SCHEMA_VERSION, meta, metadata
from lr_client.store.schema.recv_tables import (
    RECV_PARTITION_PREFIX,
    queue_registry,
    recv_entries,
    recv_state,
    sink_drops,
    sink_lanes,
    sink_progress,
    subscriber_partitions,
    subscriber_state,
)
from lr_client.store.schema.retention_tables import drops, flow_control, stream_stops, trim_marks
from lr_client.store.schema.send_tables import (
    SEQUENCER_TABLES,
    SLOT_TABLES,
    cursors,
    made_in_sql,
    send_log_entries,
    session_status,
    slot_parent,
)
from lr_client.store.schema.snapshot_tables import (
    SNAPSYNC_PARTITION_PREFIX,
    send_snapsync,
    send_snapsync_slotted,
    snapshot_destinations,
    snapshots,
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
