"""The sender session's reconnect schedule (``[retry]``), as ``docs/guarantees.md`` states it.

A session whose destination cannot be reached waits ``initial_backoff`` after its
first failed attempt, doubles the wait after each further one up to
``max_backoff``, and adds up to ``jitter`` seconds at random to each wait. The real
run loop is driven here with a transport that always fails and a stop event that
records each wait instead of sleeping.
"""

from __future__ import annotations

import threading
from itertools import pairwise
from typing import Any, cast

import pytest

from lr_client.errors import TransportError
from lr_server.config import ClientConfig, RetryConfig
from lr_server.sending.session import SenderSession, SessionStore
from lr_server.transport.base import Transport


class _Store:
    """Nothing is read before a connection succeeds; the status rows are dropped."""

    @property
    def inspection(self) -> _Store:  # the store's inspection role: this fake plays it
        return self

    @property
    def latency(self) -> _Store:  # the store's latency role: this fake plays it too
        return self

    def save_session_status(self, *args: Any, **kwargs: Any) -> None:
        return None

    def save_stage_latency(self, *args: Any, **kwargs: Any) -> None:
        return None


class _RecordingStop(threading.Event):
    """A stop event whose waits return at once, recorded; set after ``limit`` waits."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


def _schedule(retry: RetryConfig, attempts: int) -> tuple[list[float], int]:
    """The waits of a session that fails ``attempts`` connections, and how many it made."""
    made = 0

    def unreachable() -> Transport:
        nonlocal made
        made += 1
        raise TransportError("connection refused")

    session = SenderSession(
        cast(SessionStore, _Store()),
        "a",
        "b",
        [ClientConfig(name="policy")],
        unreachable,
        retry=retry,
    )
    stop = _RecordingStop(attempts)
    session.run(stop)
    return stop.waits, made


def _expected(retry: RetryConfig, n: int) -> float:
    """The wait after the n-th failed attempt (1-based), before jitter."""
    return min(retry.initial_backoff * 2 ** (n - 1), retry.max_backoff)


@pytest.mark.parametrize(
    "retry",
    [RetryConfig(), RetryConfig(initial_backoff=0.25, max_backoff=3.0, jitter=0.1)],
    ids=["defaults", "tuned"],
)
def test_reconnect_waits_double_from_initial_backoff_to_max_backoff_plus_jitter(
    retry: RetryConfig,
) -> None:
    waits, made = _schedule(retry, 12)
    assert len(waits) == 12
    assert made == 13  # the first attempt, then one after each wait: none without a wait
    for n, wait in enumerate(waits, 1):
        base = _expected(retry, n)
        assert base <= wait <= base + retry.jitter, (n, wait, waits)
    # Growth: each base wait doubles until the cap; the cap is reached and held.
    bases = [_expected(retry, n) for n in range(1, 13)]
    assert bases[-1] == retry.max_backoff
    assert all(b2 == min(2 * b1, retry.max_backoff) for b1, b2 in pairwise(bases))


def test_the_jitter_is_random_and_spans_its_range() -> None:
    retry = RetryConfig(initial_backoff=0.1, max_backoff=0.1, jitter=1.0)
    waits, _ = _schedule(retry, 200)
    extra = [w - 0.1 for w in waits]
    assert all(0.0 <= e <= 1.0 for e in extra)
    # Uniform on [0, 1]: 200 draws fall in every fifth of it (chance of a miss ~1e-19).
    assert {min(int(e * 5), 4) for e in extra} == {0, 1, 2, 3, 4}


def test_no_jitter_gives_the_exact_schedule() -> None:
    retry = RetryConfig(initial_backoff=0.5, max_backoff=4.0, jitter=0.0)
    waits, _ = _schedule(retry, 6)
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
