"""The listener as a delivery calls it, in the delivery's own transaction.

What the subscriber (:mod:`lr_client.subscriber`) and delivery by partition
(:mod:`lr_client.partitioned`) share: one call of the listener's callbacks
for a planned batch, with an ORM session bound to the delivering
transaction, and whether a full sync at the head waits for its end before it
reaches the listener (``"complete"`` delivery).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from lr_client.delivery import Plan, PlanKind, awaits_end
from lr_client.errors import ListenerError
from lr_client.listener import RoutingQueueListener, takes_base_position
from lr_client.records import HeadEntry, QueueInfo, ReplicationType, SubscriberState
from lr_client.store import SubscriberQueues

#: The key of :meth:`session.info <sqlalchemy.orm.Session.info>` that tells a listener
#: the partition it is called for (None: entries every partition waited for).
PARTITION_INFO_KEY = "lr_partition"


class ListenerCalls:
    """Calls ``listener`` for planned batches of ``store``'s receive queues.

    ``whole_snapshots``: a full sync reaches the listener only once its end
    marker is at the sink (else as it arrives).
    """

    def __init__(
        self, listener: RoutingQueueListener, store: SubscriberQueues, *, whole_snapshots: bool
    ) -> None:
        self.listener = listener
        self.store = store
        self.whole_snapshots = whole_snapshots
        #: Whether the listener's start and end callbacks take ``base_position`` (else
        #: they have the older signature and are called without it).
        self.base_at_start = takes_base_position(listener.on_full_sync_start)
        self.base_at_end = takes_base_position(listener.on_full_sync_end)

    def awaits_end(
        self, conn: Connection, queue_id: int, state: SubscriberState, head: HeadEntry | None
    ) -> bool:
        """:func:`~lr_client.delivery.awaits_end`, asking the store whether the end arrived."""
        store = self.store
        return awaits_end(state, head, lambda sid: store.has_snapshot_end(conn, queue_id, sid))

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

    def call(
        self,
        conn: Connection,
        queue: QueueInfo,
        plan: Plan,
        attempt: int,
        partition: int | None = None,
    ) -> None:
        """Run ``plan``'s callbacks in ``conn``'s transaction (``partition``: the one it is
        delivered for, None for entries every partition waited for).

        :class:`~lr_client.errors.ListenerError` if a callback raised, returned a
        false value for a batch, or rolled the transaction back.
        """
        listener, source = self.listener, queue.source_id
        txn = conn.get_transaction()
        session = Session(bind=conn, join_transaction_mode="rollback_only")
        session.info[PARTITION_INFO_KEY] = partition

        def failed(callback: str, message: str) -> ListenerError:
            return ListenerError(
                f"{callback} for {queue.queue_name} (seq {plan.seqs[0]}..{plan.seqs[-1]}, "
                f"attempt {attempt}): {message}",
                source_id=source,
                client_name=queue.client_name,
                callback=callback,
                first_seq=plan.seqs[0],
                last_seq=plan.seqs[-1],
                attempt=attempt,
            )

        callback = ""
        try:
            if plan.start:
                callback = "on_full_sync_start"
                if self.base_at_start:
                    base = plan.base_position
                    if base is None:  # not on its entries: the end marker's, if queued
                        base = self.store.snapshot_base(conn, queue.queue_id, plan.snapshot_id)
                    listener.on_full_sync_start(
                        session, source, plan.snapshot_id, base_position=base
                    )
                else:
                    listener.on_full_sync_start(session, source, plan.snapshot_id)
            if plan.kind is PlanKind.DROP:
                callback = "on_stream_dropped"
                notice = plan.messages[0]
                listener.on_stream_dropped(
                    session, source, notice.source_position, notice.payload.decode()
                )
            elif plan.messages:
                if plan.kind is PlanKind.LOG:
                    callback = "process_log_entries"
                    ok = listener.process_log_entries(session, source, plan.messages)
                else:
                    callback = "process_full_sync"
                    ok = listener.process_full_sync(session, source, plan.messages)
                if not ok:
                    raise failed(callback, f"returned {ok!r}")
            if plan.end:
                callback = "on_full_sync_end"
                if self.base_at_end:
                    listener.on_full_sync_end(
                        session, source, plan.snapshot_id, base_position=plan.base_position
                    )
                else:
                    listener.on_full_sync_end(session, source, plan.snapshot_id)
            session.flush()
        except ListenerError:
            raise
        except Exception as exc:
            raise failed(callback, f"{type(exc).__name__}: {exc}") from exc
        finally:
            session.close()
        if txn is None or not txn.is_active:
            raise failed(callback, "the listener rolled back the delivery transaction")


__all__ = ["PARTITION_INFO_KEY", "ListenerCalls"]
