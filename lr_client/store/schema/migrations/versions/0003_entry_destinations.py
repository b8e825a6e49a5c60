"""SQLite: an entry's destinations are read from the entry; the per-destination tag table goes.

Revision ID: 0003
Revises: 0002

Each SQLite entry already carries its destinations (``dest_nums``, ``",1,5,"``);
the tag rows were an index of the same fact, one row per destination per entry.
Reads now walk ``(client_name, position)`` and trim judges each entry by its
``dest_nums`` against the acknowledgements. Tag rows a drop had released early
are not needed: trim counts a dropped stream as acknowledged through its open
snapshot's base (or everything), as it did when releasing them.
PostgreSQL is unchanged (its tags are a GIN index over the same column).
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_table("lrq_send_tags")
