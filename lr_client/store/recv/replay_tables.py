"""The table of replay requests (revision 0015), beside :mod:`lr_client.store.schema.tables`.

``lrq_replays``: one row per ``lr replay`` request, the source's record of an
operator asking that a stream's retained entries from ``from_position`` on be
shipped again to one destination. The running sender session of that
destination picks it up (``through_position``: the position the destination
had acknowledged then, the last one replayed), records how far it was
acknowledged (``shipped_through``) and ends it (``done``) or refuses it
(``refused``, with ``error``). Ended rows stay as the record.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, Integer, String, Table, Text

from lr_client.store.schema.tables import metadata

replays = Table(
    "lrq_replays",
    metadata,
    Column("replay_id", Integer, primary_key=True, autoincrement=True),
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("from_position", BigInteger, nullable=False),
    Column("through_position", BigInteger),  # set when the session picks it up
    Column("shipped_through", BigInteger, nullable=False),  # acknowledged so far
    Column("status", String(16), nullable=False),  # pending, running, done, refused
    Column("error", Text, nullable=False),
    Column("requested_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    sqlite_autoincrement=True,
)

__all__ = ["replays"]
