"""Routing-queue log replication: the library applications import.

Sender side: :class:`RoutingQueueClient` transmits payloads inside the
application's own transaction. Sink side: :class:`RoutingQueueSubscriber`
delivers them to a :class:`RoutingQueueListener`, exactly once.
"""

from __future__ import annotations

from lr_client.errors import (
    AuthenticationError,
    BackpressureError,
    CascadeRouteError,
    ConfigError,
    DecompressionError,
    DecryptionError,
    EncryptionError,
    FencedError,
    IncompatibleVersionError,
    InvalidDestinationsError,
    InvalidHeadersError,
    InvalidInputError,
    InvalidNameError,
    InvalidPartitionKeyError,
    InvalidPayloadError,
    InvalidSessionError,
    KeyUnavailableError,
    ListenerError,
    LRError,
    NotProviderError,
    PartitionCountError,
    PayloadTooLargeError,
    PermanentError,
    PermissionDeniedError,
    ProtocolError,
    ReceiveQueueFullError,
    SchemaError,
    SnapshotError,
    StoreUnavailableError,
    TransientError,
    TransportError,
    UnknownDestinationError,
    UnsupportedSettingError,
)
from lr_client.failure_policy import FailurePolicy, OnFailure
from lr_client.keys import Keyring
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.partitioners import HashPartitioner, Partitioner, RangePartitioner
from lr_client.records import (
    EntryRef,
    LRMessageWithDestinations,
    ReplicationType,
    SnapshotStatus,
)
from lr_client.sender import DEFAULT_MAX_PAYLOAD_BYTES, Backpressure, RoutingQueueClient
from lr_client.snapshot import SnapshotContext, SnapshotProviderRunner
from lr_client.snapshot_status import SnapshotInfo
from lr_client.store import QueueStore, create_app_tables, create_engine, create_schema, open_store
from lr_client.store.schema.lifecycle import SchemaState, SchemaStatus
from lr_client.subscriber import RoutingQueueSubscriber, SnapshotDelivery

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "AuthenticationError",
    "Backpressure",
    "BackpressureError",
    "CascadeRouteError",
    "ConfigError",
    "DecompressionError",
    "DecryptionError",
    "EncryptionError",
    "EntryRef",
    "FailurePolicy",
    "FencedError",
    "HashPartitioner",
    "IncompatibleVersionError",
    "InvalidDestinationsError",
    "InvalidHeadersError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidPartitionKeyError",
    "InvalidPayloadError",
    "InvalidSessionError",
    "KeyUnavailableError",
    "Keyring",
    "LRError",
    "LRMessageWithDestinations",
    "ListenerError",
    "NotProviderError",
    "OnFailure",
    "PartitionCountError",
    "Partitioner",
    "PayloadTooLargeError",
    "PermanentError",
    "PermissionDeniedError",
    "ProtocolError",
    "QueueStore",
    "RangePartitioner",
    "ReceiveQueueFullError",
    "ReplicationType",
    "RoutingQueueClient",
    "RoutingQueueListener",
    "RoutingQueueMessage",
    "RoutingQueueSubscriber",
    "SchemaError",
    "SchemaState",
    "SchemaStatus",
    "SnapshotContext",
    "SnapshotDelivery",
    "SnapshotError",
    "SnapshotInfo",
    "SnapshotProviderRunner",
    "SnapshotStatus",
    "StoreUnavailableError",
    "TransientError",
    "TransportError",
    "UnknownDestinationError",
    "UnsupportedSettingError",
    "__version__",
    "create_app_tables",
    "create_engine",
    "create_schema",
    "open_store",
]
