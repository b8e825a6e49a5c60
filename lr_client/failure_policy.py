"""What a subscriber does when its listener cannot apply a batch: the rules, without I/O.

A failed delivery rolls back and is tried again after a back-off (``retry_initial``
doubling to ``retry_max``, tenacity's :class:`~tenacity.wait.wait_exponential`).
Once a queue (or a partition of it) has failed ``max_attempts`` times in a row
(tenacity's :class:`~tenacity.stop.stop_after_attempt`), the policy decides:

* ``block`` (the default): the queue waits for its listener, as before, retried
  with back-off; its state is recorded (``lrq_blocked``: the error and the
  attempts, ``lr_blocked_queues``, ``lr status``) until a delivery succeeds.
* ``park``: the next delivery bisects the batch, each half in a savepoint of
  the delivery's transaction, down to the entries the listener fails on alone;
  those are parked (``lrq_parked``), the others applied, and the queue's mark
  passes them all in the same transaction. Later entries of a parked entry's
  key are held (parked with state ``held``, the listener not called) until it
  is resolved (``lr parked retry`` or ``discard``); other keys flow.

Only log entries are parked. A full sync's entries and drop notices, and
failures of the delivery itself before the listener is called (an entry that
cannot be read or decoded, a database error), block whatever the policy.
:class:`Bisection` is the search, shared by the sync and async subscribers
(:mod:`lr_client.parking`, :mod:`lr_client.aio.parking`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tenacity import RetryCallState, Retrying, stop_after_attempt, wait_exponential

from lr_client.errors import InvalidInputError
from lr_client.listener import RoutingQueueMessage
from lr_client.store.recv.parked import OpenRow, ParkedState

#: Default attempts of a failing batch before the policy acts.
DEFAULT_MAX_ATTEMPTS = 5
#: The retrying object tenacity's call states name (its wait and stop are not used).
_RETRYING = Retrying()


class OnFailure(enum.StrEnum):
    """What a subscriber does once a batch failed ``max_attempts`` times."""

    #: Keep retrying the batch with back-off; the queue waits (recorded as blocked).
    BLOCK = "block"
    #: Park the entries the listener fails on alone; deliver the others.
    PARK = "park"


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """A subscriber's failure policy (see the module's docstring): ``on_failure``
    (``"block"`` or ``"park"``) once a batch failed ``max_attempts`` times in a row.
    :class:`~lr_client.errors.InvalidInputError` if either is bad."""

    on_failure: OnFailure | str = OnFailure.BLOCK
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        try:
            chosen = OnFailure(self.on_failure)
        except ValueError:
            choices = ", ".join(repr(x.value) for x in OnFailure)
            raise InvalidInputError(
                f"on_failure must be one of {choices}, not {self.on_failure!r}"
            ) from None
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise InvalidInputError(f"max_attempts must be an integer, not {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise InvalidInputError(f"max_attempts must be at least 1, not {self.max_attempts}")
        object.__setattr__(self, "on_failure", chosen)

    @property
    def parks(self) -> bool:
        """Whether the policy parks (else it blocks)."""
        return self.on_failure == OnFailure.PARK

    def exhausted(self, attempt: int) -> bool:
        """Whether ``attempt`` (1 for the first) is the last before the policy acts."""
        state = RetryCallState(_RETRYING, None, (), {})
        state.attempt_number = attempt
        return bool(stop_after_attempt(self.max_attempts)(state))

    def isolates(self, attempt: int) -> bool:
        """Whether delivery ``attempt`` bisects its batch and parks what fails alone."""
        return self.parks and self.exhausted(attempt)


def backoff(failures: int, initial: float, most: float) -> float:
    """The delay before the retry after ``failures`` failures in a row (no jitter)."""
    state = RetryCallState(_RETRYING, None, (), {})
    state.attempt_number = max(1, failures)
    return float(wait_exponential(multiplier=initial, min=0, max=most, exp_base=2)(state))


class Bisection:
    """The search of a failing batch's entries, left to right (sans I/O).

    ``messages`` in ``seq`` order; ``held``: keys whose entries are held (a parked
    entry of theirs before them). :meth:`next` gives the indexes to try together;
    :meth:`ok` or :meth:`failed` says how it went. A failed group is split in
    halves, a failed single entry is parked and its key held from then on.
    Entries are tried in order, so each one applied comes after every entry of
    its key applied before it, and none comes after a parked entry of its key.
    """

    def __init__(self, messages: Sequence[RoutingQueueMessage], held: set[bytes]) -> None:
        self.messages = messages
        self.held_keys = set(held)
        self.stack: list[list[int]] = [list(range(len(messages)))]
        self.current: list[int] = []
        #: Indexes parked, with the error's text; held; applied.
        self.parked: list[tuple[int, str]] = []
        self.held: list[int] = []
        self.applied: list[int] = []

    def next(self) -> list[int] | None:
        """The indexes to try next (None: done)."""
        while self.stack:
            group = self.stack.pop()
            keep = []
            for i in group:
                key = self.messages[i].key
                if key is not None and key in self.held_keys:
                    self.held.append(i)
                else:
                    keep.append(i)
            if keep:
                self.current = keep
                return keep
        return None

    def ok(self) -> None:
        self.applied.extend(self.current)

    def failed(self, error: str) -> None:
        group = self.current
        if len(group) == 1:
            self.parked.append((group[0], error))
            key = self.messages[group[0]].key
            if key is not None:
                self.held_keys.add(key)
            return
        half = len(group) // 2
        self.stack.append(group[half:])
        self.stack.append(group[:half])


def releasable(rows: Sequence[OpenRow]) -> list[OpenRow]:
    """The rows (``seq`` order) a subscriber delivers now: retrying ones, and held ones
    with no parked entry of their key before them; a key stops at its first parked row."""
    stopped: set[bytes] = set()
    out: list[OpenRow] = []
    for row in rows:
        if row.key is not None and row.key in stopped:
            continue
        if row.state is ParkedState.PARKED:
            if row.key is not None:
                stopped.add(row.key)
            continue
        out.append(row)
    return out


__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Bisection",
    "FailurePolicy",
    "OnFailure",
    "backoff",
    "releasable",
]
