"""Cascaded clients' tables: this node's role in each, the nodes below it (revision 0013)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Double, PrimaryKeyConstraint, String, Table

from lr_client.store.schema.metadata import metadata

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


__all__ = ["cascade", "cascade_children"]
