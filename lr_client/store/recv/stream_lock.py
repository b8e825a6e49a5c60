"""PostgreSQL: the lock a receive batch takes on its stream, with what it reads under it.

Appends to one receive queue commit in sequence order (a subscriber must never
pass a ``seq`` that commits later), so each batch holds its stream's advisory
lock to its commit. Revision 0020's ``lrq_recv_lock`` takes it and then reads
the stream's progress and the receive queues' current slot
(:mod:`~lr_client.store.recv.rotation`): one round trip where there were three.
The slot is kept for the transaction, for its append.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import text
from sqlalchemy.engine import Connection, Row, Transaction

_LOCK = text("SELECT * FROM lrq_recv_lock(:key, :source, :client)")


def stream_key(source_id: str, client_name: str) -> str:
    """The text the stream's advisory lock key is hashed from."""
    return f"lrq_recv:{client_name}:{source_id}"


class StreamLocks:
    """Takes streams' locks; remembers, per open transaction, the slot read with one."""

    def __init__(self) -> None:
        # Forgotten with the transaction: a later one reads the slot again.
        self._slots: WeakKeyDictionary[Transaction, int] = WeakKeyDictionary()

    def lock(self, conn: Connection, source_id: str, client_name: str) -> Row[Any] | None:
        """Lock the stream in ``conn``'s transaction; its progress row (None: none yet)."""
        row = conn.execute(
            _LOCK,
            {"key": stream_key(source_id, client_name), "source": source_id, "client": client_name},
        ).one()
        txn = conn.get_transaction()
        if txn is not None:
            self._slots[txn] = int(row.cur_slot)
        return row if row.known else None

    def slot(self, conn: Connection) -> int | None:
        """The current slot read with a lock in ``conn``'s transaction (None: none taken)."""
        txn = conn.get_transaction()
        return None if txn is None else self._slots.get(txn)


__all__ = ["StreamLocks", "stream_key"]
