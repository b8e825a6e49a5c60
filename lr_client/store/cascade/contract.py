"""The cascade's roles: a node's place in cascaded clients, relays, children's reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    CascadeChild,
    CascadeNode,
    SendEntry,
)


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


__all__ = ["CascadeReports", "Cascading"]
