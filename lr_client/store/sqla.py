"""The SQLAlchemy queue store: every role's implementation over one engine.

Each role of :mod:`lr_client.store.contract` is a mixin in a module of its
own; the dialect-specific pieces (commit-ordered positions, the tag index,
upserts, bulk writes) are the hooks of :class:`~lr_client.store.base.StoreBase`
that :mod:`lr_client.store.sqlite` and :mod:`lr_client.store.postgres` fill in.
"""

from __future__ import annotations

from lr_client.store.cascade import CascadeStore
from lr_client.store.cascade_children import CascadeReportsStore
from lr_client.store.inspection import InspectionStore
from lr_client.store.latency import StageLatencyStore
from lr_client.store.members import MembersStore
from lr_client.store.queue_sizes import QueueSizesStore
from lr_client.store.receiving import ReceivingStore
from lr_client.store.replays import ReplaysStore
from lr_client.store.retention import RetentionStore
from lr_client.store.send_log import SendLogStore
from lr_client.store.shipping import ShippingStore
from lr_client.store.sites import SitesStore
from lr_client.store.snapshot_entries import SnapshotsStore
from lr_client.store.subscriber_partitions import SubscriberPartitionsStore
from lr_client.store.subscriber_queues import SubscriberQueuesStore


class SQLAlchemyQueueStore(
    SitesStore,
    SendLogStore,
    ShippingStore,
    SnapshotsStore,
    RetentionStore,
    ReplaysStore,
    ReceivingStore,
    SubscriberQueuesStore,
    QueueSizesStore,
    SubscriberPartitionsStore,
    InspectionStore,
    MembersStore,
    CascadeReportsStore,
    CascadeStore,
    StageLatencyStore,
):
    """Every role in one store; use :func:`lr_client.store.open_store`."""


__all__ = ["SQLAlchemyQueueStore"]
