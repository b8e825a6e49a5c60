"""The SQLAlchemy queue store: a core (engine, transactions, dialect hooks) and an
object for each role, composed here and nowhere else.

Each role of :mod:`lr_client.store.contract` is a class of its own holding the
core; the dialect-specific pieces (commit-ordered positions, the tag index,
upserts, bulk writes) are the hooks of :class:`~lr_client.store.core.StoreCore`
that :mod:`lr_client.store.sqlite` and :mod:`lr_client.store.postgres` fill in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from lr_client.store import contract as c
from lr_client.store.cascade.children import CascadeReportsStore
from lr_client.store.cascade.nodes import CascadeStore
from lr_client.store.cluster.members import MembersStore
from lr_client.store.cluster.sites import SitesStore
from lr_client.store.core import StoreCore
from lr_client.store.moved import forward
from lr_client.store.ops.inspection import InspectionStore
from lr_client.store.ops.latency import StageLatencyStore
from lr_client.store.recv.heads import QueueHeadsStore
from lr_client.store.recv.partitions import SubscriberPartitionsStore
from lr_client.store.recv.queues import SubscriberQueuesStore
from lr_client.store.recv.receiving import ReceivingStore
from lr_client.store.recv.replays import ReplaysStore
from lr_client.store.retention.store import RetentionStore
from lr_client.store.schema import lifecycle
from lr_client.store.schema.lifecycle import SchemaStatus
from lr_client.store.send.log import SendLogStore
from lr_client.store.send.shipping import ShippingStore
from lr_client.store.snapshots.entries import SnapshotEntriesStore
from lr_client.store.snapshots.requests import SnapshotRequestsStore


class SQLAlchemyQueueStore:
    """A site's queue store: transactions and the schema here, the rest by role
    (``store.send``, ``store.recv``, ...); use :func:`lr_client.store.open_store`."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        recv = ReceivingStore(core)
        requests = SnapshotRequestsStore(core)
        self.sites: c.Sites = SitesStore(core)
        self.send: c.SendLog = SendLogStore(core)
        self.shipping: c.Shipping = ShippingStore(core)
        self.retention: c.Retention = RetentionStore(core)
        self.snapshots: c.SnapshotRequests = requests
        self.snapshot_entries: c.SnapshotEntries = SnapshotEntriesStore(core, requests)
        self.recv: c.Receiving = recv
        self.replays: c.Replays = ReplaysStore(core, recv)
        self.queues: c.SubscriberQueues = SubscriberQueuesStore(core)
        self.heads: c.QueueHeads = QueueHeadsStore(core)
        self.partitions: c.QueuePartitions = SubscriberPartitionsStore(core)
        self.inspection: c.Inspection = InspectionStore(core)
        self.members: c.Members = MembersStore(core)
        self.cascade_reports: c.CascadeReports = CascadeReportsStore(core)
        self.cascade: c.Cascading = CascadeStore(core)
        self.latency: c.StageLatencies = StageLatencyStore(core)

    @property
    def engine(self) -> Engine:
        return self.core.engine

    @property
    def dialect(self) -> str:
        return self.core.dialect

    @property
    def single_writer(self) -> bool:
        return self.core.single_writer

    # -- transactions ---------------------------------------------------------------------
    def write(self, consistent: bool = False) -> AbstractContextManager[Connection]:
        return self.core.write(consistent)

    def read(self) -> AbstractContextManager[Connection]:
        return self.core.read()

    def read_statements(self) -> AbstractContextManager[Connection]:
        return self.core.read_statements()

    def late_write(
        self, turn: AbstractContextManager[object]
    ) -> AbstractContextManager[Connection]:
        return self.core.late_write(turn)

    @contextmanager
    def pinned(self) -> Iterator[None]:
        with self.core.pinned():
            yield

    if not TYPE_CHECKING:  # the type checker sees only the roles

        def __getattr__(self, name: str) -> Any:
            """A method from before the roles (``store.trim``): forwarded, with a warning."""
            return forward(self, name)

    # -- the schema and the connections ---------------------------------------------------
    def create_schema(self) -> SchemaStatus:
        """Create or upgrade the schema (concurrency-safe; see :mod:`lifecycle`)."""
        return lifecycle.upgrade_schema(self.core.engine)

    def check_schema(self) -> None:
        lifecycle.require_current(self.core.engine)

    def schema_status(self) -> SchemaStatus:
        return lifecycle.schema_status(self.core.engine)

    def close(self) -> None:
        """Close the store's connections (the engine's pool); the store can reconnect."""
        self.core.engine.dispose()


__all__ = ["SQLAlchemyQueueStore"]


def _conforms(store: SQLAlchemyQueueStore) -> c.QueueStore:
    return store  # mypy checks the assembly against the contract here
