"""Retention's tables: drops, trim marks, stopped streams, flow control."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
)

from lr_client.store.schema.metadata import metadata

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

flow_control = Table(
    "lrq_flow_control",
    metadata,
    Column("client_name", String(63), primary_key=True),
    Column("backpressure", Boolean, nullable=False, default=False),
    Column("slow_destinations", Text, nullable=False, default=""),
    Column("updated_at", Double, nullable=False),
)


__all__ = ["drops", "flow_control", "stream_stops", "trim_marks"]
