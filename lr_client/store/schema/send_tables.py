"""The send queue's tables: the send log, each destination's cursor, the sessions' status.

``lrq_send_log_entries`` is ``LRQ_Send_LogEntries``: one row per transmitted
payload, whatever the number of destinations (I4). Its destinations are kept
as small site numbers; the stream tags ``lrq_logentry_<dest>`` are read
from them: through a GIN index over ``dest_nums`` on PostgreSQL (a few bytes
per tag), and on SQLite by walking the ``(client_name, position)`` index
(``dest_nums`` is the text ``",1,5,"`` there). On PostgreSQL it is a view
of the same columns: entries are written to ``lrq_send_entries`` keyed by
transaction and ordinal, and the sequencer writes their positions
(``lrq_send_positions``, with the GIN index) after commit
(:mod:`lr_client.store.send.sequencer`, revision 0004).
"""

from __future__ import annotations

import re

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import postgresql

from lr_client.store.schema.metadata import BigId, metadata

send_log_entries = Table(
    "lrq_send_log_entries",
    metadata,
    Column("position", BigId, primary_key=True, autoincrement=True),
    Column("client_name", String(63), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    # PostgreSQL: smallint[] with a GIN index; SQLite: the text ",1,5,".
    Column(
        "dest_nums",
        Text().with_variant(postgresql.ARRAY(SmallInteger), "postgresql"),
        nullable=False,
    ),
    Column("created_at", Double, nullable=False),
    # The partition key (NULL: none; lr_client.partitioned) and headers (lr_client.headers).
    Column("partition_key", LargeBinary),
    Column("headers", LargeBinary),
    sqlite_autoincrement=True,
    # PostgreSQL: a view of the sequencer's tables with these columns.
    info={"view_on": "postgresql"},
)
#: PostgreSQL's send queue behind that view, created by revision 0004 in SQL
#: (their ``xid8`` and ``pg_snapshot`` columns have no SQLAlchemy type);
#: :mod:`lr_client.store.send.sequencer` reads and writes them.
SEQUENCER_TABLES = (
    "lrq_send_entries",
    "lrq_send_commits",
    "lrq_send_positions",
    "lrq_send_blocks",
    "lrq_send_ticks",
)
#: Revision 0006 puts each of them in slots (one partition per slot,
#: ``<table>_s<n>``), listed in ``lrq_send_slots``, the current one in
#: ``lrq_send_state`` (:mod:`lr_client.store.retention.slots`).
SLOT_TABLES = ("lrq_send_state", "lrq_send_slots")
_SLOT_PARTITION = re.compile("(" + "|".join(SEQUENCER_TABLES) + r")_s\d+")


def slot_parent(name: str) -> str | None:
    """The send queue table a slot's partition belongs to (None: not such a partition)."""
    found = _SLOT_PARTITION.fullmatch(name)
    return found.group(1) if found else None


def made_in_sql(name: str) -> bool:
    """Whether a PostgreSQL table is made by a revision's SQL rather than declared here."""
    return (
        name in SEQUENCER_TABLES
        or name in SLOT_TABLES
        or _SLOT_PARTITION.fullmatch(name) is not None
    )


Index("lrq_send_log_entries_client", send_log_entries.c.client_name, send_log_entries.c.position)
Index(
    "lrq_send_log_entries_dests",
    send_log_entries.c.dest_nums,
    postgresql_using="gin",
    info={"only": "postgresql"},
).ddl_if(dialect="postgresql")

cursors = Table(
    "lrq_cursors",
    metadata,
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("position", BigInteger, nullable=False, default=0),
    Column("acked_at", Double, nullable=False, default=0.0),
    Column("needs_snapshot", Boolean, nullable=False, default=False),
    PrimaryKeyConstraint("destination", "client_name"),
)


session_status = Table(
    "lrq_session_status",
    metadata,
    Column("destination", String(63), primary_key=True),
    Column("state", String(32), nullable=False),
    Column("connected", Boolean, nullable=False, default=False),
    Column("inflight_batches", Integer, nullable=False, default=0),
    Column("inflight_bytes", BigInteger, nullable=False, default=0),
    Column("last_error", Text, nullable=False, default=""),
    Column("updated_at", Double, nullable=False),
)


__all__ = [
    "SEQUENCER_TABLES",
    "SLOT_TABLES",
    "cursors",
    "made_in_sql",
    "send_log_entries",
    "session_status",
    "slot_parent",
]
