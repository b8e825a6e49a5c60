"""Parked entries at a sink (``lr parked``): listed, shown, retried, discarded; and the
queues blocked by a failing listener.

An entry is parked when the ``park`` failure policy of the sink's subscriber
(:mod:`lr_client.failure_policy`) gave up on it; later entries of its key are
held behind it. :func:`retry_parked` asks the subscriber to deliver it again
at its next round (then the entries of its key held behind it, in order);
:func:`discard_parked` gives it up, recording who and when (the entries held
behind it are then delivered). Rows are never deleted.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lr_client.store.recv import parked as pk
from lr_client.store.recv import parked_views as pv
from lr_server.admin.errors import AdminInputError, NotFoundError, StateError

if TYPE_CHECKING:
    from lr_client.store import QueueStore

#: The states an operator can ask for in :func:`list_parked`.
STATES = tuple(x.value for x in pk.ParkedState)


@dataclass(frozen=True)
class ParkedView:
    """One parked (or held, retried, discarded) entry; ``payload`` only from
    :func:`show_parked` (else None)."""

    parked_id: int
    client: str
    source: str
    seq: int
    source_position: int
    key: str | None
    state: str
    error: str
    attempts: int
    first_failed_at: float
    last_failed_at: float
    retried_at: float | None
    discarded_by: str | None
    discarded_at: float | None
    payload: str | None = None

    @classmethod
    def of(cls, r: pv.ParkedRow, *, payload: bool = False) -> ParkedView:
        return cls(
            parked_id=r.parked_id,
            client=r.client_name,
            source=r.source_id,
            seq=r.seq,
            source_position=r.source_position,
            key=None if r.partition_key is None else r.partition_key.decode(errors="replace"),
            state=r.state,
            error=r.error,
            attempts=r.attempts,
            first_failed_at=r.first_failed_at,
            last_failed_at=r.last_failed_at,
            retried_at=r.retried_at,
            discarded_by=r.discarded_by,
            discarded_at=r.discarded_at,
            payload=r.payload.decode(errors="replace") if payload else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr parked ... --json`` prints for it."""
        return asdict(self)


@dataclass(frozen=True)
class BlockedView:
    """A queue (``partition`` None) or a partition of it blocked by its listener."""

    client: str
    source: str
    partition: int | None
    error: str
    attempts: int
    first_failed_at: float
    last_failed_at: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr status --json`` prints for it."""
        return asdict(self)


@dataclass(frozen=True)
class ParkedCount:
    """How many entries of a queue wait for an operator (parked, held or retrying)."""

    client: str
    source: str
    entries: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr status --json`` prints for it."""
        return asdict(self)


def parked_counts(store: QueueStore, client: str | None = None) -> list[ParkedCount]:
    """Per queue with any: its entries parked, held or retrying (``lr status``)."""
    with store.read() as conn:
        counts = pv.open_counts(conn, client)
    return [ParkedCount(c, s, n) for (c, s), n in sorted(counts.items())]


def list_parked(
    store: QueueStore,
    client: str | None = None,
    source: str | None = None,
    states: Sequence[str] | None = None,
    *,
    limit: int = 100,
) -> list[ParkedView]:
    """Parked entries by queue and order (``lr parked list``): of ``client`` and
    ``source`` if given, in ``states`` (default: the unresolved ones)."""
    if limit <= 0:
        raise AdminInputError("limit must be positive", "limit")
    chosen = list(states) if states else [x.value for x in pk.OPEN_STATES]
    bad = sorted(set(chosen) - set(STATES))
    if bad:
        raise AdminInputError(f"unknown state {bad[0]!r} (one of {', '.join(STATES)})", "state")
    with store.read() as conn:
        rows = pv.find(conn, client=client, source=source, states=chosen, limit=limit)
    return [ParkedView.of(r) for r in rows]


def show_parked(store: QueueStore, parked_id: int) -> ParkedView:
    """One parked entry with its payload (``lr parked show``)."""
    with store.read() as conn:
        rows = pv.find(conn, ids=[parked_id])
    if not rows:
        raise NotFoundError(f"no parked entry {parked_id}")
    return ParkedView.of(rows[0], payload=True)


def _change(
    store: QueueStore,
    ids: Sequence[int],
    allowed: Sequence[pk.ParkedState],
    to: pk.ParkedState,
    **values: Any,
) -> list[ParkedView]:
    """Move each of ``ids`` from one of ``allowed`` to ``to``, all or none."""
    if not ids:
        raise AdminInputError("give at least one parked entry id", "id")
    with store.write() as conn:
        rows = {r.parked_id: r for r in pv.find(conn, ids=ids)}
        for i in ids:
            row = rows.get(i)
            if row is None:
                raise NotFoundError(f"no parked entry {i}")
            was = pk.ParkedState(row.state)
            if was not in allowed:
                raise StateError(f"parked entry {i} is {row.state}, not {allowed[0].value}")
            if not pk.move(conn, i, was, to, **values):
                raise StateError(f"parked entry {i} changed meanwhile; try again")
        changed = pv.find(conn, ids=ids)
    return [ParkedView.of(r) for r in changed]


def retry_parked(store: QueueStore, ids: Sequence[int]) -> list[ParkedView]:
    """Deliver parked entries again (``lr parked retry``): each goes to ``retrying``
    and the subscriber delivers it at its next round, then the entries of its key
    held behind it, in order; one that fails again is parked again.
    :class:`StateError` (nothing changed) if one is not parked."""
    return _change(store, ids, (pk.ParkedState.PARKED,), pk.ParkedState.RETRYING)


def os_user() -> str:
    """The OS user running this process ("unknown" if it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, no LOGNAME/USER (a container)
        return "unknown"


def discard_parked(
    store: QueueStore, ids: Sequence[int], by: str | None = None
) -> list[ParkedView]:
    """Give up parked or held entries (``lr parked discard``), recording ``by`` (default:
    the OS user) and the time; the row stays. The entries held behind a discarded
    parked entry are then delivered. :class:`StateError` (nothing changed) if one
    is resolved already."""
    who = by or os_user()
    allowed = (pk.ParkedState.PARKED, pk.ParkedState.HELD)
    return _change(
        store, ids, allowed, pk.ParkedState.DISCARDED, discarded_by=who, discarded_at=time.time()
    )


def blocked_queues(store: QueueStore, client: str | None = None) -> list[BlockedView]:
    """The queues and partitions whose listener failed ``max_attempts`` times in a row."""
    with store.read() as conn:
        rows = pv.blocked_rows(conn, client)
    return [
        BlockedView(
            r.client_name,
            r.source_id,
            None if r.partition == pk.WHOLE_QUEUE else r.partition,
            r.error,
            r.attempts,
            r.first_failed_at,
            r.last_failed_at,
        )
        for r in rows
    ]


__all__ = [
    "STATES",
    "BlockedView",
    "ParkedCount",
    "ParkedView",
    "blocked_queues",
    "discard_parked",
    "list_parked",
    "os_user",
    "parked_counts",
    "retry_parked",
    "show_parked",
]
