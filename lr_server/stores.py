"""What each part of the server needs of the store, by role: the one place naming
which roles a component uses (the site's assembly alone holds the whole store).
"""

from __future__ import annotations

from typing import Protocol

from lr_client.store import (
    Cascading,
    Inspection,
    Receiving,
    Replays,
    Retention,
    SendLog,
    Shipping,
    Sites,
    SnapshotEntries,
    StageLatencies,
    Transactions,
)
from lr_client.store import SnapshotRequests as SnapshotRequestRole


class SessionStore(Transactions, Protocol):
    """What a sender session needs of the store: reads and cursors, snapshots, the
    records of dropped and stopped streams, its status row, and for cascaded
    clients the relay reads and what this node received of them."""

    shipping: Shipping
    snapshots: SnapshotRequestRole
    snapshot_entries: SnapshotEntries
    retention: Retention
    inspection: Inspection
    cascade: Cascading
    recv: Receiving
    replays: Replays
    latency: StageLatencies


class ShipperStore(Transactions, Protocol):
    """What it needs of the store: log reads, open snapshots, their entries, drop records,
    relay reads."""

    shipping: Shipping
    snapshots: SnapshotRequestRole
    snapshot_entries: SnapshotEntries
    retention: Retention
    cascade: Cascading


class SendCheckStore(Protocol):
    """What the look-up before a send needs of the store: open full syncs and drops."""

    snapshots: SnapshotRequestRole


class BoardStore(Protocol):
    """What the board of requests reads: open full syncs, drop records, open replays."""

    snapshots: SnapshotRequestRole
    retention: Retention
    replays: Replays


class RequestStore(Transactions, Protocol):
    """What it needs of the store: snapshot requests, drop records, cursors (and the
    open replays, read with the requests it checks)."""

    snapshots: SnapshotRequestRole
    snapshot_entries: SnapshotEntries
    retention: Retention
    shipping: Shipping
    replays: Replays


class ResumeStore(Transactions, Protocol):
    """What the resume plan needs of the store: cursors, trim marks, drop and stop
    records, the head, what this node received of relayed clients, full syncs."""

    shipping: Shipping
    snapshots: SnapshotRequestRole
    retention: Retention
    inspection: Inspection
    cascade: Cascading
    recv: Receiving


class AckStore(Transactions, Protocol):
    """What acknowledgements need of the store: cursors, the progress of full syncs."""

    shipping: Shipping
    snapshots: SnapshotRequestRole


class StatusStore(Protocol):
    """What a session's status row needs of the store: the row's write, the stages' latency."""

    inspection: Inspection
    latency: StageLatencies


class StopStore(Transactions, Protocol):
    """What it needs of the store: stream stops, drop records, cursors."""

    retention: Retention
    shipping: Shipping


class ReplayStore(Transactions, Protocol):
    """What it needs of the store: log reads, cursors, trim marks, replay requests."""

    shipping: Shipping
    retention: Retention
    replays: Replays


class ReceiverStore(Transactions, Protocol):
    """What the receiver needs of the store: receive queues, cascade rows, replays."""

    recv: Receiving
    cascade: Cascading
    replays: Replays


class BrowseStore(Transactions, Protocol):
    """What the queue listing needs: the queues' sizes and the sites (their tags)."""

    inspection: Inspection
    sites: Sites


class PolicyStore(Transactions, Protocol):
    """What the policy needs of the store: retention, backlogs, the flow state it sets,
    the open snapshots."""

    retention: Retention
    shipping: Shipping
    send: SendLog
    snapshots: SnapshotRequestRole
    snapshot_entries: SnapshotEntries


__all__ = [
    "AckStore",
    "BoardStore",
    "BrowseStore",
    "PolicyStore",
    "ReceiverStore",
    "ReplayStore",
    "RequestStore",
    "ResumeStore",
    "SendCheckStore",
    "SessionStore",
    "ShipperStore",
    "StatusStore",
    "StopStore",
]
