"""Alembic migration scripts of the queue store (run by :mod:`lr_client.store.schema.lifecycle`)."""
