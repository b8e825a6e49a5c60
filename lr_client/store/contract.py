"""The queue store contract, split by role: what each caller needs of the store.

A store *has* its roles: ``store.send`` (:class:`SendLog`), ``store.shipping``
(:class:`Shipping`), ``store.recv`` (:class:`Receiving`), ... Callers use the roles
they play; only a site's assembly sees the whole :class:`QueueStore`, which is what
:func:`~lr_client.store.open_store` returns. Methods that take a ``conn`` run inside
the caller's transaction (the application's, or a subscriber's, from
:class:`Transactions`) and commit or roll back with it; the others run their own
short transactions.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from sqlalchemy.engine import Connection

from lr_client.store.cascade.contract import CascadeReports, Cascading
from lr_client.store.cluster.contract import Members, Sites
from lr_client.store.ops.contract import Inspection, StageLatencies
from lr_client.store.recv.contract import (
    QueueHeads,
    QueuePartitions,
    Receiving,
    SubscriberQueues,
)
from lr_client.store.recv.replay_contract import Replays
from lr_client.store.retention.contract import Retention
from lr_client.store.schema.lifecycle import SchemaStatus
from lr_client.store.send.contract import SendLog, Shipping
from lr_client.store.snapshots.contract import SnapshotEntries, SnapshotRequests


class Transactions(Protocol):
    """The store's own transactions, for the methods that take a ``conn``."""

    def write(self, consistent: bool = False) -> AbstractContextManager[Connection]:
        """A read-write transaction on the store's connection, in the caller's scope."""

    def read(self) -> AbstractContextManager[Connection]:
        """A read-only transaction."""

    def read_statements(self) -> AbstractContextManager[Connection]:
        """Reads that need no snapshot across their statements: each sees at least what
        was committed before the block began. PostgreSQL: no transaction (no ``BEGIN``
        and ``COMMIT`` round trips), each statement what was committed before it began;
        SQLite: :meth:`read`, one snapshot."""

    def late_write(
        self, turn: AbstractContextManager[object]
    ) -> AbstractContextManager[Connection]:
        """A read-write transaction that takes the write lock at its first statement
        (after ``turn``, a lock of the process's writers), not at BEGIN (SQLite)."""

    def pinned(self) -> AbstractContextManager[None]:
        """Run the calling thread's transactions on one connection of its own until the
        block ends (a worker running transactions back to back)."""


class DeliveryStore(Transactions, Protocol):
    """What a subscriber needs: transactions and the receive queues' roles."""

    @property
    def single_writer(self) -> bool:
        """Whether one transaction at a time writes (SQLite): partitions then take turns."""

    #: Receive queues, their state and leases (:class:`SubscriberQueues`).
    queues: SubscriberQueues
    #: The oldest undelivered entries of a receive queue (:class:`QueueHeads`).
    heads: QueueHeads
    #: Delivery by partition (:class:`QueuePartitions`).
    partitions: QueuePartitions
    #: Where the applied stage's latency is written (:class:`StageLatencies`).
    latency: StageLatencies

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade every table (idempotent); the schema's status before."""


class SnapshotStore(Transactions, Protocol):
    """What a snapshot provider needs: transactions, requests and the snapshot queue."""

    #: Snapshot requests (:class:`SnapshotRequests`).
    snapshots: SnapshotRequests
    #: The snapshot queue (:class:`SnapshotEntries`).
    snapshot_entries: SnapshotEntries


class QueueStore(Transactions, Protocol):
    """A site's store: its transactions, its schema, and an object per role."""

    @property
    def dialect(self) -> str:
        """The backend: ``"sqlite"`` or ``"postgresql"``."""

    @property
    def single_writer(self) -> bool:
        """Whether one transaction at a time writes (SQLite): partitions then take turns."""

    #: The sites this database knows (:class:`Sites`).
    sites: Sites
    #: The application's transmit path (:class:`SendLog`).
    send: SendLog
    #: A sender session's reads and cursors (:class:`Shipping`).
    shipping: Shipping
    #: Trim, drop and stop records, flow control (:class:`Retention`).
    retention: Retention
    #: Snapshot requests (:class:`SnapshotRequests`).
    snapshots: SnapshotRequests
    #: The snapshot queue (:class:`SnapshotEntries`).
    snapshot_entries: SnapshotEntries
    #: A sink's receiver (:class:`Receiving`).
    recv: Receiving
    #: Replay requests and rewinds (:class:`Replays`).
    replays: Replays
    #: Receive queues, their state and leases (:class:`SubscriberQueues`).
    queues: SubscriberQueues
    #: The oldest undelivered entries of a receive queue (:class:`QueueHeads`).
    heads: QueueHeads
    #: Delivery by partition (:class:`QueuePartitions`).
    partitions: QueuePartitions
    #: Read-only views and status rows (:class:`Inspection`).
    inspection: Inspection
    #: The members serving the site (:class:`Members`).
    members: Members
    #: Children's cascade reports (:class:`CascadeReports`).
    cascade_reports: CascadeReports
    #: This node's place in cascaded clients (:class:`Cascading`).
    cascade: Cascading
    #: Per-stage latency of the hops through this site (:class:`StageLatencies`).
    latency: StageLatencies

    def create_schema(self) -> SchemaStatus:
        """Create or upgrade every table (idempotent); the schema's status before."""

    def check_schema(self) -> None:
        """Raise :class:`~lr_client.errors.SchemaError` unless the schema is ours and current."""

    def schema_status(self) -> SchemaStatus:
        """Where the database's schema stands against this version's."""

    def close(self) -> None:
        """Close the store's connections (again: a no-op); a later call reconnects."""


__all__ = [
    "CascadeReports",
    "Cascading",
    "DeliveryStore",
    "Inspection",
    "Members",
    "QueueHeads",
    "QueuePartitions",
    "QueueStore",
    "Receiving",
    "Replays",
    "Retention",
    "SendLog",
    "Shipping",
    "Sites",
    "SnapshotEntries",
    "SnapshotRequests",
    "SnapshotStore",
    "StageLatencies",
    "SubscriberQueues",
    "Transactions",
]
