"""Where each stream resumes after a (re)connection: the decisions, without I/O.

:func:`plan` takes what a session read for each configured client (the
sink's state from ``NegotiateResponse``, the cursor, the open snapshot
request, the drop record, the stream stop) and says what to do: resume log
entries after a position, continue or request a full sync (with a drop
notice first), stop the stream, resume after a loss an operator accepted.
The session applies it. A stream in log entry sync needs one more question,
:func:`decide`'s, whose inputs (the trim mark, the head) must be read after
its cursor is lowered to the sink's position: :func:`plan` first answers
``Step.CHECK`` for it, and is asked again with them.

The sink reports the last log position it holds; the source knows its cursor
(what the sink acknowledged), its head, and its trim mark for the stream (the
highest position trim deleted among the entries tagged for the destination;
every entry of the stream above it is still stored). Positions of one stream
are not contiguous, so the sink's gap check cannot see entries the source
skipped: the source must decide here whether it still holds everything after
the sink's position.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from lr_client.records import (
    Cursor,
    DropRecord,
    SinkSnapshotState,
    SnapshotRequest,
    SnapshotStatus,
    StreamStop,
)


class Action(enum.StrEnum):
    RESUME = "resume"  # ship log entries after ``resume_after``
    FULL_SYNC = "full_sync"  # the sink lacks entries the source no longer holds
    STOP = "stop"  # the same without a snapshot provider: stop until an operator acts


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    resume_after: int  # RESUME: where log entries resume; STOP: where they would
    first_missing: int = 0  # FULL_SYNC / STOP: the first position the sink may lack
    reason: str = ""


def decide(
    sink_position: int,
    cursor: int,
    trimmed_through: int,
    head: int,
    has_provider: bool,
    accepted: tuple[int, int] | None = None,
) -> Decision:
    """The rule for a stream in log entry sync (no drop, no open snapshot).

    * The sink is past the source's head: the source's database is older than
      what the sink received (restored from a backup); entries the source
      writes from now on would take positions the sink already holds and be
      skipped as duplicates. A loss, from the source's cursor on.
    * Trim deleted nothing of the stream after the sink's position (the
      sink holds what it acknowledged, or it is behind its cursor, restored
      from a backup, and the source still holds the rest): resume after the
      sink's position, replaying from the source's copy. The cursor plays no
      part: trim never deletes past it unless the stream was dropped, and a
      session lowers it to replay.
    * An operator accepted the loss of ``accepted = (after, through)`` (the
      trim mark then): resume if the sink is past ``after`` and nothing was
      trimmed since.
    * Otherwise entries the sink lacks are gone at the source: a loss, from
      the sink's position on.

    A loss is a full sync when the client has a snapshot provider, else a stop.
    """
    loss = Action.FULL_SYNC if has_provider else Action.STOP
    if sink_position > head:
        after = min(cursor, head)
        return Decision(
            loss,
            after,
            after + 1,
            f"the sink is at position {sink_position} but this source's head is {head}: "
            "the source's database is older than the sink's (restored from a backup?)",
        )
    if sink_position >= trimmed_through:
        return Decision(Action.RESUME, sink_position)
    if accepted is not None and sink_position >= accepted[0] and trimmed_through <= accepted[1]:
        return Decision(Action.RESUME, sink_position)
    return Decision(
        loss,
        sink_position,
        sink_position + 1,
        f"the sink is at position {sink_position}, behind what this source still holds "
        f"(entries of the stream up to {trimmed_through} were trimmed)",
    )


@dataclass(frozen=True, slots=True)
class SinkState:
    """What the sink reported for one client in ``NegotiateResponse``."""

    last_position: int = 0
    snapshot_state: int = SinkSnapshotState.NONE  # a state unknown here matches no rule
    snapshot_id: str = ""
    snapshot_position: int = 0  # the last snapshot ordinal it holds


@dataclass(frozen=True, slots=True)
class ClientFacts:
    """What the session read for one configured client before planning its stream."""

    name: str
    has_provider: bool  # the client's ``snapshot`` setting is not "none"
    sink: SinkState
    cursor: Cursor
    open_snapshot: SnapshotRequest | None = None  # REQUESTED, RUNNING or READY
    drop: DropRecord | None = None
    stop: StreamStop | None = None
    trimmed_through: int | None = (
        None  # read for a ``Step.CHECK`` only, after the cursor is lowered
    )
    head: int | None = None  # likewise: the highest position assigned


class Step(enum.StrEnum):
    LOG = "log"  # ship log entries after ``resume_after``
    SNAPSHOT = "snapshot"  # full sync: continue ``snapshot`` or request one for ``reason``
    STOP = "stop"  # stop until an operator acts; log entries would resume after ``resume_after``
    RESUME_ACCEPTED = "resume_accepted"  # an operator accepted ``stop``'s loss: notice, then log
    CHECK = "check"  # lower the cursor to ``lower_cursor_to``, read the trim mark, plan again


@dataclass(frozen=True, slots=True)
class ClientPlan:
    """What to do for one client, in the order the session applies it."""

    name: str
    step: Step
    sink_position: int = 0
    refuse: SnapshotRequest | None = None  # cancel: the client has no snapshot provider
    clear_stop: bool = False  # a provider was configured since the stream stopped
    finish: SnapshotRequest | None = None  # the sink has it all, its ack was lost: complete it
    lower_cursor_to: int | None = None  # before the trim mark is read (done by ``Step.CHECK``)
    record_drop: Decision | None = None  # a loss: record a drop from ``first_missing``
    unstop: bool = False  # stopped before, and the sink now holds what it needs
    stop: StreamStop | None = None  # the stop that ``RESUME_ACCEPTED`` / ``unstop`` ends
    resume_after: int = 0  # LOG: where log entries resume; STOP: where they would
    raise_cursor: bool = False  # LOG: the sink is past the cursor, which moves to it
    reason: str = ""  # STOP: why; SNAPSHOT without ``snapshot``: why a full sync is requested
    snapshot: SnapshotRequest | None = None  # SNAPSHOT: the open request to continue
    snapshot_after: int = 0  # SNAPSHOT: the last ordinal the sink holds of it
    notify: bool = False  # SNAPSHOT: a drop notice (if the stream was dropped) goes first
    drop: DropRecord | None = None  # the drop record the notice tells of, if one was read


def plan(clients: Iterable[ClientFacts]) -> dict[str, ClientPlan]:
    """Each client's plan, by name, in the order given."""
    return {f.name: plan_client(f) for f in clients}


def plan_client(f: ClientFacts) -> ClientPlan:
    """One client's plan (Corfu's negotiation rules; docs/architecture.md, Sessions)."""
    sink, cursor, open_req, stop, drop = f.sink, f.cursor, f.open_snapshot, f.stop, f.drop
    refuse = None
    if open_req is not None and not f.has_provider:
        refuse, open_req = open_req, None
    clear_stop = stop is not None and f.has_provider
    if clear_stop:  # a provider was configured since: the loss becomes a full sync below
        stop = None
    if stop is not None and stop.accepted_at is not None and stop.resumed_at is None:
        return ClientPlan(f.name, Step.RESUME_ACCEPTED, sink.last_position, refuse, stop=stop)
    finish = None
    if (
        open_req is not None
        and open_req.status is SnapshotStatus.READY
        and sink.snapshot_state == SinkSnapshotState.COMPLETED
        and sink.snapshot_id == open_req.snapshot_id
    ):
        # The sink has the whole snapshot; only its acknowledgement was lost.
        finish, open_req, drop = open_req, None, None
        cursor = replace(cursor, position=sink.last_position, needs_snapshot=False)
    base = ClientPlan(f.name, Step.LOG, sink.last_position, refuse, clear_stop, finish, drop=drop)
    reason = ""
    snapshot_after = 0
    lower = None
    record = None
    if sink.snapshot_state == SinkSnapshotState.ONGOING:
        if (
            open_req is not None
            and open_req.snapshot_id == sink.snapshot_id
            and open_req.status is SnapshotStatus.READY
        ):
            snapshot_after = sink.snapshot_position  # resume the transfer
        elif open_req is None:
            reason = "interrupted snapshot"
    elif cursor.needs_snapshot or drop is not None:
        reason = "dropped for falling behind"
    elif (
        sink.snapshot_state == SinkSnapshotState.NONE and sink.last_position == 0 and f.has_provider
    ):
        reason = "first contact"
    elif open_req is None:
        if sink.last_position < cursor.position:
            # Lower the cursor first: a trim from now on keeps what the replay
            # needs, and the trim mark read next covers any before.
            lower = sink.last_position
        if f.trimmed_through is None or f.head is None:
            return replace(base, step=Step.CHECK, lower_cursor_to=lower)
        accepted = None
        if stop is not None and stop.resumed_at is not None and stop.accepted_through is not None:
            accepted = (stop.resume_after, stop.accepted_through)
        decision = decide(
            sink.last_position, cursor.position, f.trimmed_through, f.head, f.has_provider, accepted
        )
        if decision.action is Action.FULL_SYNC:
            reason, record = decision.reason, decision
        elif decision.action is Action.STOP:
            return replace(
                base,
                step=Step.STOP,
                lower_cursor_to=lower,
                resume_after=decision.resume_after,
                reason=decision.reason,
            )
    if open_req is not None or reason:
        if not f.has_provider:
            after = sink.last_position
            if drop is not None:
                after = min(after, drop.first_dropped_position - 1)
            reason = f"needs a full sync ({reason})"
            return replace(base, step=Step.STOP, resume_after=after, reason=reason)
        return replace(
            base,
            step=Step.SNAPSHOT,
            lower_cursor_to=lower,
            record_drop=record,
            reason=reason,
            snapshot=open_req,
            snapshot_after=snapshot_after,
            notify=snapshot_after == 0,
        )
    return replace(
        base,
        lower_cursor_to=lower,
        unstop=stop is not None and stop.is_stopped,
        stop=stop,
        resume_after=sink.last_position,
        raise_cursor=sink.last_position > cursor.position,
    )


__all__ = [
    "Action",
    "ClientFacts",
    "ClientPlan",
    "Decision",
    "SinkState",
    "Step",
    "decide",
    "plan",
    "plan_client",
]
