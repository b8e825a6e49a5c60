"""The listener as a delivery calls it, in the delivery's own transaction.

What the subscribers (:mod:`lr_client.subscriber`, :mod:`lr_client.aio.subscriber`)
and delivery by partition (:mod:`lr_client.partitioned`) share: which
callbacks a planned batch makes (:meth:`CallPlanner.callbacks`, without I/O
but for a snapshot's base position read in the delivery's transaction; with a
keyring, the payloads decrypted, :mod:`lr_client.sealed_messages`), how
a failed one is reported, and whether a full sync at the head waits for its
end before it reaches the listener (``"complete"`` delivery).
:class:`ListenerCalls` runs them with an ORM session bound to the delivering
transaction; the async subscriber awaits them with an ``AsyncSession``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from sqlalchemy.engine import Connection, NestedTransaction, Transaction

from lr_client import tracing
from lr_client.delivery import Plan, PlanKind, awaits_end
from lr_client.errors import ListenerError
from lr_client.keys import Keyring
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage, takes_base_position
from lr_client.records import HeadEntry, QueueInfo, ReplicationType, SubscriberState
from lr_client.sealed_messages import open_messages
from lr_client.store import DeliveryStore

#: The key of :meth:`session.info <sqlalchemy.orm.Session.info>` that tells a listener
#: the partition it is called for (None: entries every partition waited for).
PARTITION_INFO_KEY = "lr_partition"


@dataclass(frozen=True, slots=True)
class Callback:
    """One call of a listener method: ``name(session, *args, **kwargs)``."""

    name: str
    args: tuple[object, ...]
    kwargs: dict[str, object] = field(default_factory=dict)
    #: A ``process_*`` batch: a false result fails the delivery.
    batch: bool = False


class CallPlanner:
    """The callbacks of planned batches of ``store``'s receive queues, for ``listener``
    (sync or async: only its methods' names and signatures are read here).

    ``whole_snapshots``: a full sync reaches the listener only once its end
    marker is at the sink (else as it arrives).
    """

    def __init__(
        self,
        listener: object,
        store: DeliveryStore,
        *,
        whole_snapshots: bool,
        keyring: Keyring | None = None,
    ) -> None:
        self.store = store
        #: Opens sealed payloads before the listener sees them (None: passed as stored).
        self.keyring = keyring
        self.whole_snapshots = whole_snapshots
        #: Whether the listener's start and end callbacks take ``base_position`` (else
        #: they have the older signature and are called without it).
        self.base_at_start = takes_base_position(getattr(listener, "on_full_sync_start"))  # noqa: B009
        self.base_at_end = takes_base_position(getattr(listener, "on_full_sync_end"))  # noqa: B009

    def awaits_end(
        self, conn: Connection, queue_id: int, state: SubscriberState, head: HeadEntry | None
    ) -> bool:
        """:func:`~lr_client.delivery.awaits_end`, asking the store whether the end arrived."""
        store = self.store
        return awaits_end(
            state, head, lambda sid: store.heads.has_snapshot_end(conn, queue_id, sid)
        )

    def waits_for_end(
        self, conn: Connection, queue_id: int, state: SubscriberState, entries: list[HeadEntry]
    ) -> bool:
        """Whether a full sync at the head must wait for its end (``"complete"`` delivery)."""
        if not self.whole_snapshots:
            return False
        first = entries[0]
        ends = ReplicationType.LAST_FULL_SYNC_ENTRY
        whole = any(e.type is ends and e.snapshot_id == first.snapshot_id for e in entries)
        return not whole and self.awaits_end(conn, queue_id, state, first)

    def callbacks(self, conn: Connection, queue: QueueInfo, plan: Plan) -> list[Callback]:
        """The calls ``plan`` makes, in order (none for stale entries); a snapshot's base
        position not on its entries is read in ``conn``'s transaction."""
        source, sid = queue.source_id, plan.snapshot_id
        out: list[Callback] = []
        if plan.kind is PlanKind.STALE:
            return out
        if plan.start:
            if self.base_at_start:
                base = plan.base_position
                if base is None:  # not on its entries: the end marker's, if queued
                    base = self.store.heads.snapshot_base(conn, queue.queue_id, sid)
                out.append(Callback("on_full_sync_start", (source, sid), {"base_position": base}))
            else:
                out.append(Callback("on_full_sync_start", (source, sid)))
        if plan.kind is PlanKind.DROP:
            notice = plan.messages[0]
            args = (source, notice.source_position, notice.payload.decode())
            out.append(Callback("on_stream_dropped", args))
        elif plan.messages:
            name = "process_log_entries" if plan.kind is PlanKind.LOG else "process_full_sync"
            out.append(Callback(name, (source, self.readable(queue, plan.messages)), batch=True))
        if plan.end:
            if self.base_at_end:
                kwargs: dict[str, object] = {"base_position": plan.base_position}
                out.append(Callback("on_full_sync_end", (source, sid), kwargs))
            else:
                out.append(Callback("on_full_sync_end", (source, sid)))
        return out

    def readable(
        self, queue: QueueInfo, messages: Sequence[RoutingQueueMessage]
    ) -> Sequence[RoutingQueueMessage]:
        """``messages`` as the listener sees them: decrypted, with a keyring."""
        if self.keyring is None:
            return messages
        return open_messages(self.keyring, queue, messages)

    @staticmethod
    def failure(
        queue: QueueInfo, plan: Plan, attempt: int, callback: str, message: str
    ) -> ListenerError:
        """The error of a delivery whose ``callback`` failed (``message``: how)."""
        return ListenerError(
            f"{callback} for {queue.queue_name} (seq {plan.seqs[0]}..{plan.seqs[-1]}, "
            f"attempt {attempt}): {message}",
            source_id=queue.source_id,
            client_name=queue.client_name,
            callback=callback,
            first_seq=plan.seqs[0],
            last_seq=plan.seqs[-1],
            attempt=attempt,
        )

    @staticmethod
    def applying(queue: QueueInfo, plan: Plan) -> AbstractContextManager[None]:
        """The ``lr.apply`` span of a log batch's callbacks (:mod:`lr_client.tracing`)."""
        if plan.kind is not PlanKind.LOG:
            return nullcontext()
        contexts = ((m.source_position, m.headers) for m in plan.messages)
        return tracing.batch_span("lr.apply", queue.source_id, queue.client_name, contexts)

    @staticmethod
    def rejected(result: object) -> str:
        """How a batch callback's ``result`` fails it ("" if it does not)."""
        return "" if result else f"returned {result!r}"

    #: The failure when the listener ended the delivery's transaction itself.
    ROLLED_BACK = "the listener rolled back the delivery transaction"

    @staticmethod
    def rolled_back(txn: Transaction | None, savepoint: NestedTransaction | None) -> bool:
        """Whether the listener ended the delivery's transaction ``txn``, or the
        ``savepoint`` it was called in (a part of a batch the failure policy isolates:
        its session's rollback ends that savepoint only)."""
        ended = savepoint is not None and not savepoint.is_active
        return txn is None or not txn.is_active or ended


class ListenerCalls(CallPlanner):
    """Calls a sync ``listener`` for planned batches, in the delivering transaction."""

    def __init__(
        self,
        listener: RoutingQueueListener,
        store: DeliveryStore,
        *,
        whole_snapshots: bool,
        keyring: Keyring | None = None,
    ) -> None:
        super().__init__(listener, store, whole_snapshots=whole_snapshots, keyring=keyring)
        self.listener = listener

    def call(
        self,
        conn: Connection,
        queue: QueueInfo,
        plan: Plan,
        attempt: int,
        partition: int | None = None,
        calls: list[Callback] | None = None,
    ) -> None:
        """Run ``plan``'s callbacks (``calls``, if planned already) in ``conn``'s
        transaction (``partition``: the one it is delivered for, None for entries
        every partition waited for).

        :class:`~lr_client.errors.ListenerError` if a callback raised, returned a
        false value for a batch, or rolled the transaction back.
        """
        if calls is None:
            calls = self.callbacks(conn, queue, plan)
        from sqlalchemy.orm import Session  # the ORM only where a listener is called

        txn, savepoint = conn.get_transaction(), conn.get_nested_transaction()
        session = Session(bind=conn, join_transaction_mode="rollback_only")
        session.info[PARTITION_INFO_KEY] = partition
        name = ""
        try:
            with self.applying(queue, plan):
                for cb in calls:
                    name = cb.name
                    result = getattr(self.listener, name)(session, *cb.args, **cb.kwargs)
                    if cb.batch and (why := self.rejected(result)):
                        raise self.failure(queue, plan, attempt, name, why)
            session.flush()
        except ListenerError:
            raise
        except Exception as exc:
            raise self.failure(queue, plan, attempt, name, f"{type(exc).__name__}: {exc}") from exc
        finally:
            session.close()
        if self.rolled_back(txn, savepoint):
            raise self.failure(queue, plan, attempt, name, self.ROLLED_BACK)

    def redeliver(self, conn: Connection, queue: QueueInfo) -> int:
        """Deliver entries of ``queue`` parked and released since (none here: see
        :class:`lr_client.parking.ParkingCalls`): how many the listener applied."""
        return 0


__all__ = ["PARTITION_INFO_KEY", "CallPlanner", "Callback", "ListenerCalls"]
