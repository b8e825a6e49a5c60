"""Part of the queue store contract, split by role: what each caller needs of the store.

Callers type against the role(s) they play (:class:`Shipping` for a sender session's
reads, :class:`Receiving` for a sink's receiver, :class:`Replays` for ``lr replay``, ...);
:class:`QueueStore` combines them all and is what :func:`~lr_client.store.open_store`
returns. Methods that take a ``conn`` run inside the caller's transaction (the
application's, or a subscriber's) and commit or roll back with it; the others run their
own short transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy.engine import Connection

from lr_client.records import (
    HeadEntry,
    QueueInfo,
    RecvEntry,
    SinkDrop,
    SinkProgress,
    SubscriberState,
    WireEntry,
)
from lr_client.store.watches import Watch


class Receiving(Protocol):
    """A sink's receiver: batches appended to receive queues exactly once."""

    #: Whether appends wake the subscribers at commit (where the backend can).
    notify_arrivals: bool

    def apply_log_batch(
        self,
        source_id: str,
        client_name: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        """Append log entries to the receive queue in one transaction.

        Entries at or below the recorded position are skipped; a batch whose
        ``previous_position`` is past the recorded one is a gap
        (:class:`~lr_client.errors.ProtocolError`). Returns (anything applied,
        last applied position).
        """

    def apply_lane_batch(
        self,
        source_id: str,
        client_name: str,
        lane: int,
        lanes: int,
        entries: Sequence[WireEntry],
        previous_position: int,
        low_water: int,
    ) -> tuple[bool, int]:
        """Append the log entries of one lane (1..``lanes``) in one transaction.

        Every entry must belong to ``lane`` (:func:`~lr_client.lanes.lane_of`),
        else :class:`~lr_client.errors.ProtocolError`. The stream's recorded
        position rises to ``low_water`` (the source had every entry up to it
        acknowledged), and lane rows at or below it are deleted. An entry is
        skipped if it is at or below that position or its lane's position
        under any lane count recorded; ``previous_position`` past both is a
        gap (:class:`~lr_client.errors.ProtocolError`). Returns (anything applied,
        the lane's last position).
        """

    def apply_snapshot_batch(
        self,
        source_id: str,
        client_name: str,
        snapshot_id: str,
        entries: Sequence[WireEntry],
        previous_position: int | None = None,
    ) -> tuple[bool, int]:
        """Append snapshot entries; a new snapshot id supersedes the previous one."""

    def apply_drop_notice(
        self,
        source_id: str,
        client_name: str,
        notice_id: str,
        first_dropped_position: int,
        reason: str,
    ) -> bool:
        """Queue a drop notice for the listener once per ``notice_id``; False if a repeat."""

    def sink_progress(self, source_id: str, client_name: str) -> SinkProgress:
        """What this sink has received from one (source, client)."""

    def list_sink_progress(self) -> list[SinkProgress]:
        """Every (source, client) this sink has heard of."""

    def list_sink_drops(self) -> list[SinkDrop]:
        """The last drop notice received per (source, client)."""


class SubscriberQueues(Protocol):
    """A sink's subscriber: receive queues, delivery state and leases.

    The methods that take a ``conn`` run in the delivering transaction, which
    the subscriber opens with :meth:`write` (or :meth:`read`)."""

    def list_queues(self, client_name: str | None = None) -> list[QueueInfo]:
        """Registered receive queues."""

    def watch_arrivals(self, client_name: str, wake: Callable[[], None]) -> Watch | None:
        """Call ``wake`` (from a thread of its own) whenever a receiver commits entries of
        ``client_name``, until the watch is closed (PostgreSQL: its notifications,
        :mod:`lr_client.store.recv.arrival_watch`; SQLite: any commit to the database file,
        :class:`~lr_client.store.watches.DataVersionWatch`); None where the backend
        cannot tell (an in-memory database: the subscriber polls)."""

    def read_queue(self, conn: Connection, queue_id: int, limit: int) -> list[RecvEntry]:
        """The oldest undelivered entries of a receive queue (``seq > delivered_seq``).

        So are those of every read and probe below.
        """

    def queue_depth(self, queue_id: int) -> int:
        """How many entries wait in a receive queue (above its ``delivered_seq``)."""

    def rotate_receive_queues(self, period: float = 30.0) -> int | None:
        """Retire delivered entries in bulk once the newest ones are ``period`` s old.

        PostgreSQL truncates a partition whose every entry is delivered and
        writes new entries there (the new slot is returned; None: nothing
        rotated); SQLite deletes entries as they are delivered (always None).
        Never waits long for a lock: what it cannot do now, a later call does.
        """

    def load_state(self, conn: Connection, queue_id: int, *, lock: bool = False) -> SubscriberState:
        """The queue's delivery state (defaults if it has none yet).

        ``lock``: hold its row until the transaction ends (PostgreSQL; SQLite has
        one writer), so what the transaction reads next is no older than it.
        """

    def acquire_lease(
        self, conn: Connection, queue_id: int, owner: str, now: float, lease_seconds: float
    ) -> float | None:
        """Take or renew the queue's lease; return its expiry, or None if another holds it."""

    def save_state(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        *,
        snapshot_id: str,
        in_snapshot: bool,
        delivered: int,
        lease_expires: float,
        previous_seq: int,
        delivered_seq: int,
    ) -> bool:
        """Write the queue's state and pass its entries up to ``delivered_seq``, if
        ``owner`` still holds the lease and the queue's ``delivered_seq`` is still
        ``previous_seq``; False: roll back.

        The entries it passes are delivered exactly when the caller's
        transaction commits: readers see only those above ``delivered_seq``.
        """

    def release_leases(
        self, conn: Connection, owner: str, queue_ids: list[int] | None = None
    ) -> int:
        """Give up ``owner``'s leases (all of them, or those of ``queue_ids``)."""


class QueueHeads(Protocol):
    """A receive queue's oldest undelivered entries, read in the delivering transaction,
    and how much waits."""

    def read_head(
        self,
        conn: Connection,
        queue_id: int,
        limit: int,
        max_bytes: int | None = None,
        after: int | None = None,
    ) -> list[HeadEntry]:
        """The oldest entries of a receive queue, bounded by count and bytes
        (``after``: those above this ``seq`` instead of ``delivered_seq``)."""

    def peek_head(
        self, conn: Connection, queue_id: int, after: int | None = None
    ) -> HeadEntry | None:
        """The oldest entry of a receive queue, without its payload."""

    def has_snapshot_end(self, conn: Connection, queue_id: int, snapshot_id: str) -> bool:
        """Whether the end marker of ``snapshot_id`` is in the receive queue."""

    def snapshot_base(self, conn: Connection, queue_id: int, snapshot_id: str) -> int | None:
        """The base position carried by the end marker of ``snapshot_id``; None if not queued."""

    def has_entries(self, conn: Connection, queue_id: int) -> bool:
        """Whether the receive queue holds anything."""

    def receive_queue_size(self, source_id: str, client_name: str) -> tuple[int, int]:
        """(entries, payload bytes) waiting in the client's receive queue of ``source_id``."""


class QueuePartitions(Protocol):
    """Delivery by partition: claims, per-partition marks and the barrier between them."""

    def claim_partitions(self, conn: Connection, queue_id: int, count: int) -> None:
        """Deliver the queue with ``count`` partitions from now on (1: not by partition).

        The count is stored with the queue's state. Another count is taken only
        from a drained queue (every partition delivered up to the same entry), or
        from one never delivered by partition; else
        :class:`~lr_client.errors.PartitionCountError` and nothing changes.
        """

    def load_partitions(self, conn: Connection, queue_id: int) -> dict[int, int]:
        """{partition: its ``delivered_seq``} of a queue delivered by partition."""

    def scan_entries(
        self, conn: Connection, queue_id: int, after: int, limit: int, inline_bytes: int = 0
    ) -> list[HeadEntry]:
        """The queue's entries above ``seq`` ``after``, in order, without payloads
        (``b""``) but those of at most ``inline_bytes // limit`` bytes (so at most
        ``inline_bytes`` in all): read them with :meth:`read_payloads`."""

    def read_payloads(self, conn: Connection, queue_id: int, seqs: list[int]) -> dict[int, bytes]:
        """{seq: payload} of entries of the queue."""

    def save_partition(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        partition: int,
        *,
        previous_seq: int,
        delivered_seq: int,
        delivered_seqs: list[int],
    ) -> bool:
        """Raise a partition's ``delivered_seq`` from ``previous_seq`` (the value the
        delivery read) for the entries ``delivered_seqs`` it delivered, while
        ``owner`` holds the lease (a takeover waits for this transaction); False
        (roll back) if either changed meanwhile. The queue's own ``delivered_seq``
        is left as it is (see :meth:`raise_queue_mark`)."""

    def raise_queue_mark(self, conn: Connection, queue_id: int, owner: str) -> bool:
        """Raise the queue's ``delivered_seq`` to the minimum over its partitions, while
        ``owner`` holds the lease; whether it moved."""

    def save_barrier(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        *,
        count: int,
        previous_seq: int,
        delivered_seq: int,
        snapshot_id: str,
        in_snapshot: bool,
        delivered: int,
        lease_expires: float,
    ) -> bool:
        """Pass every partition of the queue (each at ``previous_seq``) and the queue
        itself to ``delivered_seq``, with the queue's new state, after entries that
        every partition waited for (no key, snapshot, drop notice); False: roll back."""


__all__ = ["QueueHeads", "QueuePartitions", "Receiving", "SubscriberQueues"]
