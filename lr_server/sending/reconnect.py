"""How a sender session connects again: exponential back-off with jitter, until its stop.

Each failed attempt (an :class:`~lr_client.errors.LRError`: the sink away, refusing, or
speaking an older protocol) is reported before the wait, so the session's status says
why it is not connected; the wait ends early when the session is stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import tenacity
from tenacity import Retrying, retry_if_exception_type, stop_when_event_set, wait_exponential

from lr_client.errors import LRError
from lr_server.config import RetryConfig


def reconnecting(
    retry: RetryConfig, stop: threading.Event, failed: Callable[[BaseException], None]
) -> Retrying:
    """Attempts from ``initial_backoff`` doubling up to ``max_backoff`` apart, plus up to
    ``jitter`` s; ``failed`` told of each failure before its wait; none once ``stop`` is set."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if state.outcome is not None and (exc := state.outcome.exception()) is not None:
            failed(exc)

    return Retrying(
        retry=retry_if_exception_type(LRError),
        wait=wait_exponential(multiplier=retry.initial_backoff, max=retry.max_backoff)
        + tenacity.wait_random(0, retry.jitter),
        stop=stop_when_event_set(stop),
        sleep=stop.wait,  # type: ignore[arg-type]  # returns early on stop
        before_sleep=before_sleep,
        reraise=True,
    )


__all__ = ["reconnecting"]
