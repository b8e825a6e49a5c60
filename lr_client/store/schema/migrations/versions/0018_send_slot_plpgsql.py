"""PostgreSQL: a transaction's send slot found by a PL/pgSQL function, its plan kept.

Revision ID: 0018
Revises: 0017

``lrq_send_slot`` (revision 0006), the default of ``lrq_send_entries.slot``, was a
SQL function. One that reads a table (the current slot in ``lrq_send_state``) is
not inlined into the calling statement, and PostgreSQL plans such a function's
body again at each execution of its caller: every transmit paid a planning. A
PL/pgSQL function keeps its plan for the session. Same result, same
transaction-local setting (a transaction's entries share one slot, a rolled
back savepoint forgets it); no row is rewritten. SQLite is unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_PLPGSQL = """
DO $do$ BEGIN EXECUTE format($f$
  CREATE OR REPLACE FUNCTION %1$I.lrq_send_slot(queue regclass) RETURNS smallint
  LANGUAGE plpgsql VOLATILE AS $b$
  DECLARE
    found text := current_setting('lrq.slot_' || queue::oid, true);
  BEGIN
    IF found <> '' THEN
      RETURN found::smallint;
    END IF;
    RETURN set_config('lrq.slot_' || queue::oid,
                      (SELECT cur_slot FROM %1$I.lrq_send_state)::text, true)::smallint;
  END
  $b$ $f$, current_schema());
END $do$
"""

_SQL = """
DO $do$ BEGIN EXECUTE format($f$
  CREATE OR REPLACE FUNCTION %1$I.lrq_send_slot(queue regclass) RETURNS smallint
  LANGUAGE sql VOLATILE AS $b$
    SELECT coalesce(
      nullif(current_setting('lrq.slot_' || queue::oid, true), '')::smallint,
      set_config('lrq.slot_' || queue::oid,
                 (SELECT cur_slot FROM %1$I.lrq_send_state)::text, true)::smallint)
  $b$ $f$, current_schema());
END $do$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PLPGSQL)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_SQL)
