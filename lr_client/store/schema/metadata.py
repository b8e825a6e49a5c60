"""The one ``MetaData`` every table of the store is on, and the schema's own table.

Each role family declares its tables on :data:`metadata` in a module of its
own (``send_tables``, ``snapshot_tables``, ``retention_tables``,
``recv_tables``, ``cluster_tables``, ``cascade_tables``);
:mod:`~lr_client.store.schema.tables` gathers them.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, Text

#: The current schema revision (``lr_client/store/schema/migrations``), as a number.
SCHEMA_VERSION = 20

metadata = MetaData()

#: BIGINT on PostgreSQL; INTEGER on SQLite so the column is the rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")

meta = Table(
    "lrq_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


__all__ = ["SCHEMA_VERSION", "BigId", "meta", "metadata"]
