from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ReplicationType]
    LOG_ENTRY_SYNC: _ClassVar[ReplicationType]
    SNAPSHOT_SYNC: _ClassVar[ReplicationType]
    LAST_FULL_SYNC_ENTRY: _ClassVar[ReplicationType]
    STREAM_DROPPED: _ClassVar[ReplicationType]

class SnapshotState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SNAPSHOT_NONE: _ClassVar[SnapshotState]
    SNAPSHOT_ONGOING: _ClassVar[SnapshotState]
    SNAPSHOT_COMPLETED: _ClassVar[SnapshotState]

class BatchKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_NONE: _ClassVar[BatchKind]
    BATCH_LOG_ENTRY: _ClassVar[BatchKind]
    BATCH_SNAPSHOT: _ClassVar[BatchKind]
    BATCH_DROP_NOTICE: _ClassVar[BatchKind]
NONE: ReplicationType
LOG_ENTRY_SYNC: ReplicationType
SNAPSHOT_SYNC: ReplicationType
LAST_FULL_SYNC_ENTRY: ReplicationType
STREAM_DROPPED: ReplicationType
SNAPSHOT_NONE: SnapshotState
SNAPSHOT_ONGOING: SnapshotState
SNAPSHOT_COMPLETED: SnapshotState
BATCH_NONE: BatchKind
BATCH_LOG_ENTRY: BatchKind
BATCH_SNAPSHOT: BatchKind
BATCH_DROP_NOTICE: BatchKind

class RoutingTableEntryMsg(_message.Message):
    __slots__ = ("destinations", "type", "opaque_payload", "source_id", "client_name", "snapshot_id", "position", "snapshot_count", "base_position", "partition_key", "origin_time", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OPAQUE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COUNT_FIELD_NUMBER: _ClassVar[int]
    BASE_POSITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    destinations: _containers.RepeatedScalarFieldContainer[str]
    type: ReplicationType
    opaque_payload: bytes
    source_id: str
    client_name: str
    snapshot_id: str
    position: int
    snapshot_count: int
    base_position: int
    partition_key: bytes
    origin_time: float
    headers: _containers.ScalarMap[str, str]
    def __init__(self, destinations: _Optional[_Iterable[str]] = ..., type: _Optional[_Union[ReplicationType, str]] = ..., opaque_payload: _Optional[bytes] = ..., source_id: _Optional[str] = ..., client_name: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., position: _Optional[int] = ..., snapshot_count: _Optional[int] = ..., base_position: _Optional[int] = ..., partition_key: _Optional[bytes] = ..., origin_time: _Optional[float] = ..., headers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClientState(_message.Message):
    __slots__ = ("client_name", "last_position", "snapshot_state", "snapshot_id", "snapshot_position", "origin_id")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_STATE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_POSITION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_ID_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    last_position: int
    snapshot_state: SnapshotState
    snapshot_id: str
    snapshot_position: int
    origin_id: str
    def __init__(self, client_name: _Optional[str] = ..., last_position: _Optional[int] = ..., snapshot_state: _Optional[_Union[SnapshotState, str]] = ..., snapshot_id: _Optional[str] = ..., snapshot_position: _Optional[int] = ..., origin_id: _Optional[str] = ...) -> None: ...

class RelayedClient(_message.Message):
    __slots__ = ("client_name", "origin_id")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_ID_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    origin_id: str
    def __init__(self, client_name: _Optional[str] = ..., origin_id: _Optional[str] = ...) -> None: ...

class NegotiateRequest(_message.Message):
    __slots__ = ("source_id", "clients", "protocol_version", "relays", "codecs")
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELAYS_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    source_id: str
    clients: _containers.RepeatedScalarFieldContainer[str]
    protocol_version: int
    relays: _containers.RepeatedCompositeFieldContainer[RelayedClient]
    codecs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, source_id: _Optional[str] = ..., clients: _Optional[_Iterable[str]] = ..., protocol_version: _Optional[int] = ..., relays: _Optional[_Iterable[_Union[RelayedClient, _Mapping]]] = ..., codecs: _Optional[_Iterable[str]] = ...) -> None: ...

class NegotiateResponse(_message.Message):
    __slots__ = ("sink_id", "clients", "drop_notices", "protocol_version", "codecs", "max_message_bytes")
    SINK_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    DROP_NOTICES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sink_id: str
    clients: _containers.RepeatedCompositeFieldContainer[ClientState]
    drop_notices: bool
    protocol_version: int
    codecs: _containers.RepeatedScalarFieldContainer[str]
    max_message_bytes: int
    def __init__(self, sink_id: _Optional[str] = ..., clients: _Optional[_Iterable[_Union[ClientState, _Mapping]]] = ..., drop_notices: _Optional[bool] = ..., protocol_version: _Optional[int] = ..., codecs: _Optional[_Iterable[str]] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class ReplicationBatch(_message.Message):
    __slots__ = ("batch_id", "source_id", "client_name", "kind", "snapshot_id", "first_position", "last_position", "previous_position", "entries", "lane", "lanes", "low_water", "codec", "compressed", "replay")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_POSITION_FIELD_NUMBER: _ClassVar[int]
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_POSITION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    LOW_WATER_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    source_id: str
    client_name: str
    kind: BatchKind
    snapshot_id: str
    first_position: int
    last_position: int
    previous_position: int
    entries: _containers.RepeatedCompositeFieldContainer[RoutingTableEntryMsg]
    lane: int
    lanes: int
    low_water: int
    codec: str
    compressed: bytes
    replay: bool
    def __init__(self, batch_id: _Optional[int] = ..., source_id: _Optional[str] = ..., client_name: _Optional[str] = ..., kind: _Optional[_Union[BatchKind, str]] = ..., snapshot_id: _Optional[str] = ..., first_position: _Optional[int] = ..., last_position: _Optional[int] = ..., previous_position: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[RoutingTableEntryMsg, _Mapping]]] = ..., lane: _Optional[int] = ..., lanes: _Optional[int] = ..., low_water: _Optional[int] = ..., codec: _Optional[str] = ..., compressed: _Optional[bytes] = ..., replay: _Optional[bool] = ...) -> None: ...

class ReplicationAck(_message.Message):
    __slots__ = ("batch_id", "client_name", "last_position", "duplicate")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    client_name: str
    last_position: int
    duplicate: bool
    def __init__(self, batch_id: _Optional[int] = ..., client_name: _Optional[str] = ..., last_position: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class CascadeReport(_message.Message):
    __slots__ = ("client_name", "origin_id", "node_id", "epoch", "local_watermark", "applied_position")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    APPLIED_POSITION_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    origin_id: str
    node_id: str
    epoch: int
    local_watermark: int
    applied_position: int
    def __init__(self, client_name: _Optional[str] = ..., origin_id: _Optional[str] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., local_watermark: _Optional[int] = ..., applied_position: _Optional[int] = ...) -> None: ...

class CascadeReply(_message.Message):
    __slots__ = ("global_watermark", "role", "provider_id", "epoch")
    GLOBAL_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    global_watermark: int
    role: str
    provider_id: str
    epoch: int
    def __init__(self, global_watermark: _Optional[int] = ..., role: _Optional[str] = ..., provider_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
