"""Reads of the parked entries and blocked queues for operators and metrics
(``lr parked``, ``lr status``, ``lr_parked_entries``); the tables and the
subscriber's SQL are :mod:`lr_client.store.recv.parked`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from lr_client.store.recv.parked import OPEN_STATES, blocked, parked
from lr_client.store.schema import tables as s

_P = parked
_B = blocked
_Q = s.queue_registry


def _key(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


@dataclass(frozen=True, slots=True)
class ParkedRow:
    """A row of ``lrq_parked`` as an operator sees it."""

    parked_id: int
    queue_id: int
    client_name: str
    source_id: str
    seq: int
    source_position: int
    partition_key: bytes | None
    error: str
    attempts: int
    first_failed_at: float
    last_failed_at: float
    state: str
    retried_at: float | None
    discarded_by: str | None
    discarded_at: float | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class BlockedRow:
    """A blocked queue (``partition`` -1) or partition, with its client and source."""

    client_name: str
    source_id: str
    queue_id: int
    partition: int
    error: str
    attempts: int
    first_failed_at: float
    last_failed_at: float


def blocked_rows(conn: Connection, client: str | None = None) -> list[BlockedRow]:
    """Every blocked queue or partition (of ``client``, if given)."""
    query = (
        select(
            _Q.c.client_name,
            _Q.c.source_id,
            _B.c.queue_id,
            _B.c.partition,
            _B.c.error,
            _B.c.attempts,
            _B.c.first_failed_at,
            _B.c.last_failed_at,
        )
        .select_from(_B)
        .join(_Q, _Q.c.queue_id == _B.c.queue_id)
    )
    if client is not None:
        query = query.where(_Q.c.client_name == client)
    rows = conn.execute(query.order_by(_Q.c.client_name, _Q.c.source_id, _B.c.partition))
    return [BlockedRow(*r) for r in rows]


def open_counts(conn: Connection, client: str | None = None) -> dict[tuple[str, str], int]:
    """{(client, source): entries parked, held or retrying}."""
    query = (
        select(_P.c.client_name, _P.c.source_id, func.count())
        .where(_P.c.state.in_([x.value for x in OPEN_STATES]))
        .group_by(_P.c.client_name, _P.c.source_id)
    )
    if client is not None:
        query = query.where(_P.c.client_name == client)
    return {(r[0], r[1]): int(r[2]) for r in conn.execute(query)}


def blocked_counts(conn: Connection, client: str | None = None) -> dict[tuple[str, str], int]:
    """{(client, source): its queue's blocked rows (the queue, or partitions of it)}."""
    query = (
        select(_Q.c.client_name, _Q.c.source_id, func.count())
        .select_from(_B)
        .join(_Q, _Q.c.queue_id == _B.c.queue_id)
        .group_by(_Q.c.client_name, _Q.c.source_id)
    )
    if client is not None:
        query = query.where(_Q.c.client_name == client)
    return {(r[0], r[1]): int(r[2]) for r in conn.execute(query)}


# -- operators --------------------------------------------------------------------------
_COLUMNS = (
    _P.c.parked_id,
    _P.c.queue_id,
    _P.c.client_name,
    _P.c.source_id,
    _P.c.seq,
    _P.c.source_position,
    _P.c.partition_key,
    _P.c.error,
    _P.c.attempts,
    _P.c.first_failed_at,
    _P.c.last_failed_at,
    _P.c.state,
    _P.c.retried_at,
    _P.c.discarded_by,
    _P.c.discarded_at,
    _P.c.payload,
)


def _row(r: Any) -> ParkedRow:
    values = list(r)
    values[6] = _key(values[6])
    values[15] = bytes(values[15])
    return ParkedRow(*values)


def find(
    conn: Connection,
    *,
    client: str | None = None,
    source: str | None = None,
    states: Sequence[str] | None = None,
    ids: Sequence[int] | None = None,
    limit: int | None = None,
) -> list[ParkedRow]:
    """Rows by client, source, state and id, oldest first."""
    query = select(*_COLUMNS)
    if client is not None:
        query = query.where(_P.c.client_name == client)
    if source is not None:
        query = query.where(_P.c.source_id == source)
    if states is not None:
        query = query.where(_P.c.state.in_(list(states)))
    if ids is not None:
        query = query.where(_P.c.parked_id.in_(list(ids)))
    query = query.order_by(_P.c.queue_id, _P.c.seq)
    if limit is not None:
        query = query.limit(limit)
    return [_row(r) for r in conn.execute(query)]


__all__ = [
    "BlockedRow",
    "ParkedRow",
    "blocked_counts",
    "blocked_rows",
    "find",
    "open_counts",
]
