"""Wake-ups for subscribers when a receiver stores entries (PostgreSQL ``LISTEN``/``NOTIFY``).

A subscriber in another process than the receiver learns of new entries at its
next poll (``poll_interval``, 0.5 s by default). On PostgreSQL the receive
transaction that appends entries to a queue also sends a notification on
:data:`CHANNEL` whose payload is the client's name; PostgreSQL delivers it at
commit, never for a batch rolled back. A subscriber's :class:`ArrivalWatch`
holds one connection of its own that ``LISTEN``\\ s and calls ``wake`` for each
notification of its client, so it delivers at once and may poll rarely.

A wake-up only shortens a wait: the subscriber still polls at its interval, so
a lost notification costs latency, never an entry. Hence:

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

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

#: The notification channel of every store (a database's stores share it).
CHANNEL = "lrq_arrivals"
#: Above this fraction of PostgreSQL's notification queue, receivers send none.
QUEUE_USAGE_LIMIT = 0.5
#: The statement a receive transaction runs once it appended entries of a client.
NOTIFY_SQL = "SELECT pg_notify(%s, %s) WHERE pg_notification_queue_usage() < %s"
#: Seconds between waits for notifications: how soon :meth:`ArrivalWatch.close` is seen.
_WAIT_SLICE = 0.5
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 5.0


def notify(raw: Any, client_name: str) -> None:
    """Announce, in the transaction of the psycopg connection ``raw``, entries of a client."""
    with raw.cursor() as cur:
        cur.execute(NOTIFY_SQL, (CHANNEL, client_name, QUEUE_USAGE_LIMIT))


class ArrivalWatch:
    """A thread listening on its own connection; ``wake()`` per notification of a client."""

    def __init__(self, engine: Engine, client_name: str, wake: Callable[[], None]) -> None:
        self._engine = engine
        self._client = client_name
        self._wake = wake
        self._closed = threading.Event()
        #: Connections that were listening so far (one more after each reconnection).
        self.connections = 0
        self._listening = False
        self._thread = threading.Thread(
            target=self._run, name=f"lr-arrivals-{client_name}", daemon=True
        )
        self._thread.start()

    @property
    def listening(self) -> bool:
        """Whether a connection is listening now: every batch committed from here on
        wakes the subscriber (one that breaks wakes it too, so a poll finds what
        arrived while it was down)."""
        return self._listening

    def close(self) -> None:
        """Stop listening and close the connection (within about half a second)."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        backoff = _BACKOFF_MIN
        while not self._closed.is_set():
            try:
                self._listen()
                backoff = _BACKOFF_MIN
            except Exception as exc:  # the connection broke or could not be opened
                log.info("arrival notifications for %s: %r; polling meanwhile", self._client, exc)
                self._wake()  # what arrived while it was down is found by a poll now
                self._closed.wait(backoff)
                backoff = min(_BACKOFF_MAX, backoff * 2)

    def _listen(self) -> None:
        # A connection of its own, out of the pool: it listens until closed, and
        # a pooled connection would carry the LISTEN to whoever checks it out next.
        fairy = self._engine.raw_connection()
        raw = fairy.driver_connection
        fairy.detach()
        try:
            assert raw is not None
            raw.rollback()
            raw.autocommit = True
            raw.execute(f"LISTEN {CHANNEL}")
            self._listening = True
            self.connections += 1
            self._wake()  # entries stored before the LISTEN are found by a poll now
            while not self._closed.is_set():
                for n in raw.notifies(timeout=_WAIT_SLICE):
                    if n.payload == self._client:
                        self._wake()
        finally:
            self._listening = False
            fairy.close()


__all__ = ["CHANNEL", "NOTIFY_SQL", "QUEUE_USAGE_LIMIT", "ArrivalWatch", "notify"]
