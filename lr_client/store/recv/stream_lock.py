"""PostgreSQL: the lock a receive batch takes on its stream, with what it does under it.

Appends to one receive queue commit in sequence order (a subscriber must never
pass a ``seq`` that commits later), so each batch holds its stream's advisory
lock to its commit. Revision 0020's ``lrq_recv_lock`` takes it, then reads the
stream's progress and the receive queues' current slot
(:mod:`~lr_client.store.recv.rotation`) and, for a log batch that goes past
the stream's position where subscribers are woken by notifications
(:mod:`~lr_client.store.recv.arrival_watch`), notifies them at commit: one
round trip where there were four. The slot and the notification are
kept for the transaction, for its append.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import text
from sqlalchemy.engine import Connection, Row, Transaction

from lr_client.store.recv import arrival_watch

_LOCK = text("SELECT * FROM lrq_recv_lock(:key, :source, :client, :channel, :through, :limit)")


def stream_key(source_id: str, client_name: str) -> str:
    """The text the stream's advisory lock key is hashed from."""
    return f"lrq_recv:{client_name}:{source_id}"


class StreamLocks:
    """Takes streams' locks; remembers, per open transaction, the slot read with one and
    the clients whose arrivals it announced."""

    def __init__(self) -> None:
        # Forgotten with the transaction: a later one reads and announces again.
        self._slots: WeakKeyDictionary[Transaction, int] = WeakKeyDictionary()
        self._announced: WeakKeyDictionary[Transaction, set[str]] = WeakKeyDictionary()

    def lock(
        self, conn: Connection, source_id: str, client_name: str, through: int | None
    ) -> Row[Any] | None:
        """Lock the stream in ``conn``'s transaction and, if ``through`` (a log batch's
        last position) is past the stream's position, notify its client's subscribers at
        commit; the stream's progress row (None: none yet)."""
        row = conn.execute(
            _LOCK,
            {
                "key": stream_key(source_id, client_name),
                "source": source_id,
                "client": client_name,
                "channel": arrival_watch.CHANNEL,
                "through": through,
                "limit": arrival_watch.QUEUE_USAGE_LIMIT,
            },
        ).one()
        txn = conn.get_transaction()
        if txn is not None:
            self._slots[txn] = int(row.cur_slot)
            last = int(row.last_position) if row.known else 0
            if through is not None and through > last:
                self._announced.setdefault(txn, set()).add(client_name)
        return row if row.known else None

    def slot(self, conn: Connection) -> int | None:
        """The current slot read with a lock in ``conn``'s transaction (None: none taken)."""
        txn = conn.get_transaction()
        return None if txn is None else self._slots.get(txn)

    def announced(self, conn: Connection, client_name: str) -> bool:
        """Whether a lock in ``conn``'s transaction announced ``client_name``'s arrivals."""
        txn = conn.get_transaction()
        return txn is not None and client_name in self._announced.get(txn, ())


__all__ = ["StreamLocks", "stream_key"]
