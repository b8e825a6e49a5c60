"""Where a stream resumes after a (re)connection: the decision, without I/O.

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
from dataclasses import dataclass


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


__all__ = ["Action", "Decision", "decide"]
