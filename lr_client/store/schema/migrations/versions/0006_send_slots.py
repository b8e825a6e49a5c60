"""PostgreSQL: the send queue lives in slots, retired whole by TRUNCATE.

Revision ID: 0006
Revises: 0005

Until now trim deleted the send queue's rows one by one, each a dead tuple
until vacuum reclaims it (never, while a long transaction pins the vacuum
horizon). From this revision every table of the send queue
(``lrq_send_entries``, ``lrq_send_commits``, ``lrq_send_positions``,
``lrq_send_blocks``, ``lrq_send_ticks``) is partitioned by ``slot``, a small
ring (``_s0`` .. ``_s3``, more added when every other slot is pinned). A
transaction writes its entries into the current slot (``lrq_send_state``),
read once per transaction; the sequencer writes positions and blocks into
their entries' slot. Trim closes the current slot once it is old enough and
TRUNCATEs every other slot whose entries each destination has acknowledged
(:mod:`lr_client.store.retention.slots`).

The upgrade keeps every stored row: it takes the old tables' exclusive locks
(so it waits for transmitters of the previous release), renames them, creates
the partitioned tables and moves the rows into slot 0, then drops the old
tables. The commit stamp trigger is created after the move, so the moved
entries queue no new stamps. SQLite is unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TABLES = (
    "lrq_send_entries",
    "lrq_send_commits",
    "lrq_send_positions",
    "lrq_send_blocks",
    "lrq_send_ticks",
)
_INDEXES = (
    "lrq_send_entries_pkey",
    "lrq_send_commits_pkey",
    "lrq_send_positions_pkey",
    "lrq_send_positions_client",
    "lrq_send_positions_dests",
    "lrq_send_blocks_pkey",
    "lrq_send_ticks_pkey",
)

_STATEMENTS = (
    "LOCK TABLE " + ", ".join(_TABLES) + " IN ACCESS EXCLUSIVE MODE",
    "DROP VIEW lrq_send_log_entries",
    *(f"ALTER TABLE {t} RENAME TO {t}_0005" for t in _TABLES),
    *(f"ALTER INDEX {i} RENAME TO {i}_0005" for i in _INDEXES),
    # Where transactions write: one row, updated once per rotation.
    """
    CREATE TABLE lrq_send_state (
      id smallint PRIMARY KEY CHECK (id = 1),
      cur_slot smallint NOT NULL,
      rotated_at double precision NOT NULL
    )
    """,
    "INSERT INTO lrq_send_state VALUES (1, 0, extract(epoch FROM clock_timestamp()))",
    # Every slot, and when it was last closed (0: never): a closed slot is
    # retired no sooner than one rotation period after.
    "CREATE TABLE lrq_send_slots ("
    "slot smallint PRIMARY KEY, closed_at double precision NOT NULL DEFAULT 0)",
    # A transaction's slot: the current slot when it first writes, kept in a
    # transaction-local setting (rolled back with a savepoint, like the
    # ordinal), so all of a transaction's entries share one slot.
    """
    DO $do$ BEGIN EXECUTE format($f$
      CREATE FUNCTION %1$I.lrq_send_slot(queue regclass) RETURNS smallint
      LANGUAGE sql VOLATILE AS $b$
        SELECT coalesce(
          nullif(current_setting('lrq.slot_' || queue::oid, true), '')::smallint,
          set_config('lrq.slot_' || queue::oid,
                     (SELECT cur_slot FROM %1$I.lrq_send_state)::text, true)::smallint)
      $b$ $f$, current_schema());
    END $do$
    """,
    """
    CREATE TABLE lrq_send_entries (
      slot smallint NOT NULL,
      txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
      ord bigint NOT NULL,
      client_name varchar(63) NOT NULL,
      payload bytea NOT NULL,
      dest_nums smallint[] NOT NULL,
      created_at double precision NOT NULL,
      CONSTRAINT lrq_send_entries_pkey PRIMARY KEY (txid, ord, slot)
    ) PARTITION BY LIST (slot)
    """,
    "ALTER TABLE lrq_send_entries ALTER COLUMN ord "
    "SET DEFAULT lrq_next_ord('lrq_send_entries'::regclass)",
    "ALTER TABLE lrq_send_entries ALTER COLUMN slot "
    "SET DEFAULT lrq_send_slot('lrq_send_entries'::regclass)",
    """
    CREATE TABLE lrq_send_commits (
      slot smallint NOT NULL,
      txid xid8 NOT NULL,
      commit_seq bigint NOT NULL,
      CONSTRAINT lrq_send_commits_pkey PRIMARY KEY (txid, slot)
    ) PARTITION BY LIST (slot)
    """,
    """
    CREATE TABLE lrq_send_positions (
      slot smallint NOT NULL,
      position bigint NOT NULL,
      txid xid8 NOT NULL,
      ord bigint NOT NULL,
      client_name varchar(63) NOT NULL,
      dest_nums smallint[] NOT NULL,
      created_at double precision NOT NULL,
      CONSTRAINT lrq_send_positions_pkey PRIMARY KEY (position, slot)
    ) PARTITION BY LIST (slot)
    """,
    "CREATE INDEX lrq_send_positions_client ON lrq_send_positions (client_name, position)",
    "CREATE INDEX lrq_send_positions_dests ON lrq_send_positions USING gin (dest_nums)",
    """
    CREATE TABLE lrq_send_blocks (
      slot smallint NOT NULL,
      txid xid8 NOT NULL,
      base bigint NOT NULL,
      size bigint NOT NULL,
      tick_id bigint NOT NULL,
      CONSTRAINT lrq_send_blocks_pkey PRIMARY KEY (txid, slot)
    ) PARTITION BY LIST (slot)
    """,
    """
    CREATE TABLE lrq_send_ticks (
      slot smallint NOT NULL,
      tick_id bigint NOT NULL,
      snap pg_snapshot NOT NULL,
      head bigint NOT NULL,
      ticked_at double precision NOT NULL,
      CONSTRAINT lrq_send_ticks_pkey PRIMARY KEY (tick_id, slot)
    ) PARTITION BY LIST (slot)
    """,
    # One slot is one partition of each table, its name made from its number
    # here, in the database. Attached (not created as a partition), so adding
    # a slot takes no lock that waits for open transmitting transactions.
    """
    DO $do$ BEGIN EXECUTE format($f$
      CREATE FUNCTION %1$I.lrq_add_send_slot(n smallint) RETURNS void
      LANGUAGE plpgsql AS $b$
      DECLARE t text;
      BEGIN
        FOREACH t IN ARRAY ARRAY['lrq_send_entries', 'lrq_send_commits', 'lrq_send_positions',
                                 'lrq_send_blocks', 'lrq_send_ticks'] LOOP
          EXECUTE format('CREATE TABLE %%1$I.%%2$I (LIKE %%1$I.%%3$I INCLUDING DEFAULTS)',
                         %2$L, t || '_s' || n, t);
          EXECUTE format('ALTER TABLE %%1$I.%%2$I ATTACH PARTITION %%1$I.%%3$I '
                         'FOR VALUES IN (%%4$s)', %2$L, t, t || '_s' || n, n);
        END LOOP;
        INSERT INTO %1$I.lrq_send_slots (slot) VALUES (n);
      END
      $b$ $f$, current_schema(), current_schema());
    END $do$
    """,
    # Lock a slot's partitions for its retirement, or say it is in use: never
    # wait more than a moment, so readers and writers are not held up.
    """
    DO $do$ BEGIN EXECUTE format($f$
      CREATE FUNCTION %1$I.lrq_lock_send_slot(n smallint) RETURNS boolean
      LANGUAGE plpgsql SET lock_timeout = '20ms' AS $b$
      BEGIN
        EXECUTE format('LOCK TABLE %%1$I.%%2$I, %%1$I.%%3$I, %%1$I.%%4$I, %%1$I.%%5$I, %%1$I.%%6$I '
                       'IN ACCESS EXCLUSIVE MODE',
                       %2$L, 'lrq_send_entries_s' || n, 'lrq_send_commits_s' || n,
                       'lrq_send_positions_s' || n, 'lrq_send_blocks_s' || n,
                       'lrq_send_ticks_s' || n);
        RETURN true;
      EXCEPTION WHEN lock_not_available THEN
        RETURN false;
      END
      $b$ $f$, current_schema(), current_schema());
    END $do$
    """,
    """
    DO $do$ BEGIN EXECUTE format($f$
      CREATE FUNCTION %1$I.lrq_truncate_send_slot(n smallint) RETURNS void
      LANGUAGE plpgsql AS $b$
      BEGIN
        EXECUTE format('TRUNCATE %%1$I.%%2$I, %%1$I.%%3$I, %%1$I.%%4$I, %%1$I.%%5$I, %%1$I.%%6$I',
                       %2$L, 'lrq_send_entries_s' || n, 'lrq_send_commits_s' || n,
                       'lrq_send_positions_s' || n, 'lrq_send_blocks_s' || n,
                       'lrq_send_ticks_s' || n);
      END
      $b$ $f$, current_schema(), current_schema());
    END $do$
    """,
    "SELECT lrq_add_send_slot(CAST(n AS smallint)) FROM generate_series(0, 3) AS n",
    # The stored rows move to slot 0, before the stamp trigger exists.
    "INSERT INTO lrq_send_entries (slot, txid, ord, client_name, payload, dest_nums, created_at) "
    "SELECT 0, txid, ord, client_name, payload, dest_nums, created_at FROM lrq_send_entries_0005",
    "INSERT INTO lrq_send_commits (slot, txid, commit_seq) "
    "SELECT 0, txid, commit_seq FROM lrq_send_commits_0005",
    "INSERT INTO lrq_send_positions "
    "(slot, position, txid, ord, client_name, dest_nums, created_at) "
    "SELECT 0, position, txid, ord, client_name, dest_nums, created_at "
    "FROM lrq_send_positions_0005",
    "INSERT INTO lrq_send_blocks (slot, txid, base, size, tick_id) "
    "SELECT 0, txid, base, size, tick_id FROM lrq_send_blocks_0005",
    "INSERT INTO lrq_send_ticks (slot, tick_id, snap, head, ticked_at) "
    "SELECT 0, tick_id, snap, head, ticked_at FROM lrq_send_ticks_0005",
    *(f"DROP TABLE {t}_0005" for t in _TABLES),
    # The stamp now names its slot.
    """
    DO $do$ BEGIN EXECUTE format($f$
      CREATE OR REPLACE FUNCTION %1$I.lrq_stamp() RETURNS trigger LANGUAGE plpgsql AS $b$
      BEGIN
        INSERT INTO %1$I.lrq_send_commits (slot, txid, commit_seq)
        VALUES (NEW.slot, NEW.txid, nextval(%2$L));
        RETURN NULL;
      END
      $b$ $f$, current_schema(), format('%I.lrq_commit_seq', current_schema()));
    END $do$
    """,
    "CREATE CONSTRAINT TRIGGER lrq_stamp AFTER INSERT ON lrq_send_entries "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.ord = 1) "
    "EXECUTE FUNCTION lrq_stamp()",
    """
    CREATE VIEW lrq_send_log_entries AS
    SELECT p.position, p.client_name, e.payload, p.dest_nums, p.created_at
    FROM lrq_send_positions p
    LEFT JOIN lrq_send_entries e ON e.txid = p.txid AND e.ord = p.ord AND e.slot = p.slot
    """,
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in _STATEMENTS:
        op.execute(statement)
