"""This server as a member of its site: heartbeat, placement rounds, leases.

Every ``heartbeat_interval`` the member records its heartbeat (by the
database's clock) and, in the same transaction, reads the members and the
leases. When they show a change (a member came, went or was reweighted, a
lease it holds was lost, a unit it wins is not yet its own) a placement
round follows: it places every unit of the site
(:mod:`lr_server.cluster.placement`), gives up the units it holds but no longer
wins (the work stops first, then the lease is released), and takes the
units it wins once they are free (released, or their owner's heartbeat is
older than ``lease_timeout``). Rounds go on each interval until one changes
nothing; a steady member runs one anyway every :data:`STEADY_ROUND_PERIOD`
intervals. The work it runs follows the units it holds (``on_change``).

Self-fencing: a member that cannot record its heartbeat stops all its work
once ``lease_timeout`` minus a margin has passed since the start of its last
recorded heartbeat (its own monotonic clock). Others take its units only
when its heartbeat is ``lease_timeout`` old by the database's clock, which
is later, so the two never overlap; the fencing token (every write for a
unit checks it) covers anything slower still.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from lr_client.errors import LRError
from lr_client.records import Fence, Member
from lr_client.store import Members
from lr_client.store.cluster.contract import Roster
from lr_server import metrics
from lr_server.cluster.placement import place
from lr_server.config import SiteConfig

log = logging.getLogger("lr.members")

#: Fraction of the lease timeout a member keeps working without a recorded heartbeat.
SELF_FENCE_FRACTION = 0.75
#: Heartbeat intervals between placement rounds at most while nothing changes.
STEADY_ROUND_PERIOD = 30


def default_member_id(config: SiteConfig) -> str:
    """``members.id``, else the host name, plus ``:<port>`` of ``site.listen``."""
    if config.members.id:
        return config.members.id
    host = socket.gethostname()
    if config.listen:
        return f"{host}:{config.listen.rpartition(':')[2]}"
    return host


class Membership:
    """Holds this member's units; calls ``on_change(fences)`` when they change."""

    def __init__(
        self,
        store: Members,
        member_id: str,
        units: Sequence[str],
        on_change: Callable[[Mapping[str, Fence]], None],
        *,
        address: str = "",
        weight: int = 1,
        lease_timeout: float = 5.0,
        heartbeat_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.member_id = member_id
        self.instance = uuid.uuid4().hex
        self.units = list(units)
        self.on_change = on_change
        self.address = address
        self.weight = weight
        self.lease_timeout = lease_timeout
        self.heartbeat_interval = heartbeat_interval
        self.fences: dict[str, Fence] = {}  # the units whose work runs now
        #: The leases this instance holds in the database: the running units', and any
        #: kept while its work is stopped (no heartbeat lately), until released or lost.
        self._claimed: dict[str, Fence] = {}
        #: This process's clock for self-fencing (monotonic; tests give a skewed one).
        self.clock = clock
        self._valid_until = 0.0  # monotonic: work stops past it without a heartbeat
        self._weights: dict[str, int] | None = None  # live members at the last round
        self._wanted: dict[str, str | None] = {}  # the placement of the last round
        self._round_due = threading.Event()  # a heartbeat or a round saw a change
        self._lock = threading.Lock()
        self._replaced = False  # another process took this member id over
        self._left = False

    # -- life -------------------------------------------------------------------------------
    def join(self) -> None:
        """Register, then run one placement round (units that are free are taken now)."""
        started = self.clock()
        before = {m.member_id: m for m in self.store.list_members(self.lease_timeout)}
        old = before.get(self.member_id)
        if old is not None and old.alive and old.instance != self.instance:
            log.warning(
                "member %s was still alive (instance %s): this process takes it over",
                self.member_id,
                old.instance,
            )
        self.store.join_member(self.member_id, self.instance, self.address, self.weight)
        self._valid_until = started + self.lease_timeout * SELF_FENCE_FRACTION
        log.info("member %s joined (weight %d)", self.member_id, self.weight)
        self.round()

    def run(self, stop: threading.Event) -> None:
        """Place until ``stop`` is set: as soon as a heartbeat or a round saw a change (at
        most once an interval), and every :data:`STEADY_ROUND_PERIOD` intervals anyway.
        Heartbeats are :meth:`beat`'s, on their own thread, whose end wakes this one."""
        while not stop.is_set():
            self._round_due.wait(self.heartbeat_interval * STEADY_ROUND_PERIOD)
            if stop.is_set():
                break
            self._round_due.clear()
            try:
                self.round()
            except Exception:  # a bug: log it, keep placing
                log.exception("member %s: placement round failed", self.member_id)
                self._round_due.set()
            stop.wait(self.heartbeat_interval)

    def beat(self, stop: threading.Event) -> None:
        """Record a heartbeat every ``heartbeat_interval`` until ``stop`` is set.

        On a thread of its own, so a round that waits for work to stop (a
        session finishing its in-flight batches) never delays a heartbeat.
        """
        try:
            while not stop.wait(self.heartbeat_interval):
                try:
                    self.heartbeat()
                except Exception:  # a bug: log it, keep beating
                    log.exception("member %s: heartbeat failed", self.member_id)
        finally:
            self._round_due.set()  # :meth:`run` sees the stop at once

    def heartbeat(self) -> bool:
        """Record one heartbeat; whether it was recorded (this member may go on working)."""
        if self._replaced or self._left:
            return False
        started = self.clock()
        try:
            roster = self.store.heartbeat_member(self.member_id, self.instance, self.lease_timeout)
            if roster is None:
                self._round_due.set()
                self._lost_row()
                return False
        except LRError as exc:
            log.warning("member %s: heartbeat failed: %s", self.member_id, exc)
            self._round_due.set()
            if not self.valid() and self.fences:
                self.round()  # stops the work at once
            return False
        self._valid_until = started + self.lease_timeout * SELF_FENCE_FRACTION
        metrics.MEMBER_HEARTBEATS.labels(self.member_id).inc()
        if not self._steady(roster):
            self._round_due.set()
        return True

    def _steady(self, roster: Roster) -> bool:
        """Whether a round would change nothing: the same live members and weights as the
        last round's, and this run still holds every unit it claimed (between its rounds
        only others change its leases, and they can only take them), which are exactly
        the units it wins, all running."""
        weights = {m.member_id: m.weight for m in roster.members if m.alive}
        wanted, claimed, fences = self._wanted, self._claimed, self.fences
        if weights != self._weights or roster.held != len(claimed) or claimed != fences:
            return False
        return set(claimed) == {unit for unit, winner in wanted.items() if winner == self.member_id}

    def _lost_row(self) -> None:
        """The member's row is gone (an operator removed it) or another process holds it."""
        ours = self.store.list_members(self.lease_timeout)
        if any(m.member_id == self.member_id for m in ours):
            log.error(
                "member %s was taken over by another process: stopping all work", self.member_id
            )
            self._replaced = True
            with self._lock:
                self._set({})
            return
        self.store.join_member(self.member_id, self.instance, self.address, self.weight)
        self._valid_until = self.clock() + self.lease_timeout * SELF_FENCE_FRACTION
        log.warning("member %s was removed while running: joined again", self.member_id)

    def leave(self) -> None:
        """Stop all work, release every lease and leave the site (a clean stop)."""
        with self._lock:
            self._left = True
            self._set({})
            self._claimed.clear()  # leave_member releases them all
        try:
            released = self.store.leave_member(self.member_id, self.instance)
            log.info("member %s left; %d unit(s) released", self.member_id, released)
        except LRError as exc:
            log.warning("member %s could not leave cleanly: %s", self.member_id, exc)

    def valid(self) -> bool:
        """Whether this member may still work on its units (its heartbeat is recent)."""
        return self.clock() < self._valid_until

    # -- one round ------------------------------------------------------------------------------
    def round(self) -> None:
        """Heartbeat, place, release what moved away, take what came."""
        with self._lock:
            started = self.clock()
            try:
                self._round(started)
            except LRError as exc:
                log.warning("member %s: placement round failed: %s", self.member_id, exc)
                if not self.valid() and self.fences:
                    log.error("member %s: no heartbeat lately: stopping all work", self.member_id)
                    self._set({})
            metrics.MEMBER_UNITS.labels(self.member_id).set(len(self.fences))

    def _round(self, started: float) -> None:
        if self._replaced or self._left:
            return
        if not self.valid():
            # No heartbeat recorded lately: others may own the units now.
            if self.fences:
                log.error(
                    "member %s: no heartbeat for %.1f s: stopping all work",
                    self.member_id,
                    self.lease_timeout * SELF_FENCE_FRACTION,
                )
                self._set({})
            return
        members = self.store.list_members(self.lease_timeout)
        weights = {m.member_id: m.weight for m in members if m.alive}
        before = (dict(self._claimed), dict(self.fences))
        steady = weights == self._weights
        reason = self._reason(weights)
        wanted = place(self.units, weights)
        self._wanted = wanted
        claimed = dict(self._claimed)
        gone = {u: f for u, f in claimed.items() if wanted.get(u) != self.member_id}
        if gone:
            # The work stops before the lease goes.
            self._set({u: f for u, f in self.fences.items() if u not in gone})
            for unit, fence in gone.items():
                self.store.release_unit(fence)
                del self._claimed[unit]
                log.info(
                    "unit %s: moves from %s to %s (%s)",
                    unit,
                    self.member_id,
                    wanted.get(unit),
                    reason,
                )
                metrics.PLACEMENT_CHANGES.labels(self.member_id, "released").inc()
        taken: dict[str, Fence] = {}
        # One read finds the units this run still holds: a steady round writes nothing.
        held = {
            lease.unit: Fence(lease.unit, self.instance, lease.token)
            for lease in self.store.list_leases()
            if lease.owner == self.instance
        }
        for unit, winner in wanted.items():
            if winner != self.member_id:
                continue
            if unit in held:
                taken[unit] = held[unit]
                continue
            steady = False
            got = self.store.acquire_unit(unit, self.member_id, self.instance, self.lease_timeout)
            if got is None:
                continue  # still held by a live member: it gives it up on its own round
            taken[unit] = got
        for unit, fence in list(self._claimed.items()):
            if taken.get(unit) != fence:
                log.warning("unit %s: lease lost by %s", unit, self.member_id)
                del self._claimed[unit]
        for unit in taken:
            if unit not in self._claimed:
                log.info("unit %s: now owned by %s (%s)", unit, self.member_id, reason)
                metrics.PLACEMENT_CHANGES.labels(self.member_id, "acquired").inc()
        steady = steady and taken == before[0] == before[1]
        self._claimed = dict(taken)
        if taken != self.fences:
            self._set(taken)
        if not steady:  # the next interval places again, until a round changes nothing
            self._round_due.set()

    def _reason(self, weights: dict[str, int]) -> str:
        """Why placement may have changed since the last round, in words."""
        before, self._weights = self._weights, dict(weights)
        if before is None:
            return f"{self.member_id} joined"
        parts = [f"{m} joined" for m in weights if m not in before]
        parts += [f"{m} left or is gone" for m in before if m not in weights]
        parts += [
            f"{m} weight {before[m]} -> {w}"
            for m, w in weights.items()
            if m in before and before[m] != w
        ]
        return ", ".join(parts) or "leases freed"

    def _set(self, fences: dict[str, Fence]) -> None:
        self.fences = dict(fences)
        self.on_change(dict(fences))

    def members(self) -> list[Member]:
        """The site's members as the database has them."""
        return self.store.list_members(self.lease_timeout)


__all__ = ["SELF_FENCE_FRACTION", "STEADY_ROUND_PERIOD", "Membership", "default_member_id"]
