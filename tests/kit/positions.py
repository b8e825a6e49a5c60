"""Positions of transmitted entries, for tests that compare them."""

from __future__ import annotations

from collections.abc import Sequence

from lr_client.records import EntryRef
from lr_client.store.contract import QueueStore


def positions(store: QueueStore, refs: Sequence[EntryRef]) -> list[int]:
    """The positions of committed entries; all must be known (the store sequences first)."""
    found = store.send.positions_of(refs)
    assert None not in found, f"entries without a position: {refs} -> {found}"
    return [p for p in found if p is not None]


def new_slot(store: QueueStore) -> None:
    """PostgreSQL: close the send queue's current slot, so what follows goes to another.

    A trim retires whole slots there; tests that check which entries a trim
    keeps, entry by entry, write each in a slot of its own. SQLite trims rows.
    """
    store.retention.rotate_send_log()  # type: ignore[attr-defined]
