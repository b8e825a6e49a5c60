"""The site's servers: listed (``lr members``), a weight set, a gone member removed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lr_server.admin.errors import AdminInputError, NotFoundError
from lr_server.admin.records import MemberView

if TYPE_CHECKING:
    from lr_client.store import QueueStore
    from lr_server.config import SiteConfig


def list_members(config: SiteConfig, store: QueueStore) -> list[MemberView]:
    """The site's servers (``lr members``): alive or gone by ``members.lease_timeout``,
    with their heartbeat's age and the units of work each owns."""
    found = store.members.list_members(config.members.lease_timeout)
    leases = store.members.list_leases()
    now = store.members.db_now()
    owned: dict[str, list[str]] = {}
    for lease in leases:
        if lease.owner is not None:
            owned.setdefault(lease.owner, []).append(lease.unit)
    return [
        MemberView(
            member_id=m.member_id,
            address=m.address,
            weight=m.weight,
            alive=m.alive,
            heartbeat_age=round(max(0.0, now - m.heartbeat_at), 3),
            joined_at=m.joined_at,
            units=sorted(owned.get(m.instance, [])),
        )
        for m in found
    ]


def set_member_weight(store: QueueStore, member_id: str, weight: int) -> None:
    """Set a member's weight at run time (``lr members weight``; 0 drains it: its units
    move to the others). Raises :class:`NotFoundError` for an unknown member."""
    if weight < 0:
        raise AdminInputError(f"weight {weight} is negative", "weight")
    if not store.members.set_member_weight(member_id, weight):
        raise NotFoundError(f"no member {member_id!r} (see 'lr members')")


def remove_member(store: QueueStore, member_id: str) -> None:
    """Forget a member that is gone, releasing its units at once (``lr members remove``).
    Raises :class:`NotFoundError` for an unknown member."""
    if not store.members.remove_member(member_id):
        raise NotFoundError(f"no member {member_id!r} (see 'lr members')")
