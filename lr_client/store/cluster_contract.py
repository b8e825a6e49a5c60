"""Part of the queue store contract, split by role: what each caller needs of the store.

Callers type against the role(s) they play (:class:`Shipping` for a sender session's
reads, :class:`Receiving` for a sink's receiver, :class:`Replays` for ``lr replay``, ...);
:class:`QueueStore` combines them all and is what :func:`~lr_client.store.open_store`
returns. Methods that take a ``conn`` run inside the caller's transaction (the
application's, or a subscriber's) and commit or roll back with it; the others run their
own short transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    CascadeChild,
    CascadeNode,
    Fence,
    Member,
    QueueInfo,
    QueueSlot,
    SendEntry,
    StoredEntry,
    UnitLease,
)
from lr_client.store.inspection import SinkBacklog, SinkFailures
from lr_client.store.partition_lags import PartitionLag


class Inspection(Protocol):
    """Read-only views (``lr status``, ``lr browse``, metrics) and the sessions' status rows."""

    def sink_backlogs(self, client_name: str | None = None) -> list[SinkBacklog]:
        """Every receive queue's (of one client's) undelivered count and oldest arrival."""

    def sink_failures(self, client_name: str | None = None) -> SinkFailures:
        """Every receive queue's (of one client's) parked entries and blocked state."""

    def sink_partition_lags(self, client_name: str | None = None) -> list[PartitionLag]:
        """Every partition's (of one client's queues) entries above its delivered mark."""

    def save_session_status(
        self,
        destination: str,
        state: str,
        *,
        connected: bool,
        inflight_batches: int,
        inflight_bytes: int,
        last_error: str = "",
    ) -> None:
        """Record a sender session's state (one row per destination)."""

    def list_session_status(self) -> list[dict[str, Any]]:
        """The sender sessions' status rows, by destination."""

    def head_position_estimate(self) -> int:
        """The highest position assigned so far, read without waiting for transmitters
        (SQLite: it may count one whose transaction has not committed yet)."""

    def queue_depths(self) -> dict[int, int]:
        """{queue_id: entries waiting} of every non-empty receive queue."""

    def queue_sizes(self) -> tuple[int, int, list[tuple[QueueInfo, int]]]:
        """Entries in the send log, the snapshot queue, and each receive queue (by name)."""

    def queue_slots(self) -> list[QueueSlot]:
        """The send and receive queues' slots (PostgreSQL), in order; SQLite has none."""

    def browse_log_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Send log entries after ``after``; with ``destination``, those it still needs."""

    def browse_snapshot_entries(
        self, destination: str | None, client_name: str | None, after: int, limit: int
    ) -> list[StoredEntry]:
        """Snapshot queue entries after ``after`` (of one destination's, one client's)."""

    def browse_queue(self, queue_name: str, after: int, limit: int) -> list[StoredEntry] | None:
        """A receive queue's entries after ``seq`` ``after``; None if there is no such queue."""


class Members(Protocol):
    """A site's ``lr server`` processes and the leases of its units of work.

    Times are the database's clock. A lease is valid while its owner's
    heartbeat is (within the caller's ``lease_timeout``); every change of a
    unit's owner raises its fencing token."""

    def db_now(self, conn: Connection | None = None) -> float:
        """The database's clock, seconds since the epoch."""

    def join_member(self, member_id: str, instance: str, address: str, weight: int) -> Member:
        """Register (or take over, with a new ``instance``) a member; heartbeat now."""

    def heartbeat_member(self, member_id: str, instance: str) -> bool:
        """Record that the member is alive; False if its row is gone or another instance's."""

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


class CascadeReports(Protocol):
    """The control plane of cascaded clients: children's reports, the global watermark
    and provider switches (``lrq_cascade``, ``lrq_cascade_children``; docs/cascading.md)."""

    def record_cascade_report(
        self,
        client_name: str,
        child_id: str,
        epoch: int,
        local_watermark: int,
        acked_position: int,
        reported_at: float | None = None,
    ) -> bool:
        """Record a child's report (``reported_at`` default: now). No row or a newer epoch:
        the child is adopted (not dropped). The same epoch: its watermark, acknowledged
        position and report time are updated, ``dropped`` stays. An older epoch: refused,
        nothing changes, False. Bad names or negative positions: typed error."""

    def set_global_watermark(self, client_name: str, value: int) -> bool:
        """Store the set's global watermark at this node; False if not cascaded here."""

    def switch_cascade_provider(self, client_name: str, provider_id: str) -> int | None:
        """Make ``provider_id`` this node's provider of the client, epoch + 1; the new
        epoch, or None if the client is not cascaded here. The root has no provider:
        :class:`~lr_client.errors.InvalidInputError`, nothing changes."""


class Cascading(Protocol):
    """A node's cascade rows and the relay of cascaded clients (docs/cascading.md).

    A branch relays client ``C`` of origin ``R`` from its receive queue
    ``LRQ_Recv_<C>__<R>``: log entries in ``seq`` order with their origin
    positions. Its entries stay past delivery until the relay floor passes them."""

    def apply_cascade_config(
        self,
        client_name: str,
        origin_id: str,
        role: str,
        provider_id: str,
        children: Sequence[str] = (),
        nodes: Sequence[str] | None = None,
    ) -> CascadeNode:
        """Apply the configuration of one cascaded client at server start; the row after.

        No row: insert it (epoch 1 with a provider). A configured provider other
        than the one last applied (``config_provider``): switch to it, epoch + 1.
        Otherwise the database's provider stays (a switch made at run time
        survives restarts). ``children`` rows are added if missing (never removed).
        ``nodes`` (the set's nodes but the root), if given, replace those recorded
        for the client (:meth:`SendLog.transmit_route`).
        """

    def cascade_node(self, client_name: str) -> CascadeNode | None:
        """This node's row for ``client_name`` (None: not cascaded here)."""

    def list_cascade_nodes(self) -> list[CascadeNode]:
        """Every cascaded client's row, by client name."""

    def cascade_children(self, client_name: str) -> list[CascadeChild]:
        """The nodes below this one for ``client_name``, by id."""

    def mark_child_dropped(self, client_name: str, child_id: str, dropped: bool = True) -> bool:
        """Mark a child dropped (it leaves the relay floor) or not; False if unknown."""

    def read_relay(
        self,
        client_name: str,
        origin_id: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[SendEntry]:
        """The relayed log entries of (client, origin) after origin position ``after``, in
        order, from the last full sync this node applied on; at most ``limit``, within
        ``max_bytes`` past the first (the byte-cut rule)."""

    def relay_resume_floor(self, client_name: str, origin_id: str) -> int:
        """The lowest origin position a child may resume after: this node holds every
        relayed log entry above it (the relay trim mark, the base of its last full sync)."""

    def relay_delivered_position(
        self, client_name: str, origin_id: str, conn: Connection | None = None
    ) -> int:
        """The origin position of the last entry this node's subscriber delivered from
        (client, origin) (a full sync's base counts); in ``conn`` if given."""

    def relay_floor(self, client_name: str, origin_id: str, extra_floor: int | None = None) -> int:
        """The origin position up to which no node below needs the relayed entries: the
        lowest acknowledged position of the children not dropped, at most
        ``extra_floor`` (the set's global watermark). No child left: the delivered position."""

    def trim_relay(self, client_name: str, origin_id: str, extra_floor: int | None = None) -> int:
        """Release relayed entries delivered here and at or below :meth:`relay_floor`
        (raising the relay trim mark); rows deleted (PostgreSQL: 0, its rotation
        truncates them)."""


__all__ = ["CascadeReports", "Cascading", "Inspection", "Members"]
