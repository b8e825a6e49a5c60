"""Prometheus metrics of an ``lr`` server (documented in docs/configuration.md); served by
:mod:`lr_server.ops.metrics_http`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ENTRIES_SHIPPED = Counter(
    "lr_entries_shipped", "Entries acknowledged by a destination", ["destination", "client"]
)
BYTES_SHIPPED = Counter(
    "lr_bytes_shipped", "Payload bytes acknowledged by a destination", ["destination", "client"]
)
BATCHES_ACKED = Counter("lr_batches_acked", "Batches acknowledged", ["destination"])
BATCH_LATENCY = Histogram(
    "lr_batch_latency_seconds",
    "Time from sending a batch to its acknowledgement",
    ["destination"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
STAGE_LATENCY = Histogram(
    "lr_stage_latency_seconds",
    "Time of a log batch's first entry in each stage before the sink's acknowledgement: "
    "queued (transmit to read), sent (read to send), stored (send to acknowledgement)",
    ["destination", "client", "stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INFLIGHT_BATCHES = Gauge("lr_inflight_batches", "Unacknowledged batches", ["destination"])
LAG_ENTRIES = Gauge("lr_lag_entries", "Unacknowledged entries", ["destination", "client"])
LAG_BYTES = Gauge("lr_lag_bytes", "Unacknowledged payload bytes", ["destination", "client"])
LAG_SECONDS = Gauge(
    "lr_lag_seconds", "Age of the oldest unacknowledged entry", ["destination", "client"]
)
ENTRIES_APPLIED = Counter(
    "lr_entries_applied", "Entries written to receive queues", ["source", "client"]
)
BYTES_APPLIED = Counter(
    "lr_bytes_applied", "Payload bytes written to receive queues", ["source", "client"]
)
SNAPSHOT_ROWS = Gauge(
    "lr_snapshot_rows", "Rows of the current snapshot shipped", ["destination", "client"]
)
SNAPSHOT_ACTIVE = Gauge(
    "lr_snapshot_active",
    "1 while a stream waits for or ships a full sync",
    ["destination", "client"],
)
UNCONFIGURED_ENTRIES = Gauge(
    "lr_unconfigured_entries",
    "Entries queued for a destination and client the config does not list",
    ["destination", "client"],
)
DROPS = Counter("lr_drops", "Destinations dropped to a full sync", ["destination", "client"])
STREAM_STOPPED = Gauge(
    "lr_stream_stopped",
    "1 while a stream is stopped: the sink lacks entries the source no longer holds",
    ["destination", "client"],
)
BACKPRESSURE = Gauge("lr_backpressure", "1 while backpressure is on for a client", ["client"])
BACKPRESSURE_EVENTS = Counter(
    "lr_backpressure_events", "Times retention turned backpressure on for a client"
)
ERRORS = Counter("lr_errors", "Errors by kind", ["kind"])
TRIMMED = Counter("lr_trimmed_entries", "Send-queue entries trimmed")
RECV_ROTATIONS = Counter(
    "lr_receive_queue_rotations", "Receive-queue partitions of delivered entries truncated"
)
RECEIVER_OPEN_CALLS = Gauge("lr_receiver_open_calls", "Authenticated calls open at the receiver")
RECEIVER_CALLS_REFUSED = Counter(
    "lr_receiver_calls_refused", "Receiver calls refused or ended by its limits", ["reason"]
)
MEMBER_UNITS = Gauge("lr_member_units", "Units of work this member owns", ["member"])
MEMBER_HEARTBEATS = Counter("lr_member_heartbeats", "Heartbeats this member recorded", ["member"])
PLACEMENT_CHANGES = Counter(
    "lr_placement_changes", "Units this member acquired or released", ["member", "change"]
)
CASCADE_WATERMARK = Gauge(
    "lr_cascade_watermark",
    "A cascaded client's watermark at this node: local (this node and below) or global",
    ["client", "kind"],
)
RELAY_LAG = Histogram(
    "lr_relay_lag_seconds",
    "Time from the origin's transmit of a cascaded entry to its apply at this node",
    ["client", "origin"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

RELAY_BATCHES = Counter(
    "lr_relay_batches",
    "Log batches a branch relayed to a node below: forwarded as received (before it "
    "stored them) or read from its receive queue",
    ["destination", "client", "way"],
)
ENTRIES_REPLAYED = Counter(
    "lr_entries_replayed",
    "Entries queued again at a sink on a source's replay (lr replay)",
    ["source", "client"],
)
REPLAYS_SHIPPED = Counter(
    "lr_replay_entries_shipped",
    "Entries shipped again on a replay and acknowledged",
    ["destination", "client"],
)
ENTRY_TOO_LARGE = Gauge(
    "lr_entry_too_large",
    "1 while a stream is stopped at an entry larger than its destination accepts",
    ["destination", "client"],
)
RECEIVE_QUEUE_FULL = Gauge(
    "lr_receive_queue_full",
    "1 while a sink refuses a client's log batches: its receive queue is at its limits",
    ["source", "client"],
)


__all__ = [
    "BACKPRESSURE",
    "BACKPRESSURE_EVENTS",
    "BATCHES_ACKED",
    "BATCH_LATENCY",
    "BYTES_APPLIED",
    "BYTES_SHIPPED",
    "CASCADE_WATERMARK",
    "DROPS",
    "ENTRIES_APPLIED",
    "ENTRIES_REPLAYED",
    "ENTRIES_SHIPPED",
    "ENTRY_TOO_LARGE",
    "ERRORS",
    "INFLIGHT_BATCHES",
    "LAG_BYTES",
    "LAG_ENTRIES",
    "LAG_SECONDS",
    "MEMBER_HEARTBEATS",
    "MEMBER_UNITS",
    "PLACEMENT_CHANGES",
    "RECEIVER_CALLS_REFUSED",
    "RECEIVER_OPEN_CALLS",
    "RECEIVE_QUEUE_FULL",
    "RELAY_BATCHES",
    "RELAY_LAG",
    "REPLAYS_SHIPPED",
    "SNAPSHOT_ACTIVE",
    "SNAPSHOT_ROWS",
    "STAGE_LATENCY",
    "STREAM_STOPPED",
    "TRIMMED",
    "UNCONFIGURED_ENTRIES",
]
