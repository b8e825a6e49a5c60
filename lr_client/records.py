"""Plain records exchanged between the store, the sessions and applications."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from lr_client.cascade_roles import CascadeRole
from lr_client.entry_checks import MAX_PARTITION_KEY_BYTES as MAX_PARTITION_KEY_BYTES
from lr_client.entry_checks import check_partition_key as check_partition_key
from lr_client.entry_checks import check_payload as check_payload


class ReplicationType(enum.IntEnum):
    """Why an entry exists (same values as the protobuf enum)."""

    NONE = 0
    LOG_ENTRY_SYNC = 1
    SNAPSHOT_SYNC = 2
    LAST_FULL_SYNC_ENTRY = 3
    STREAM_DROPPED = 4  # a drop notice: entries from its position on may be missing


#: Every type by its value: what rows or messages read in bulk look their type up in
#: (an index per row instead of an enum call).
TYPES_BY_VALUE: Mapping[int, ReplicationType] = {int(t): t for t in ReplicationType}
#: The types of a full sync's entries: its rows and its end marker.
SNAPSHOT_TYPES = frozenset({ReplicationType.SNAPSHOT_SYNC, ReplicationType.LAST_FULL_SYNC_ENTRY})


class SnapshotStatus(enum.StrEnum):
    """Lifecycle of a snapshot request on the source."""

    REQUESTED = "requested"  # recorded; no provider has started
    RUNNING = "running"  # a provider is writing entries
    READY = "ready"  # the end marker is written; the session may ship it
    COMPLETED = "completed"  # the sink has everything; log entries resumed
    CANCELLED = "cancelled"  # superseded or cancelled: never delivered
    FAILED = "failed"  # the provider failed; a new request will follow

    @property
    def is_open(self) -> bool:
        """Whether a request in this state may still be shipped (requested, running, ready)."""
        return self in OPEN_SNAPSHOT_STATUSES


#: A request in one of these is open: it may still be shipped (at most one per stream).
OPEN_SNAPSHOT_STATUSES = (SnapshotStatus.REQUESTED, SnapshotStatus.RUNNING, SnapshotStatus.READY)


#: An entry to append to the send log: (payload, destination site numbers[, partition key
#: [, headers in their stored form (:func:`lr_client.headers.encode_headers`)]]).
NewLogEntry = (
    tuple[bytes, Sequence[int]]
    | tuple[bytes, Sequence[int], bytes | None]
    | tuple[bytes, Sequence[int], bytes | None, bytes | None]
)


def new_entry_key(entry: NewLogEntry) -> bytes | None:
    """The partition key of an entry to append (None: none)."""
    return entry[2] if len(entry) > 2 else None


def new_entry_headers(entry: NewLogEntry) -> bytes | None:
    """The stored headers of an entry to append (None: none)."""
    return entry[3] if len(entry) > 3 else None


class SinkSnapshotState(enum.IntEnum):
    """Snapshot state of one (source, client) on the sink."""

    NONE = 0
    ONGOING = 1
    COMPLETED = 2


@dataclass(frozen=True, slots=True)
class LRMessageWithDestinations:
    """One payload, the sites it must reach, its partition key and its headers (None: none)."""

    payload: bytes
    destinations: list[str] | tuple[str, ...]
    key: bytes | str | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class EntryRef:
    """A transmitted entry, as its transaction wrote it.

    Positions are given in commit order, so on PostgreSQL an entry has none
    until its transaction has committed and been sequenced (``position`` is
    None; ``Sender.positions_of`` waits for it). On SQLite writers commit one
    at a time and the position is known at once. ``txid`` (the transaction)
    and ``ord`` (the entry's ordinal in it) name the entry until then.
    """

    txid: int
    ord: int
    position: int | None = None


@dataclass(frozen=True, slots=True)
class SendEntry:
    """An entry of a send queue as a sender session reads it."""

    position: int
    client_name: str
    type: ReplicationType
    payload: bytes
    destinations: tuple[str, ...] = ()
    snapshot_id: str = ""
    created_at: float = 0.0
    key: bytes | None = None  # the partition key (None: none)
    headers: bytes | None = None  # stored form (lr_client.headers; None: none)


@dataclass(frozen=True, slots=True)
class WireEntry:
    """An entry as it travels to a sink (destinations stripped)."""

    position: int
    type: ReplicationType
    payload: bytes
    snapshot_id: str = ""
    snapshot_count: int = 0
    base_position: int = 0
    key: bytes | None = None  # the partition key (None: none)
    #: A cascaded client's origin transmit time (0: none); a receive queue keeps it as
    #: the entry's ``received_at``, so a branch relays it unchanged.
    origin_time: float = 0.0
    headers: bytes | None = None  # stored form (lr_client.headers; None: none)


@dataclass(frozen=True, slots=True)
class RecvEntry:
    """An entry of a receive queue ``LRQ_Recv_<client>__<source>``."""

    seq: int
    queue_id: int
    source_id: str
    client_name: str
    source_position: int
    type: ReplicationType
    payload: bytes
    snapshot_id: str = ""
    snapshot_count: int = 0
    key: bytes | None = None  # the partition key (None: none)
    headers: bytes | None = None  # stored form (lr_client.headers; None: none)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A registered receive queue."""

    queue_id: int
    queue_name: str
    client_name: str
    source_id: str


@dataclass(frozen=True, slots=True)
class QueueSlot:
    """One slot (a partition retired whole by TRUNCATE) of a PostgreSQL queue, for status."""

    queue: str  # "send" or "receive"
    slot: int
    current: bool  # new rows go here
    entries: int  # rows stored, delivered or not
    bytes: int  # on disk, with indexes (the send queue: all its slot's partitions)


@dataclass(frozen=True, slots=True)
class SinkProgress:
    """What a sink has durably received from one (source, client)."""

    source_id: str
    client_name: str
    last_position: int = 0
    snapshot_state: SinkSnapshotState = SinkSnapshotState.NONE
    snapshot_id: str = ""
    snapshot_position: int = 0
    entries_received: int = 0
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """A full-sync request of one client: one destination's view of a shared snapshot."""

    snapshot_id: str
    destination: str
    client_name: str
    status: SnapshotStatus
    base_position: int | None = None
    reason: str = ""
    rows_written: int = 0
    entry_count: int | None = None
    shipped_position: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    #: Every destination the snapshot serves that has not finished with it,
    #: in the order they joined (the snapshot is written once for them all).
    destinations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a destination has acknowledged one client's log entries."""

    destination: str
    client_name: str
    position: int = 0
    acked_at: float = 0.0
    needs_snapshot: bool = False


@dataclass(frozen=True, slots=True)
class DropRecord:
    """A destination dropped for falling too far behind (the seeds' DropData)."""

    destination: str
    client_name: str
    first_dropped_position: int
    dropped_at: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StreamStop:
    """A stream stopped because the sink lacks entries the source no longer holds."""

    destination: str
    client_name: str
    reason: str
    resume_after: int  # where log entries resume once an operator accepts the loss
    stopped_at: float
    accepted_at: float | None = None
    accepted_through: int | None = None  # the trim mark when the loss was accepted
    resumed_at: float | None = None  # the stream runs again: only a record now

    @property
    def is_stopped(self) -> bool:
        return self.accepted_at is None


@dataclass(frozen=True, slots=True)
class SinkDrop:
    """The last drop notice a sink received from one (source, client)."""

    source_id: str
    client_name: str
    notice_id: str
    first_dropped_position: int
    reason: str
    received_at: float


@dataclass(frozen=True, slots=True)
class Backlog:
    """Unacknowledged log entries of one (destination, client)."""

    destination: str
    client_name: str
    entries: int = 0
    bytes: int = 0
    oldest_created_at: float | None = None


class LogRange(list[SendEntry]):
    """Entries of one read, and whether the read reached the end of the queue."""

    def __init__(self, entries: Iterable[SendEntry], complete: bool) -> None:
        super().__init__(entries)
        self.complete = complete


@dataclass(frozen=True, slots=True)
class SubscriberState:
    """Delivery state of one receive queue."""

    queue_id: int
    snapshot_id: str = ""  # the snapshot whose start callback was issued last
    in_snapshot: bool = False  # started and not yet ended
    delivered: int = 0  # entries delivered to the listener so far
    lease_owner: str = ""
    lease_expires: float = 0.0
    #: Every entry with ``seq <= delivered_seq`` was delivered (or passed); reads see those above.
    delivered_seq: int = 0
    #: The partition count the queue is delivered with (0: not by partition).
    partitions: int = 0


class HeadEntry(NamedTuple):
    """An entry at the head of a receive queue (what delivery needs of it)."""

    seq: int
    type: ReplicationType
    source_position: int
    snapshot_id: str
    payload: bytes
    base_position: int | None = None  # a snapshot entry's: its snapshot's base, if sent
    key: bytes | None = None  # the partition key (None: none)
    headers: bytes | None = None  # stored form (lr_client.headers; None: none)
    received_at: float = 0.0  # when the sink stored it (a relayed entry: its origin's transmit)


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """An entry as a queue stores it (``lr browse``): ``payload`` is only its first bytes
    (``BROWSE_HEAD_BYTES``), ``size`` the whole payload's. ``position`` is the source
    position (receive queues: the entry's), ``seq`` a receive queue's own order.
    """

    position: int
    type: int  # the stored integer
    client_name: str
    payload: bytes
    size: int
    destinations: tuple[str, ...] = ()
    snapshot_id: str = ""
    created_at: float | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """A unit's lease as its owner holds it: writes for the unit carry it.

    A write made with a fence whose token is no longer the unit's (another
    member took the unit over) matches nothing and raises
    :class:`~lr_client.errors.FencedError`.
    """

    unit: str
    owner: str  # the owning member's instance
    token: int


@dataclass(frozen=True, slots=True)
class Member:
    """One ``lr server`` process of a site, as registered in its database."""

    member_id: str
    instance: str
    address: str
    weight: int
    joined_at: float
    heartbeat_at: float
    alive: bool = True  # heartbeat within the lease timeout (as of the read)


@dataclass(frozen=True, slots=True)
class UnitLease:
    """Who owns one unit of work (``owner`` None: released) and its fencing token."""

    unit: str
    owner: str | None
    member_id: str
    token: int
    acquired_at: float


@dataclass(frozen=True, slots=True)
class CascadeNode:
    """This node's place in one cascaded client's set (a ``lrq_cascade`` row)."""

    client_name: str
    origin_id: str  # the root of the set: relayed entries keep its id and positions
    role: CascadeRole
    provider_id: str = ""  # the node this one receives the client from ("" at the root)
    epoch: int = 0  # raised by every provider switch
    config_provider: str = ""  # the provider the configuration named when last applied
    global_watermark: int = 0
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class CascadeRoute:
    """Where a cascaded client's entries may be transmitted, as this node's database knows it."""

    origin_id: str  # the root: the one node whose application transmits the client
    role: CascadeRole  # this node's role
    nodes: tuple[str, ...] | None = None  # the set's nodes but the root (None: not recorded)


@dataclass(frozen=True, slots=True)
class CascadeChild:
    """A node below this one for a cascaded client (a ``lrq_cascade_children`` row)."""

    client_name: str
    child_id: str
    epoch: int = 0
    local_watermark: int = 0
    acked_position: int = 0
    reported_at: float = 0.0
    dropped: bool = False
