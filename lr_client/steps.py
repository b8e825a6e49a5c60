"""An operation as steps: the sans-I/O protocol between the sender's rules and a driver.

An operation (:class:`~lr_client.sending.SenderRules`) is a generator that does no
I/O of its own: it yields what it needs done and is sent each result. :func:`run`
drives one in this thread (the sync client); :func:`lr_client.aio.sender.run_steps`
from an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Connection

from lr_client.reading import CachedReading

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Blocking(Generic[T]):
    """A step: ``call()`` on the client's own store (it may wait for the database)."""

    call: Callable[[], T]


@dataclass(frozen=True, slots=True)
class InTransaction(Generic[T]):
    """A step: ``call(conn)`` on the caller's connection, in its transaction."""

    call: Callable[[Connection], T]


Step = float | Blocking[Any] | InTransaction[Any]
#: An operation: yields steps, is sent each step's result, returns its own.
Steps = Generator[Step, Any, T]


def run(steps: Steps[T], conn: Connection | None = None) -> T:
    """Drive ``steps`` in this thread; :class:`InTransaction` steps run on ``conn``."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, Blocking):
                step = steps.send(step.call())
            elif isinstance(step, InTransaction):
                assert conn is not None, "an operation with no connection wrote in one"
                step = steps.send(step.call(conn))
            else:
                time.sleep(step)  # a pause the rules asked for (a poll with a deadline)
                step = steps.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def read_cached(reading: CachedReading[T], fresh: bool = False) -> Steps[T]:
    """A cached reading without a step, or a :class:`Blocking` step that reads it."""
    hit = None if fresh else reading.cached()
    if hit is not None:
        return hit[0]
    value: T = yield Blocking(lambda: reading.get(fresh))
    return value


__all__ = ["Blocking", "InTransaction", "Step", "Steps", "read_cached", "run"]
