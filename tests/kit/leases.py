"""A unit's lease held by this member, then taken over by another, through the store."""

from __future__ import annotations

from lr_client.records import Fence
from lr_client.store.contract import QueueStore

#: The member that holds the units, and the one that takes them over.
OWNER, OTHER = ("a", "ia"), ("a2", "ib")


def hold(store: QueueStore, unit: str) -> Fence:
    """``unit``'s lease, held by :data:`OWNER` (joined if it was not) for a minute."""
    store.members.join_member(*OWNER, "", 1)
    fence = store.members.acquire_unit(unit, *OWNER, 60.0)
    assert fence is not None
    return fence


def take_over(store: QueueStore, unit: str) -> Fence:
    """:data:`OTHER` takes ``unit`` as if its owner's lease had lapsed."""
    store.members.join_member(*OTHER, "", 1)
    fence = store.members.acquire_unit(unit, *OTHER, -1.0)
    assert fence is not None
    return fence
