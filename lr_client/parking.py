"""The failure policy in a delivery's transaction: bisection, parking, redelivery.

:class:`Parking` holds the steps the sync and async subscribers share (the
store's SQL on the delivering transaction's connection; the async subscriber
runs them with ``conn.run_sync``); :class:`ParkingCalls` is the sync
listener's calls with the policy applied (the async twin:
:mod:`lr_client.aio.parking`). See :mod:`lr_client.failure_policy` for the rules.

Everything a delivery parks, holds, applies and passes commits together with
the queue's (or partition's) mark, or not at all: a crash anywhere leaves the
batch to be delivered again, nothing parked twice, nothing applied twice.
Redelivery of released rows (``retrying``, or ``held`` with no parked entry
of their key before them) moves each row to ``retried`` with a
compare-and-set before its listener call, so two subscribers never both
deliver it; one whose listener fails again is parked again.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, NestedTransaction

from lr_client.delivery import Plan, PlanKind
from lr_client.errors import ListenerError
from lr_client.failure_policy import Bisection, FailurePolicy, releasable
from lr_client.headers import decode_headers, encode_headers
from lr_client.keys import Keyring
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.listener_calls import Callback, ListenerCalls
from lr_client.partitioned import Conflict
from lr_client.records import QueueInfo, ReplicationType
from lr_client.store import DeliveryStore
from lr_client.store.recv import parked as pk

#: The error text of an entry held behind a parked entry of its key.
HELD = "held behind a parked entry of its key"
#: At most this much of an error's text is kept.
ERROR_CHARS = 4000


@dataclass(slots=True)
class Guard:
    """A batch delivered under the park policy: its search and whether failures park."""

    plan: Plan
    search: Bisection
    isolating: bool

    def part(self, group: list[int]) -> Plan:
        """The batch of the entries ``group`` (indexes into the plan)."""
        plan = self.plan
        return dataclasses.replace(
            plan, seqs=[plan.seqs[i] for i in group], messages=[plan.messages[i] for i in group]
        )


class Parking:
    """The policy's steps in a delivery's transaction, for one subscriber."""

    def __init__(self, policy: FailurePolicy) -> None:
        self.policy = policy
        #: (queue id, partition) whose ``lrq_blocked`` row this subscriber cleared.
        self.cleared: set[tuple[int, int | None]] = set()

    def open(
        self, conn: Connection, queue: QueueInfo, plan: Plan, attempt: int, partition: int | None
    ) -> Guard | None:
        """The guard of ``plan``, or None if it is delivered as it is (not parking,
        not log entries, nothing held, not the attempt that isolates)."""
        qid = queue.queue_id
        if not self.policy.parks or plan.kind is not PlanKind.LOG or not plan.messages:
            return None
        keys = {m.key for m in plan.messages if m.key is not None}
        held = {r.key for r in pk.open_rows(conn, qid) if r.key in keys} if keys else set()
        isolating = self.policy.isolates(attempt)
        if not isolating and not held:
            return None
        return Guard(plan, Bisection(plan.messages, {k for k in held if k is not None}), isolating)

    def unblock(
        self, conn: Connection, queue: QueueInfo, attempt: int, partition: int | None
    ) -> None:
        """After the listener's calls: clear the queue's (None: every partition's) blocked
        state, if this subscriber saw it fail or has not cleared it since it started
        (after the calls: on SQLite a delivery by partition takes the write lock at its
        listener's first statement)."""
        qid = queue.queue_id
        if attempt > 1 or (qid, partition) not in self.cleared:
            pk.clear_blocked(conn, qid, partition)
            self.cleared.add((qid, partition))

    @staticmethod
    def close(conn: Connection, queue: QueueInfo, guard: Guard, attempt: int) -> None:
        """Write what ``guard``'s search parked and held, in ``seq`` order."""
        plan, search = guard.plan, guard.search
        rows = [(i, why, pk.ParkedState.PARKED) for i, why in search.parked]
        rows += [(i, HELD, pk.ParkedState.HELD) for i in search.held]
        rows.sort()
        out = []
        for i, why, state in rows:
            m = plan.messages[i]
            out.append(
                pk.NewParked(
                    plan.seqs[i],
                    m.source_position,
                    m.payload,
                    m.key,
                    why[:ERROR_CHARS],
                    attempt,
                    state,
                    encode_headers(m.headers),
                )
            )
        pk.park(conn, queue.queue_id, queue.client_name, queue.source_id, out)

    def released(
        self, conn: Connection, queue: QueueInfo
    ) -> list[tuple[pk.OpenRow, RoutingQueueMessage]]:
        """The rows to deliver again now, with their messages (none unless parking)."""
        if not self.policy.parks:
            return []
        rows = releasable(pk.open_rows(conn, queue.queue_id))
        if not rows:
            return []
        bodies = pk.payloads(conn, [r.parked_id for r in rows])
        return [(r, self.message(queue, r, *bodies[r.parked_id])) for r in rows]

    @staticmethod
    def message(
        queue: QueueInfo, row: pk.OpenRow, payload: bytes, headers: Any
    ) -> RoutingQueueMessage:
        return RoutingQueueMessage(
            payload=payload,
            headers=decode_headers(headers),
            source_id=queue.source_id,
            client_name=queue.client_name,
            source_position=row.source_position,
            type=ReplicationType.LOG_ENTRY_SYNC,
            key=row.key,
        )

    @staticmethod
    def take(conn: Connection, row: pk.OpenRow) -> None:
        """Mark ``row`` retried before its call (:class:`Conflict` if another took it)."""
        if not pk.move(
            conn, row.parked_id, row.state, pk.ParkedState.RETRIED, retried_at=time.time()
        ):
            raise Conflict

    @staticmethod
    def failed_again(conn: Connection, row: pk.OpenRow, error: str) -> None:
        """``row``'s call failed (its savepoint rolled back): parked again."""
        if not pk.failed_again(conn, row.parked_id, pk.ParkedState.RETRIED, error[:ERROR_CHARS]):
            raise Conflict

    @staticmethod
    def single(row: pk.OpenRow, message: RoutingQueueMessage) -> tuple[Plan, list[Callback]]:
        """The plan and call of one released row."""
        plan = Plan(PlanKind.LOG, [row.seq], [message], "", False, False, False)
        call = Callback("process_log_entries", (message.source_id, [message]), batch=True)
        return plan, [call]


def undone(conn: Connection, savepoint: NestedTransaction) -> bool:
    """Roll ``savepoint`` back after a failed call: whether the delivery can go on (not
    if the listener ended the delivery's transaction itself; yes if it rolled back
    only that savepoint, undone already)."""
    txn = conn.get_transaction()
    if txn is None or not txn.is_active:
        return False
    if savepoint.is_active:
        savepoint.rollback()
    return True


class ParkingCalls(ListenerCalls):
    """A sync listener's calls under a subscriber's :class:`FailurePolicy`."""

    def __init__(
        self,
        listener: RoutingQueueListener,
        store: DeliveryStore,
        *,
        whole_snapshots: bool,
        policy: FailurePolicy,
        keyring: Keyring | None = None,
    ) -> None:
        super().__init__(listener, store, whole_snapshots=whole_snapshots, keyring=keyring)
        self.parking = Parking(policy)

    def call(
        self,
        conn: Connection,
        queue: QueueInfo,
        plan: Plan,
        attempt: int,
        partition: int | None = None,
        calls: list[Callback] | None = None,
    ) -> None:
        guard = self.parking.open(conn, queue, plan, attempt, partition)
        if guard is None:
            super().call(conn, queue, plan, attempt, partition, calls)
            self.parking.unblock(conn, queue, attempt, partition)
            return
        search = guard.search
        while (group := search.next()) is not None:
            savepoint = conn.begin_nested() if guard.isolating else None
            try:
                super().call(conn, queue, guard.part(group), attempt, partition)
            except ListenerError as exc:
                if savepoint is None or not undone(conn, savepoint):
                    raise
                search.failed(str(exc))
            else:
                if savepoint is not None:
                    savepoint.commit()
                search.ok()
        self.parking.close(conn, queue, guard, attempt)
        self.parking.unblock(conn, queue, attempt, partition)

    def redeliver(self, conn: Connection, queue: QueueInfo) -> int:
        """Deliver the queue's released rows in ``conn``'s transaction: how many applied."""
        applied, stopped = 0, set()
        for row, message in self.parking.released(conn, queue):
            if row.key is not None and row.key in stopped:
                continue
            self.parking.take(conn, row)
            plan, calls = self.parking.single(row, self.readable(queue, [message])[0])
            savepoint = conn.begin_nested()
            try:
                super().call(conn, queue, plan, row.attempts + 1, None, calls)
            except ListenerError as exc:
                if not undone(conn, savepoint):
                    raise
                self.parking.failed_again(conn, row, str(exc))
                stopped.add(row.key)
                continue
            savepoint.commit()
            applied += 1
        return applied


__all__ = ["ERROR_CHARS", "HELD", "Guard", "Parking", "ParkingCalls", "undone"]
