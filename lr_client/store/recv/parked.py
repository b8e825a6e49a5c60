"""Parked entries and blocked queues at the sink: their tables and SQL.

``lrq_parked`` is the dead-letter table of the receive queues: an entry whose
listener kept failing under the ``park`` policy
(:mod:`lr_client.failure_policy`) is written here in the delivery's
transaction, and so is every later entry of its key while it waits (state
``held``). An operator resolves a parked entry with ``lr parked retry``
(state ``retrying``: the subscriber delivers it, then the entries of its key
held behind it, and marks them ``retried``) or ``lr parked discard`` (who and
when recorded; the held entries of its key are then delivered). Rows are
never deleted: the table is the record.

``lrq_blocked`` holds one row per queue (``partition`` -1) or partition of a
queue whose delivery failed ``max_attempts`` times in a row, with the last
error; the delivery that next succeeds deletes it.

The functions taking a ``Connection`` run in the caller's transaction.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    and_,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from lr_client.store.schema import tables as s


class ParkedState(enum.StrEnum):
    """The state of a row of ``lrq_parked``."""

    #: Its listener failed on it: it waits for an operator.
    PARKED = "parked"
    #: A later entry of a parked entry's key: delivered once the entries before it are.
    HELD = "held"
    #: An operator asked for it again: the subscriber delivers it at its next round.
    RETRYING = "retrying"
    #: Delivered to the listener after all (the row stays as the record).
    RETRIED = "retried"
    #: Given up by an operator (who and when recorded); never delivered.
    DISCARDED = "discarded"


#: The states of entries not resolved yet: counted by ``lr_parked_entries``.
OPEN_STATES = (ParkedState.PARKED, ParkedState.HELD, ParkedState.RETRYING)
#: The states of entries the subscriber delivers once no parked entry of their key is before them.
RELEASED_STATES = (ParkedState.HELD, ParkedState.RETRYING)

parked = Table(
    "lrq_parked",
    s.metadata,
    Column("parked_id", Integer, primary_key=True, autoincrement=True),
    Column("queue_id", Integer, nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("source_id", String(63), nullable=False),
    Column("seq", BigInteger, nullable=False),  # its seq in the receive queue: the order
    Column("source_position", BigInteger, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("partition_key", LargeBinary),
    Column("headers", LargeBinary),  # as stored in the receive queue (lr_client.headers)
    Column("error", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("first_failed_at", Double, nullable=False),
    Column("last_failed_at", Double, nullable=False),
    Column("state", String(16), nullable=False),
    Column("retried_at", Double),
    Column("discarded_by", String(128)),
    Column("discarded_at", Double),
)
Index("lrq_parked_queue", parked.c.queue_id, parked.c.state, parked.c.seq)

blocked = Table(
    "lrq_blocked",
    s.metadata,
    Column("queue_id", Integer, nullable=False),
    Column("partition", Integer, nullable=False),  # -1: the queue as a whole
    Column("error", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("first_failed_at", Double, nullable=False),
    Column("last_failed_at", Double, nullable=False),
    PrimaryKeyConstraint("queue_id", "partition"),
)

_P = parked
_B = blocked
_Q = s.queue_registry
#: ``lrq_blocked.partition`` of a queue delivered as a whole.
WHOLE_QUEUE = -1


@dataclass(frozen=True, slots=True)
class NewParked:
    """An entry to park (or hold) in a delivery's transaction."""

    seq: int
    source_position: int
    payload: bytes
    key: bytes | None
    error: str
    attempts: int
    state: ParkedState
    headers: bytes | None = None


@dataclass(frozen=True, slots=True)
class OpenRow:
    """An unresolved row of a queue, as the subscriber orders them."""

    parked_id: int
    seq: int
    key: bytes | None
    state: ParkedState
    source_position: int
    attempts: int


def _key(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def park(
    conn: Connection, queue_id: int, client: str, source: str, rows: Sequence[NewParked]
) -> None:
    """Write ``rows`` of one queue."""
    if not rows:
        return
    now = time.time()
    conn.execute(
        insert(_P),
        [
            {
                "queue_id": queue_id,
                "client_name": client,
                "source_id": source,
                "seq": r.seq,
                "source_position": r.source_position,
                "payload": r.payload,
                "partition_key": r.key,
                "headers": r.headers,
                "error": r.error,
                "attempts": r.attempts,
                "first_failed_at": now,
                "last_failed_at": now,
                "state": r.state.value,
            }
            for r in rows
        ],
    )


def open_rows(conn: Connection, queue_id: int) -> list[OpenRow]:
    """The queue's unresolved rows, in ``seq`` order (no payloads)."""
    query = (
        select(_P.c.parked_id, _P.c.seq, _P.c.partition_key, _P.c.state)
        .add_columns(_P.c.source_position, _P.c.attempts)
        .where(_P.c.queue_id == queue_id, _P.c.state.in_([x.value for x in OPEN_STATES]))
        .order_by(_P.c.seq)
    )
    return [
        OpenRow(r[0], r[1], _key(r[2]), ParkedState(r[3]), r[4], r[5]) for r in conn.execute(query)
    ]


def has_released(conn: Connection, queue_id: int) -> bool:
    """Whether the queue has rows the subscriber may deliver (held or retrying)."""
    query = select(_P.c.parked_id).where(
        _P.c.queue_id == queue_id, _P.c.state.in_([x.value for x in RELEASED_STATES])
    )
    return conn.execute(query.limit(1)).first() is not None


def payloads(conn: Connection, ids: Iterable[int]) -> dict[int, tuple[bytes, Any]]:
    """{parked id: (payload, stored headers)}."""
    query = select(_P.c.parked_id, _P.c.payload, _P.c.headers)
    return {
        r[0]: (bytes(r[1]), r[2]) for r in conn.execute(query.where(_P.c.parked_id.in_(list(ids))))
    }


def move(
    conn: Connection, parked_id: int, was: ParkedState, to: ParkedState, **values: Any
) -> bool:
    """Set a row's state from ``was`` to ``to`` (a compare-and-set): whether it was ``was``."""
    result = conn.execute(
        update(_P)
        .where(_P.c.parked_id == parked_id, _P.c.state == was.value)
        .values(state=to.value, **values)
    )
    return result.rowcount == 1


def failed_again(conn: Connection, parked_id: int, was: ParkedState, error: str) -> bool:
    """A released row whose delivery failed: parked again, its attempts counted."""
    result = conn.execute(
        update(_P)
        .where(_P.c.parked_id == parked_id, _P.c.state == was.value)
        .values(
            state=ParkedState.PARKED.value,
            error=error,
            attempts=_P.c.attempts + 1,
            last_failed_at=time.time(),
        )
    )
    return result.rowcount == 1


# -- blocked queues -------------------------------------------------------------------
def note_blocked(
    conn: Connection, queue_id: int, partition: int, error: str, attempts: int
) -> None:
    """Record (or update) a queue or partition blocked by ``attempts`` failures in a row."""
    now = time.time()
    where = and_(_B.c.queue_id == queue_id, _B.c.partition == partition)
    done = conn.execute(
        update(_B).where(where).values(error=error, attempts=attempts, last_failed_at=now)
    )
    if done.rowcount == 0:
        conn.execute(
            insert(_B).values(
                queue_id=queue_id,
                partition=partition,
                error=error,
                attempts=attempts,
                first_failed_at=now,
                last_failed_at=now,
            )
        )


def clear_blocked(conn: Connection, queue_id: int, partition: int | None) -> None:
    """A delivery succeeded: the queue's row for ``partition`` (None: every row) goes."""
    query = delete(_B).where(_B.c.queue_id == queue_id)
    if partition is not None:
        query = query.where(_B.c.partition == partition)
    conn.execute(query)


__all__ = [
    "OPEN_STATES",
    "RELEASED_STATES",
    "WHOLE_QUEUE",
    "NewParked",
    "OpenRow",
    "ParkedState",
    "blocked",
    "clear_blocked",
    "failed_again",
    "has_released",
    "move",
    "note_blocked",
    "open_rows",
    "park",
    "parked",
    "payloads",
]
