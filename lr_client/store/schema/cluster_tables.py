"""The cluster's tables: registered sites, the site's members, leases of units."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, Integer, String, Table

from lr_client.store.schema.metadata import metadata

sites = Table(
    "lrq_sites",
    metadata,
    Column("site_num", Integer, primary_key=True, autoincrement=True),
    Column("site_id", String(63), nullable=False, unique=True),
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


__all__ = ["members", "sites", "unit_leases"]
