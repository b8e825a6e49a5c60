"""The cluster's roles: the sites a database knows, and the members serving a site."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    Fence,
    Member,
    UnitLease,
)


class Roster(NamedTuple):
    """What a heartbeat reads in its transaction: every member, and how many units the
    heartbeating instance holds (only that instance's own rounds can add to them)."""

    members: list[Member]
    held: int


class Sites(Protocol):
    """The sites this database knows, by number: destinations and sources."""

    def register_sites(self, site_ids: Sequence[str]) -> dict[str, int]:
        """Register sites as possible destinations; return {site_id: site number}."""

    def site_numbers(self, refresh: bool = False) -> dict[str, int]:
        """The registered sites."""

    def site_name(self, num: int) -> str:
        """The site id of a site number (``#<num>`` if it is not registered)."""


class Members(Protocol):
    """A site's ``lr server`` processes and the leases of its units of work.

    Times are the database's clock. A lease is valid while its owner's
    heartbeat is (within the caller's ``lease_timeout``); every change of a
    unit's owner raises its fencing token."""

    def db_now(self, conn: Connection | None = None) -> float:
        """The database's clock, seconds since the epoch."""

    def join_member(self, member_id: str, instance: str, address: str, weight: int) -> Member:
        """Register (or take over, with a new ``instance``) a member; heartbeat now."""

    def heartbeat_member(
        self, member_id: str, instance: str, lease_timeout: float
    ) -> Roster | None:
        """Record that the member is alive and read the roster in the same transaction
        (``alive`` within ``lease_timeout``); None if its row is gone or another instance's."""

    def leave_member(self, member_id: str, instance: str) -> int:
        """Release every lease of ``instance`` and remove the member; how many were released."""

    def list_members(self, lease_timeout: float) -> list[Member]:
        """Every member, ``alive`` if its heartbeat is within ``lease_timeout`` seconds."""

    def set_member_weight(self, member_id: str, weight: int) -> bool:
        """Change a member's weight (0: it owns nothing); False if there is no such member."""

    def remove_member(self, member_id: str) -> bool:
        """Remove a member and release its leases (an operator's clean-up of a dead one)."""

    def list_leases(self) -> list[UnitLease]:
        """Every unit's lease."""

    def acquire_unit(
        self, unit: str, member_id: str, instance: str, lease_timeout: float
    ) -> Fence | None:
        """Take (or keep) a unit if it is free, released, or its owner's heartbeat lapsed.

        Its fence (the token is raised when the owner changes), or None if a
        live member holds it.
        """

    def release_unit(self, fence: Fence) -> bool:
        """Give a unit up at once; False if the fence no longer held it."""

    def check_fence(self, fence: Fence) -> None:
        """Raise :class:`~lr_client.errors.FencedError` unless the fence still holds its unit."""


__all__ = ["Members", "Sites"]
