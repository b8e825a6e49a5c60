"""What the contract tests do through a store's public methods, more than once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from sqlalchemy.engine import Connection

from lr_client.errors import SchemaError, StoreUnavailableError
from lr_client.records import ReplicationType, WireEntry
from lr_client.store.contract import QueueStore, Sites, Transactions
from tests.contract.outage import Outage
from tests.kit.positions import new_slot, positions

T = TypeVar("T")


class _RollBack(Exception):
    """Ends :func:`rolled_back`'s transaction."""


@contextlib.contextmanager
def rolled_back(store: Transactions) -> Iterator[Connection]:
    """A store transaction that is rolled back, not committed, at the end of the block."""
    with contextlib.suppress(_RollBack), store.write() as conn:
        yield conn
        raise _RollBack


def append(store: QueueStore, client: str, *rows: tuple[bytes, list[str]]) -> list[int]:
    """Transmit ``(payload, destinations)`` rows in one committed transaction; their positions."""
    nums = store.sites.register_sites(sorted({d for _, ds in rows for d in ds}))
    with store.write() as conn:
        refs = store.send.append_log_entries(
            conn, client, [(p, [nums[d] for d in ds]) for p, ds in rows]
        )
    return positions(store, refs)


def append_apart(store: QueueStore, client: str, *rows: tuple[bytes, list[str]]) -> list[int]:
    """Each row in a transaction and (PostgreSQL) a send queue slot of its own; positions.

    A trim then retires entry by entry on both backends (:func:`new_slot`).
    """
    out: list[int] = []
    for row in rows:
        new_slot(store)
        out += append(store, client, row)
    return out


def pass_entries(store: QueueStore, queue_id: int, n: int, owner: str = "s1") -> list[int]:
    """Deliver the ``n`` oldest entries of a queue as a subscriber does; their positions."""
    with store.write() as conn:
        assert store.queues.acquire_lease(conn, queue_id, owner, 100.0, 1e9) is not None
    with store.write() as conn:
        state = store.queues.load_state(conn, queue_id)
        head = store.heads.read_head(conn, queue_id, n)
        if not head:
            return []
        assert store.queues.save_state(
            conn,
            queue_id,
            owner,
            snapshot_id=state.snapshot_id,
            in_snapshot=state.in_snapshot,
            delivered=state.delivered + len(head),
            lease_expires=1e9,
            previous_seq=state.delivered_seq,
            delivered_seq=head[-1].seq,
        )
    return [e.source_position for e in head]


def log(*positions: int) -> list[WireEntry]:
    """Log entries as they come from the wire, payload ``b"<position>"``."""
    return [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p) for p in positions]


def across_outage(outage: Outage, call: Callable[[], T]) -> T:
    """Lose the store's connections, then ``call``: a transient error, or an answer.

    A lasting outage (SQLite: the file cannot be opened) must raise
    :class:`StoreUnavailableError`; a short one (PostgreSQL: the server is up
    again) may too. Once the database is back, ``call`` succeeds: its result.
    """
    outage.begin()
    try:
        if outage.lasting:
            with pytest.raises(StoreUnavailableError):
                call()
        else:
            with contextlib.suppress(StoreUnavailableError):
                call()
    finally:
        outage.end()
    return call()


def refused_for_no_schema(bare: Sites, call: Callable[[], object]) -> None:
    """On an empty database ``call`` raises :class:`SchemaError` and creates nothing."""
    with pytest.raises(SchemaError):
        call()
    with pytest.raises(SchemaError, match="no schema"):
        bare.check_schema()
