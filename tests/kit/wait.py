"""Wait for a state, never for a time: deadlines scaled for a loaded machine.

Every deadline a test waits against goes through :func:`scaled`, which
multiplies it by ``LR_TEST_TIMEOUT_SCALE`` (default 2: CI shares its machine
with other work). A deadline only bounds how long a failing test takes to
fail; a passing test returns as soon as the state is reached.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

SCALE_ENV = "LR_TEST_TIMEOUT_SCALE"
DEFAULT_SCALE = 2.0

T = TypeVar("T")


def timeout_scale() -> float:
    """The factor every deadline is multiplied by (``LR_TEST_TIMEOUT_SCALE``)."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    if not raw:
        return DEFAULT_SCALE
    value = float(raw)
    if value <= 0:
        raise ValueError(f"{SCALE_ENV} must be positive, got {raw!r}")
    return value


def scaled(seconds: float) -> float:
    """``seconds`` times the load factor: use it for every timeout a test passes on."""
    return seconds * timeout_scale()


class Deadline:
    """A point in time ``scaled(seconds)`` from now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = scaled(seconds)
        self.end = time.monotonic() + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    *,
    what: str = "",
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns a true value, and return that value.

    Fails after ``scaled(timeout)`` seconds with ``what`` (the state waited
    for) and ``detail()`` (the state reached, e.g. a process log) in the message.
    """
    deadline = Deadline(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if deadline.expired():
            message = f"{what or 'condition'} not reached within {deadline.seconds:.0f}s"
            if detail is not None:
                message += f"\n{detail()}"
            raise AssertionError(message)
        time.sleep(min(interval, deadline.remaining()) or interval)


def wait_event(event: threading.Event, timeout: float = 30.0, *, what: str = "") -> None:
    """Wait until ``event`` is set, or fail after ``scaled(timeout)`` seconds."""
    seconds = scaled(timeout)
    if not event.wait(seconds):
        raise AssertionError(f"{what or 'event'} not set within {seconds:.0f}s")


def join(thread: threading.Thread, timeout: float = 30.0) -> None:
    """Join ``thread``; fail if it is still running after ``scaled(timeout)`` seconds."""
    seconds = scaled(timeout)
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"thread {thread.name} still running after {seconds:.0f}s")
