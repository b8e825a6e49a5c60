"""What one delivery does with the head of a receive queue: the plan, without I/O.

The subscriber reads the oldest entries of a queue and its state, then asks
:func:`plan_delivery` which callbacks they make: a run of log entries, a run
of one snapshot's entries (with its start and end), a drop notice alone, or
the left-overs of a snapshot whose end was already delivered (dropped
unseen: a snapshot is never delivered twice).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from lr_client.errors import ProtocolError
from lr_client.headers import EMPTY, decode_headers
from lr_client.listener import RoutingQueueMessage
from lr_client.records import (
    SNAPSHOT_TYPES,
    HeadEntry,
    QueueInfo,
    ReplicationType,
    SubscriberState,
)
from lr_client.replayed import REPLAYED_MARK


class PlanKind(enum.StrEnum):
    LOG = "log"  # a run of log entries
    SNAPSHOT = "snapshot"  # a run of one snapshot's entries (its start and end marked)
    DROP = "drop"  # a drop notice, alone in its transaction
    STALE = "stale"  # entries of a snapshot whose end was delivered: deleted, never delivered


@dataclass(frozen=True, slots=True)
class Plan:
    """What one delivery transaction does with the head of a queue."""

    kind: PlanKind
    seqs: list[int]
    messages: list[RoutingQueueMessage]
    snapshot_id: str
    start: bool
    end: bool
    in_snapshot: bool
    #: A snapshot's base position, as its entries carry it (None: not among them).
    base_position: int | None = None
    #: When the sink stored a log plan's first entry (0: not known; lr_client.latency).
    received_at: float = 0.0


def run_length(
    entries: Sequence[HeadEntry], types: Collection[ReplicationType], snapshot_id: str | None
) -> int:
    """How many leading entries have one of ``types`` (and ``snapshot_id``, unless None)."""
    n = 0
    for e in entries:
        if e.type not in types or (snapshot_id is not None and e.snapshot_id != snapshot_id):
            break
        n += 1
    return n


_M = RoutingQueueMessage
#: Its fields' slots, set directly: the frozen dataclass's ``__init__`` goes
#: through ``object.__setattr__`` per field, twice the time per message.
_SET = tuple(
    getattr(_M, f).__set__
    for f in (
        "payload",
        "source_id",
        "client_name",
        "source_position",
        "type",
        "snapshot_id",
        "key",
        "headers",
        "replayed",
    )
)


def messages(queue: QueueInfo, entries: Sequence[HeadEntry]) -> list[RoutingQueueMessage]:
    """The listener's messages of ``entries`` (one object per entry, nothing else)."""
    source, client, new = queue.source_id, queue.client_name, object.__new__
    payload, source_id, client_name, position, type_, snapshot_id, key, headers, replayed = _SET
    out: list[RoutingQueueMessage] = []
    append = out.append
    for e in entries:
        m = new(_M)
        payload(m, e[4])
        source_id(m, source)
        client_name(m, client)
        position(m, e[2])
        type_(m, e[1])
        sid = e[3]
        if sid == REPLAYED_MARK:  # queued again (lr_client.replayed)
            snapshot_id(m, "")
            replayed(m, True)
        else:
            snapshot_id(m, sid)
            replayed(m, False)
        key(m, e[6])
        headers(m, EMPTY if e[7] is None else decode_headers(e[7]))
        append(m)
    return out


def plan_delivery(queue: QueueInfo, state: SubscriberState, entries: Sequence[HeadEntry]) -> Plan:
    """Decide the callbacks for the head of a queue (``entries`` in seq order, not empty)."""
    first = entries[0]
    if first.type == ReplicationType.STREAM_DROPPED:
        # Alone in its transaction; the snapshot state is left as it is.
        notice = messages(queue, entries[:1])
        return Plan(
            PlanKind.DROP, [first.seq], notice, state.snapshot_id, False, False, state.in_snapshot
        )
    if first.type == ReplicationType.LOG_ENTRY_SYNC:
        run = entries[: run_length(entries, (first.type,), None)]
        return Plan(
            PlanKind.LOG,
            [e.seq for e in run],
            messages(queue, run),
            state.snapshot_id,
            start=False,
            end=False,
            in_snapshot=state.in_snapshot,
            received_at=first.received_at,
        )
    if first.type not in SNAPSHOT_TYPES:
        raise ProtocolError(f"entry seq {first.seq} has type {first.type.name}")
    sid = first.snapshot_id
    if sid and sid == state.snapshot_id and not state.in_snapshot:
        # Left over from a snapshot whose end was already delivered: never redeliver it.
        stale = entries[: run_length(entries, SNAPSHOT_TYPES, sid)]
        return Plan(PlanKind.STALE, [e.seq for e in stale], [], sid, False, False, False)
    start = not (state.in_snapshot and state.snapshot_id == sid)
    run = entries[: run_length(entries, (ReplicationType.SNAPSHOT_SYNC,), sid)]
    seqs = [e.seq for e in run]
    end = False
    base = run[0].base_position if run else None
    if len(run) < len(entries):
        nxt = entries[len(run)]
        if nxt.type == ReplicationType.LAST_FULL_SYNC_ENTRY and nxt.snapshot_id == sid:
            end = True
            seqs.append(nxt.seq)
            base = nxt.base_position  # the end marker's is always sent
    return Plan(
        PlanKind.SNAPSHOT,
        seqs,
        messages(queue, run),
        sid,
        start=start,
        end=end,
        in_snapshot=not end,
        base_position=base,
    )


def awaits_end(
    state: SubscriberState, head: HeadEntry | None, has_end: Callable[[str], bool]
) -> bool:
    """Whether ``head``, a queue's oldest entry, starts a snapshot whose end has not arrived.

    ``has_end(snapshot_id)`` tells whether the queue holds that snapshot's end
    marker. Once it does, a snapshot stays whole: the sink deletes the queued
    entries of a snapshot only while it is unfinished. The left-overs of a
    snapshot whose end was delivered wait for nothing: the delivery drops them.
    """
    if head is None or head.type is not ReplicationType.SNAPSHOT_SYNC:
        return False
    sid = head.snapshot_id
    if sid == state.snapshot_id and not state.in_snapshot:
        return False
    return not has_end(sid)


__all__ = [
    "Plan",
    "PlanKind",
    "awaits_end",
    "messages",
    "plan_delivery",
    "run_length",
]
