"""What the sync and async subscribers share outside the delivery transaction: their
settings (checked once, here), their retries of failed queues and their leases.

:class:`SubscriberCore` is the base of :class:`~lr_client.subscriber.RoutingQueueSubscriber`
and :class:`~lr_client.aio.subscriber.AsyncRoutingQueueSubscriber`; each adds only
how it runs the steps (:mod:`lr_client.queue_delivery`) and calls its listener.
"""

from __future__ import annotations

import enum
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from lr_client.delivery import Plan, PlanKind
from lr_client.errors import InvalidInputError, StoreUnavailableError
from lr_client.failure_policy import FailurePolicy, backoff
from lr_client.keys import Keyring
from lr_client.latency import StageBook
from lr_client.listener_calls import CallPlanner
from lr_client.names import validate_name
from lr_client.partitioners import Partitioner, load_partitioner
from lr_client.queue_delivery import QueueDelivery
from lr_client.queue_leases import QueueLeases
from lr_client.records import QueueInfo
from lr_client.store import DeliveryStore
from lr_client.store.recv import parked as pk
from lr_client.store.watches import Watch

#: Default bound of the payload bytes one delivery reads (a larger entry comes alone).
DEFAULT_BATCH_MAX_BYTES = 4 * 1024 * 1024
#: Default bound of the entries of one full sync delivery (its bytes: ``batch_max_bytes``).
DEFAULT_SNAPSHOT_BATCH_SIZE = 4000
#: Seconds an idle subscriber waits at most between polls while its arrival watch
#: listens (the poll then only bounds a lost wake-up): it doubles from ``poll_interval``.
IDLE_POLL_MAX = 5.0

P = TypeVar("P", bound=CallPlanner)
log = logging.getLogger("lr_client.subscriber")


class SnapshotDelivery(enum.StrEnum):
    """When the entries of a full sync reach the listener."""

    #: Only once the whole snapshot is at the sink (its end marker received): a
    #: snapshot superseded during its transfer never reaches the listener at all.
    COMPLETE = "complete"
    #: As its entries arrive: the listener starts sooner and the sink holds less,
    #: but a snapshot superseded mid-transfer may have reached it in part.
    STREAMING = "streaming"


def default_owner() -> str:
    """``host:pid:random``, unique per subscriber instance."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class SubscriberCore:
    """A subscriber's settings, leases, read-and-mark steps and retries (see the
    subscribers' docstrings for the settings)."""

    def __init__(
        self,
        store: DeliveryStore,
        client_name: str,
        listener: object,
        *,
        batch_size: int,
        batch_max_bytes: int,
        snapshot_batch_size: int,
        max_batches: int,
        owner: str | None,
        lease_seconds: float,
        poll_interval: float,
        retry_initial: float,
        retry_max: float,
        retry_jitter: float,
        snapshot_delivery: SnapshotDelivery | str,
        partitions: int,
        partitioner: str | Partitioner,
        partition_boundaries: list[bytes | str] | None,
        workers: int | None,
        keyring: Keyring | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> None:
        if min(batch_size, snapshot_batch_size, max_batches, batch_max_bytes) < 1:
            raise ValueError(
                "batch_size, snapshot_batch_size, batch_max_bytes and max_batches"
                " must be at least 1"
            )
        if lease_seconds <= 0 or poll_interval < 0 or retry_initial < 0 or retry_max < 0:
            raise ValueError("lease_seconds must be positive, intervals not negative")
        if not 0 <= retry_jitter <= 1:
            raise ValueError("retry_jitter must be between 0 and 1")
        try:
            self.snapshot_delivery = SnapshotDelivery(snapshot_delivery)
        except ValueError:
            choices = ", ".join(repr(x.value) for x in SnapshotDelivery)
            raise InvalidInputError(
                f"snapshot_delivery must be one of {choices}, not {snapshot_delivery!r}"
            ) from None
        self.client_name = validate_name(client_name, "client name")
        self.batch_size = batch_size
        self.snapshot_batch_size = snapshot_batch_size
        self.batch_max_bytes = batch_max_bytes
        self.max_batches = max_batches
        self.owner = owner or default_owner()
        if len(self.owner) > 128:
            raise ValueError("owner must be at most 128 characters")
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.retry_jitter = retry_jitter
        self._quiet = 0  # idle waits since the last delivery
        self._stages = StageBook()  # the applied stage's latency (lr_client.latency)
        self._failures: dict[object, int] = {}  # by queue id, or (queue id, partition)
        #: The last error of each queue (id, or (id, partition)) failing now.
        self._errors: dict[object, BaseException] = {}
        self._keyring = keyring
        self._retry_at: dict[object, float] = {}  # monotonic
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidInputError(f"partitions must be a positive integer, not {partitions!r}")
        self.partitions = partitions
        self.partitioner: Partitioner = load_partitioner(partitioner, partition_boundaries)
        self.workers = min(partitions, workers or partitions)
        if self.workers < 1:
            raise InvalidInputError("workers must be at least 1")
        self._leases = QueueLeases(store, self.owner, lease_seconds, partitions)
        #: What a batch failing ``max_attempts`` times in a row leads to.
        self.failure_policy = failure_policy or FailurePolicy()
        if not isinstance(self.failure_policy, FailurePolicy):
            raise InvalidInputError(
                f"failure_policy must be a FailurePolicy, not {failure_policy!r}"
            )
        self._store = store

    @property
    def keyring(self) -> Keyring | None:
        """Opens sealed payloads before the listener sees them (None: passed as stored).
        Assign another (a key supplied, a key file reloaded): the next delivery uses it."""
        return self._keyring

    @keyring.setter
    def keyring(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        calls: CallPlanner | None = getattr(self, "_calls", None)
        if calls is not None:
            calls.keyring = keyring

    def _planner(self, cls: Callable[..., P], listener: Any, store: DeliveryStore) -> P:
        """This subscriber's listener calls, of ``cls``."""
        whole = self.snapshot_delivery is SnapshotDelivery.COMPLETE
        return cls(
            listener,
            store,
            whole_snapshots=whole,
            keyring=self.keyring,
            policy=self.failure_policy,
        )

    @property
    def failing(self) -> dict[object, BaseException]:
        """The queues failing now (by queue id, or (queue id, partition)) and the last
        error of each: a listener's failure, or an entry that does not decrypt (a block
        until the key is supplied); a queue leaves it at its next delivery."""
        return dict(self._errors)

    def _steps(self, store: DeliveryStore, calls: CallPlanner) -> QueueDelivery:
        """The read and mark of this subscriber's deliveries, planned by ``calls``."""
        return QueueDelivery(
            store,
            calls,
            self._leases,
            batch_size=self.batch_size,
            snapshot_batch_size=self.snapshot_batch_size,
            batch_max_bytes=self.batch_max_bytes,
        )

    @property
    def _lease_until(self) -> dict[int, float]:
        """{queue id: the expiry of this subscriber's lease of it}, as last taken or renewed."""
        return self._leases.until

    def backoff(self, failures: int) -> float:
        """The delay before retrying a queue that failed ``failures`` times in a row."""
        delay = backoff(failures, self.retry_initial, self.retry_max)
        return delay * (1.0 - self.retry_jitter * random.random())

    def _due(self, queues: list[QueueInfo]) -> list[QueueInfo]:
        """The queues not waiting for a retry."""
        now = time.monotonic()
        return [q for q in queues if self._retry_at.get(q.queue_id, 0.0) <= now]

    def _succeeded(self, key: object) -> None:
        self._quiet = 0
        self._failures.pop(key, None)
        self._errors.pop(key, None)
        self._retry_at.pop(key, None)

    def _failed(self, key: object, error: BaseException) -> BaseException:
        """Count a failure of ``key`` (a queue, or a queue's partition), set its retry
        time; the error to report (a database error as a transient store error)."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        self._retry_at[key] = time.monotonic() + self.backoff(failures)
        self._errors[key] = error
        if isinstance(error, SQLAlchemyError):
            wrapped = StoreUnavailableError(str(error))
            wrapped.__cause__ = error
            return wrapped
        return error

    def _note_failure(self, key: object, error: BaseException) -> None:
        """Record ``key``'s queue or partition blocked once it failed ``max_attempts``
        times in a row (sync I/O: the async subscriber runs it in a greenlet)."""
        failures = self._failures.get(key, 0)
        if not self.failure_policy.exhausted(failures):
            return
        qid, part = key if isinstance(key, tuple) else (key, pk.WHOLE_QUEUE)
        text = f"{type(error).__name__}: {error}"[:4000]
        try:
            with self._store.write() as conn:
                pk.note_blocked(conn, qid, part, text, failures)
        except Exception as exc:  # the next failure records it
            log.warning("could not record queue %s blocked: %s", qid, exc)

    def _probe_first(self, batches: int, delivered: int) -> bool:
        """Whether to probe a queue before its next batch, after ``batches`` batches that
        delivered ``delivered`` messages: not while each was full (more are likely
        waiting, and the delivery finds out as cheaply); else yes, so a drained queue
        costs a probe rather than a delivery transaction that finds nothing."""
        return batches > 0 and delivered < batches * self.batch_size

    def _applied(self, queue: QueueInfo, plan: Plan) -> bool:
        """The delivery of ``plan`` committed: note its ``applied`` stage (a log plan's,
        :mod:`lr_client.latency`); whether the summaries are due to be written."""
        if plan.kind is PlanKind.LOG and plan.received_at:
            seconds = time.time() - plan.received_at
            self._stages.add(queue.source_id, queue.client_name, "applied", seconds)
        return self._stages.due()

    def _flush_stages(self) -> None:
        """Write the stages' summaries (sync I/O: the async subscriber runs it in a greenlet)."""
        self._stages.flush(self._store.latency)

    def _waiting(self, conn: Connection, queue_id: int) -> bool:
        """Whether a queue has entries to deliver, or (parking) parked ones released."""
        if self._store.heads.has_entries(conn, queue_id):
            return True
        return self.failure_policy.parks and pk.has_released(conn, queue_id)

    def _idle_wait(self) -> float:
        """How long the next idle wait lasts: ``poll_interval``, doubling with each wait
        since the last delivery up to :data:`IDLE_POLL_MAX` (a third of the lease at
        most) while a listening arrival watch wakes the subscriber; a retry due sooner
        shortens it."""
        wait = self.poll_interval
        watch: Watch | None = getattr(self, "arrival_watch", None)
        if watch is not None and watch.listening:
            most = max(wait, min(IDLE_POLL_MAX, self.lease_seconds / 3))
            wait = min(most, wait * 2.0 ** min(self._quiet, 16))
            self._quiet += 1
        if not self._retry_at:
            return wait
        soonest = min(list(self._retry_at.values()), default=0.0) - time.monotonic()
        return max(0.0, min(wait, soonest))


__all__ = [
    "DEFAULT_BATCH_MAX_BYTES",
    "DEFAULT_SNAPSHOT_BATCH_SIZE",
    "IDLE_POLL_MAX",
    "SnapshotDelivery",
    "SubscriberCore",
    "default_owner",
]
