"""Wake-ups for subscribers when a receiver stores entries (PostgreSQL ``LISTEN``/``NOTIFY``).

A subscriber in another process than the receiver learns of new entries at its
next poll (``poll_interval``, 0.5 s by default). On PostgreSQL the receive
transaction that appends entries to a queue also sends a notification on
:data:`CHANNEL` whose payload is the client's name; PostgreSQL delivers it at
commit, never for a batch rolled back. A subscriber's :class:`ArrivalWatch`
holds one connection of its own that ``LISTEN``\\ s and calls ``wake`` for each
notification of its client, so it delivers at once and may poll rarely.

A wake-up only shortens a wait: the subscriber still polls at its interval, so
a lost notification costs latency, never an entry (on SQLite the subscriber
watches the database file's ``data_version`` instead:
:class:`~lr_client.store.watches.DataVersionWatch`). Hence:

* a receiver skips the notification while PostgreSQL's notification queue is
  half full (:data:`QUEUE_USAGE_LIMIT`): a listener that stopped reading (a
  stopped process) holds the queue's tail, and a full queue would make the
  ``NOTIFY``, and with it the receive transaction, fail;
* a watch whose connection breaks opens another with back-off, meanwhile the
  subscriber polls;
* notifications are per database: subscribers of stores in other schemas of
  the same database may be woken for nothing (one poll).

The cost: PostgreSQL serialises the commits of transactions that sent a
notification (a database-wide lock held through commit), so receive
transactions of different sources commit one at a time.
``[receiver] notify_subscribers = false`` turns the notifications off.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from lr_client.store.watches import ChannelWatch, Wake

#: The notification channel of every store (a database's stores share it).
CHANNEL = "lrq_arrivals"
#: Above this fraction of PostgreSQL's notification queue, receivers send none.
QUEUE_USAGE_LIMIT = 0.5
#: The statement a receive transaction runs once it appended entries of a client.
NOTIFY_SQL = "SELECT pg_notify(%s, %s) WHERE pg_notification_queue_usage() < %s"


def notify(raw: Any, client_name: str) -> None:
    """Announce, in the transaction of the psycopg connection ``raw``, entries of a client."""
    with raw.cursor() as cur:
        cur.execute(NOTIFY_SQL, (CHANNEL, client_name, QUEUE_USAGE_LIMIT))


class ArrivalWatch(ChannelWatch):
    """A thread listening on its own connection; ``wake()`` per notification of a client."""

    def __init__(self, engine: Engine, client_name: str, wake: Wake) -> None:
        super().__init__(engine, CHANNEL, wake, payload=client_name)


__all__ = ["CHANNEL", "NOTIFY_SQL", "QUEUE_USAGE_LIMIT", "ArrivalWatch", "notify"]
