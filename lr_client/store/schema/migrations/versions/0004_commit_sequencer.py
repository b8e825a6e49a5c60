"""PostgreSQL: positions are assigned after commit, in commit order, by the sequencer.

Revision ID: 0004
Revises: 0003

Until now a transmitting transaction held one advisory lock from its first
transmit to its COMMIT, so transmitters ran one at a time. From this
revision a transaction only writes its entries, each named by its
transaction id and its ordinal in the transaction (``lrq_send_entries``),
and a commit stamp written at COMMIT by a deferred trigger
(``lrq_send_commits``). The sequencer (:mod:`lr_client.store.send.sequencer`)
gives committed transactions their positions, in commit order
(``lrq_send_positions``, ``lrq_send_blocks``, ``lrq_send_ticks``).
``lrq_send_log_entries`` becomes a view with the old columns, so every
reader keeps its query.

The upgrade keeps every stored entry at its position: the old table becomes
``lrq_send_entries`` in place (``position`` renamed ``ord``, transaction id
0, which no transaction has), each entry gets a positions row with its old
position, and the first tick starts at the old sequence's last value. It
first takes the old table's exclusive lock, so it waits for transmitters of
the previous release; a transmitter of the previous release that runs after
it fails (its table is now a view), it never writes out of order.
SQLite is unchanged: its writers are serialised, positions stay rowids.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_STATEMENTS = (
    "LOCK TABLE lrq_send_log_entries IN ACCESS EXCLUSIVE MODE",
    # The old table becomes the entries table, in place.
    "ALTER TABLE lrq_send_log_entries RENAME TO lrq_send_entries",
    "ALTER TABLE lrq_send_entries RENAME COLUMN position TO ord",
    "ALTER TABLE lrq_send_entries ALTER COLUMN ord DROP DEFAULT",
    "CREATE TEMPORARY TABLE lrq_head_0004 ON COMMIT DROP AS "
    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS head "
    "FROM lrq_send_log_entries_position_seq",
    "DROP SEQUENCE lrq_send_log_entries_position_seq",
    "ALTER TABLE lrq_send_entries ADD COLUMN txid xid8 NOT NULL DEFAULT '0'",
    "ALTER TABLE lrq_send_entries ALTER COLUMN txid SET DEFAULT pg_current_xact_id()",
    "ALTER TABLE lrq_send_entries DROP CONSTRAINT lrq_send_log_entries_pkey",
    "DROP INDEX lrq_send_log_entries_client",
    "DROP INDEX lrq_send_log_entries_dests",
    "ALTER TABLE lrq_send_entries ADD CONSTRAINT lrq_send_entries_pkey PRIMARY KEY (txid, ord)",
    # An entry's ordinal in its transaction: a transaction-local counter
    # (set_config(..., true) is rolled back with a savepoint, so ordinals stay
    # dense), one per queue table so two schemas in one transaction keep apart.
    """
    CREATE FUNCTION lrq_next_ord(queue regclass) RETURNS bigint
    LANGUAGE sql VOLATILE AS $$
      SELECT set_config('lrq.ord_' || queue::oid,
        (coalesce(nullif(current_setting('lrq.ord_' || queue::oid, true), ''), '0')::bigint
         + 1)::text, true)::bigint
    $$
    """,
    "ALTER TABLE lrq_send_entries ALTER COLUMN ord "
    "SET DEFAULT lrq_next_ord('lrq_send_entries'::regclass)",
    # The commit stamp: one row per transmitting transaction, written at COMMIT.
    "CREATE SEQUENCE lrq_commit_seq CACHE 1",
    "CREATE TABLE lrq_send_commits (txid xid8 PRIMARY KEY, commit_seq bigint NOT NULL)",
    # Names qualified with this schema when the function is created, so a
    # caller's search_path at COMMIT does not matter (a SET clause on the
    # function would, but costs a configuration save and restore per call).
    """
    DO $do$ BEGIN EXECUTE format($f$
      CREATE FUNCTION %1$I.lrq_stamp() RETURNS trigger LANGUAGE plpgsql AS $b$
      BEGIN
        INSERT INTO %1$I.lrq_send_commits (txid, commit_seq)
        VALUES (NEW.txid, nextval(%2$L));
        RETURN NULL;
      END
      $b$ $f$, current_schema(), format('%I.lrq_commit_seq', current_schema()));
    END $do$
    """,
    "CREATE CONSTRAINT TRIGGER lrq_stamp AFTER INSERT ON lrq_send_entries "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.ord = 1) "
    "EXECUTE FUNCTION lrq_stamp()",
    # What the sequencer writes.
    """
    CREATE TABLE lrq_send_positions (
      position bigint PRIMARY KEY,
      txid xid8 NOT NULL,
      ord bigint NOT NULL,
      client_name varchar(63) NOT NULL,
      dest_nums smallint[] NOT NULL,
      created_at double precision NOT NULL
    )
    """,
    "CREATE INDEX lrq_send_positions_client ON lrq_send_positions (client_name, position)",
    "CREATE INDEX lrq_send_positions_dests ON lrq_send_positions USING gin (dest_nums)",
    """
    CREATE TABLE lrq_send_blocks (
      txid xid8 PRIMARY KEY,
      base bigint NOT NULL,
      size bigint NOT NULL,
      tick_id bigint NOT NULL
    )
    """,
    """
    CREATE TABLE lrq_send_ticks (
      tick_id bigint PRIMARY KEY,
      snap pg_snapshot NOT NULL,
      head bigint NOT NULL,
      ticked_at double precision NOT NULL
    )
    """,
    # The stored entries keep their positions; the first tick starts above them.
    "INSERT INTO lrq_send_positions (position, txid, ord, client_name, dest_nums, created_at) "
    "SELECT ord, txid, ord, client_name, dest_nums, created_at FROM lrq_send_entries",
    "INSERT INTO lrq_send_ticks (tick_id, snap, head, ticked_at) "
    "SELECT 1, pg_current_snapshot(), head, extract(epoch FROM clock_timestamp()) "
    "FROM lrq_head_0004",
    # Readers keep the old shape. A LEFT JOIN on the entries' key lets the
    # planner skip the entries when a query reads no payload.
    """
    CREATE VIEW lrq_send_log_entries AS
    SELECT p.position, p.client_name, e.payload, p.dest_nums, p.created_at
    FROM lrq_send_positions p
    LEFT JOIN lrq_send_entries e ON e.txid = p.txid AND e.ord = p.ord
    """,
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in _STATEMENTS:
        op.execute(statement)
