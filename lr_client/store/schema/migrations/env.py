"""Alembic environment: migrate the connection :mod:`lr_client.store.schema.lifecycle` passes in."""

from __future__ import annotations

from alembic import context

from lr_client.store.schema.tables import metadata

config = context.config
context.configure(
    connection=config.attributes["connection"],
    target_metadata=metadata,
    version_table=config.attributes["version_table"],
)
with context.begin_transaction():
    context.run_migrations()
