"""The control plane of cascaded clients: reports up, the global watermark down.

Every node but the root reports each cascaded client to its provider (the
``Cascade`` call) every ``replication.cascade_report_interval`` seconds: its
local watermark, its delivered position and its provider epoch. The provider
records the report in ``lrq_cascade_children`` and replies with the set's
global watermark, which the node stores (``lrq_cascade.global_watermark``);
the root computes it from its children's reports. See
:mod:`lr_server.cascade.watermarks` for the rules and docs/cascading.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from lr_client._proto import replication_pb2 as pb
from lr_client.cascade_roles import CascadeRole
from lr_client.errors import LRError, PermissionDeniedError, ProtocolError, TransportError
from lr_server import metrics
from lr_server.cascade import watermarks
from lr_server.config import SiteConfig

if TYPE_CHECKING:
    from lr_client.records import CascadeChild, CascadeNode
    from lr_client.store import QueueStore

log = logging.getLogger("lr.cascade")

#: Sends one report to a provider: (provider id, report) -> reply.
ReportSender = Callable[[str, pb.CascadeReport], pb.CascadeReply]


def child_reports(
    children: list[CascadeChild], dropped_streams: frozenset[str] = frozenset()
) -> list[watermarks.ChildReport]:
    """The store's children rows as the watermark rules see them (0: never reported). A
    child in ``dropped_streams`` (its stream of the client was dropped by retention: it
    will get a full sync) counts as dropped, though its row is not marked."""
    return [
        watermarks.ChildReport(
            c.child_id,
            c.epoch,
            c.local_watermark,
            c.acked_position,
            c.reported_at if c.reported_at > 0 else None,
            c.dropped or c.child_id in dropped_streams,
        )
        for c in children
    ]


def children_of(store: QueueStore, client_name: str) -> list[watermarks.ChildReport]:
    """This node's children of ``client_name``, with the retention drops of their streams."""
    drops = frozenset(
        d.destination for d in store.retention.list_drops() if d.client_name == client_name
    )
    return child_reports(store.cascade.cascade_children(client_name), drops)


def delivered_position(store: QueueStore, node: CascadeNode) -> int:
    """This node's own position of the client: the root's head; a branch's delivered
    origin position (at most what it received); a leaf's received position (what it
    received and has not delivered waits in its own queue: it needs only what follows)."""
    if node.role == CascadeRole.ROOT:
        return store.send.head_position()
    received = store.recv.sink_progress(node.origin_id, node.client_name).last_position
    if node.role == CascadeRole.BRANCH:
        return min(
            received, store.cascade.relay_delivered_position(node.client_name, node.origin_id)
        )
    return received


def node_watermarks(
    store: QueueStore, node: CascadeNode, grace: float, now: float | None = None
) -> tuple[int, int]:
    """(local watermark, delivered position) of this node for ``node``'s client; at the
    root the local watermark is the global watermark."""
    now = time.time() if now is None else now
    delivered = delivered_position(store, node)
    children = children_of(store, node.client_name)
    if node.role == CascadeRole.ROOT:
        return watermarks.global_watermark(delivered, children, now, grace), delivered
    return watermarks.local_watermark(delivered, children, now, grace), delivered


def branch_floor(store: QueueStore, config: SiteConfig, client_name: str) -> int | None:
    """The bound this node's relay floor of ``client_name`` must not pass (see
    :func:`lr_server.cascade.watermarks.relay_floor`: the global watermark it was told, its own
    delivered position, what the children that count still need); None unless this node
    is a branch of the client."""
    node = store.cascade.cascade_node(client_name)
    if node is None or node.role != CascadeRole.BRANCH:
        return None
    children = children_of(store, client_name)
    return watermarks.relay_floor(
        node.global_watermark,
        delivered_position(store, node),
        children,
        time.time(),
        config.replication.cascade_grace,
    )


def make_report(
    store: QueueStore, node_id: str, node: CascadeNode, grace: float
) -> pb.CascadeReport:
    """This node's report of ``node``'s client to its provider."""
    local, delivered = node_watermarks(store, node, grace)
    return pb.CascadeReport(
        client_name=node.client_name,
        origin_id=node.origin_id,
        node_id=node_id,
        epoch=node.epoch,
        local_watermark=local,
        applied_position=delivered,
    )


def serve_report(
    store: QueueStore, config: SiteConfig, caller: str, report: pb.CascadeReport
) -> pb.CascadeReply:
    """The provider's side of ``Cascade``: check, record, reply with the global watermark.

    The caller (already authenticated as a source) must be the reporting node, a node of
    the client's set other than this one; this node must carry the client and be its
    root or a node that can provide (not the caller's descendant is the caller's
    concern). A report of an older epoch than the one recorded is refused.
    """
    client, origin = report.client_name, report.origin_id
    if caller != report.node_id:
        raise PermissionDeniedError(f"{caller} cannot report as {report.node_id!r}")
    cascade = config.cascade(client)
    node = store.cascade.cascade_node(client)
    if cascade is None or node is None:
        raise ProtocolError(f"{client!r} is not a cascaded client of {config.id}")
    if origin != node.origin_id:
        raise ProtocolError(f"{client!r} has origin {node.origin_id} here, not {origin!r}")
    if caller not in cascade.nodes or caller == config.id:
        raise PermissionDeniedError(f"{caller} is not a node of the set of {client!r}")
    if not store.cascade_reports.record_cascade_report(
        client, caller, report.epoch, report.local_watermark, report.applied_position
    ):
        current = next(
            (c.epoch for c in store.cascade.cascade_children(client) if c.child_id == caller), 0
        )
        raise ProtocolError(
            f"{caller} reported {client!r} at epoch {report.epoch}; {config.id} has it at "
            f"epoch {current}"
        )
    grace = config.replication.cascade_grace
    if node.role == CascadeRole.ROOT:
        global_wm, _ = node_watermarks(store, node, grace)
        store.cascade_reports.set_global_watermark(client, global_wm)
    else:
        global_wm = node.global_watermark
    accepted = next(c.epoch for c in store.cascade.cascade_children(client) if c.child_id == caller)
    return pb.CascadeReply(
        global_watermark=global_wm, role=node.role, provider_id=config.id, epoch=accepted
    )


def report_once(
    store: QueueStore, config: SiteConfig, send: ReportSender, node: CascadeNode
) -> int | None:
    """Report ``node``'s client to its provider and store the reply's global watermark
    (the root computes its own); the global watermark, or None if the call failed."""
    grace = config.replication.cascade_grace
    if node.role == CascadeRole.ROOT:
        global_wm, _ = node_watermarks(store, node, grace)
        store.cascade_reports.set_global_watermark(node.client_name, global_wm)
        metrics.CASCADE_WATERMARK.labels(node.client_name, "global").set(global_wm)
        metrics.CASCADE_WATERMARK.labels(node.client_name, "local").set(global_wm)
        return global_wm
    report = make_report(store, config.id, node, grace)
    metrics.CASCADE_WATERMARK.labels(node.client_name, "local").set(report.local_watermark)
    try:
        reply = send(node.provider_id, report)
    except LRError as exc:
        log.warning(
            "cascade report of %s to %s failed: %s", node.client_name, node.provider_id, exc
        )
        return None
    store.cascade_reports.set_global_watermark(node.client_name, reply.global_watermark)
    metrics.CASCADE_WATERMARK.labels(node.client_name, "global").set(reply.global_watermark)
    return int(reply.global_watermark)


def grpc_sender(config: SiteConfig, timeout: float = 10.0) -> ReportSender:
    """Sends reports over gRPC to the provider's ``[[sources]]`` address."""
    from lr_server.transport.grpc_client import call_cascade

    def send(provider_id: str, report: pb.CascadeReport) -> pb.CascadeReply:
        source = config.source(provider_id)
        if source is None or not source.address:
            raise TransportError(
                f"no address of {provider_id} to report {report.client_name} to "
                "(its [[sources]] entry needs address)"
            )
        return call_cascade(config.id, source, config.security, report, timeout)

    return send


class CascadeReporter:
    """Every ``cascade_report_interval`` seconds, report every cascaded client."""

    def __init__(self, store: QueueStore, config: SiteConfig, send: ReportSender) -> None:
        self.store = store
        self.config = config
        self.send = send

    def run_once(self) -> None:
        """One round: a report (or the root's computation) per cascaded client."""
        for node in self.store.cascade.list_cascade_nodes():
            report_once(self.store, self.config, self.send, node)

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set (a thread of ``lr server``)."""
        while True:
            try:
                self.run_once()
            except LRError as exc:
                log.warning("cascade reports: %s", exc)
            if stop.wait(self.config.replication.cascade_report_interval):
                return


__all__ = [
    "CascadeReporter",
    "ReportSender",
    "branch_floor",
    "child_reports",
    "children_of",
    "delivered_position",
    "grpc_sender",
    "make_report",
    "node_watermarks",
    "report_once",
    "serve_report",
]
