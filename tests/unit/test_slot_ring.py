"""The choice of a ring's next current slot: a reclaimed slot, else a new one up to the maximum."""

from __future__ import annotations

import pytest

from lr_client.store.slot_ring import Partitions, Reclaim, next_slot

FREED, BUSY, PINNED = Reclaim.FREED, Reclaim.BUSY, Reclaim.PINNED


@pytest.mark.parametrize(
    ("found", "busy_waits", "max_slots", "chosen", "tried", "added"),
    [
        # The first candidate freed is chosen; those after it are not tried.
        ({1: PINNED, 2: FREED, 3: FREED}, False, 4, 2, [1, 2], []),
        ({1: BUSY, 2: FREED, 3: PINNED}, True, 4, 2, [1, 2], []),
        # None freed: a new slot after the ring's highest, while the ring is below its maximum.
        ({1: PINNED, 2: BUSY, 3: PINNED}, False, 5, 4, [1, 2, 3], [4]),
        ({1: PINNED, 2: PINNED, 3: PINNED}, True, 5, 4, [1, 2, 3], [4]),
        # ... not past it,
        ({1: PINNED, 2: BUSY, 3: PINNED}, False, 4, None, [1, 2, 3], []),
        # ... nor while a busy slot is waited for.
        ({1: PINNED, 2: BUSY, 3: PINNED}, True, 5, None, [1, 2, 3], []),
    ],
)
def test_next_slot(
    found: dict[int, Reclaim],
    busy_waits: bool,
    max_slots: int,
    chosen: int | None,
    tried: list[int],
    added: list[int],
) -> None:
    reclaimed: list[int] = []
    new: list[int] = []

    def reclaim(slot: int) -> Reclaim:
        reclaimed.append(slot)
        return found[slot]

    ring = [0, 1, 2, 3]
    got = next_slot(
        ring, [1, 2, 3], reclaim, new.append, max_slots=max_slots, busy_waits=busy_waits
    )
    assert (got, reclaimed, new) == (chosen, tried, added)


def test_candidates_are_tried_in_the_order_given() -> None:
    tried: list[int] = []

    def reclaim(slot: int) -> Reclaim:
        tried.append(slot)
        return PINNED

    got = next_slot([0, 1, 2, 3], [3, 1, 2], reclaim, lambda _: None, max_slots=4, busy_waits=False)
    assert got is None
    assert tried == [3, 1, 2]


def test_a_partitions_name_is_its_prefix_and_a_checked_slot_number() -> None:
    parts = Partitions("lrq_recv_entries", "lrq_recv_entries_p")
    assert parts.name(0) == "lrq_recv_entries_p0"
    assert parts.name(12) == "lrq_recv_entries_p12"
    # A name becomes SQL: nothing but a non-negative integer makes one.
    for bad in (-1, True, "1", "1; DROP TABLE x", 1.0, None):
        with pytest.raises(ValueError, match="a slot is a non-negative integer"):
            parts.name(bad)  # type: ignore[arg-type]
