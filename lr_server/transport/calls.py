"""The receiver's open calls: a bound on their number, a cap per source, idle time-outs.

Every call is registered only after its caller is authenticated, so anonymous
or unknown peers never hold one. Then:

* at most ``max_calls`` calls are open at once; one more is refused
  (``RESOURCE_EXHAUSTED``);
* a source holds at most ``per_source`` calls: its newest call cancels its
  oldest beyond the cap, so a source that restarts always gets in, whatever
  its previous process left open;
* a call waiting for a message it must send (a ``Negotiate`` request) longer
  than ``idle_timeout`` seconds is cancelled by a watchdog thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from lr_client.errors import StoreUnavailableError
from lr_server import metrics

log = logging.getLogger("lr.grpc")


class ReceiverStoppedError(StoreUnavailableError):
    """The receiver is stopping: its store is no longer used (answered ``UNAVAILABLE``)."""


class CallLimitError(Exception):
    """The receiver has as many open calls as it accepts (answered ``RESOURCE_EXHAUSTED``)."""


@dataclass(eq=False)
class OpenCall:
    """One admitted call; ``cancel`` ends it (``grpc.RpcContext.cancel``)."""

    source: str
    method: str
    cancel: Callable[[], None]
    seq: int
    waiting_since: float | None = None
    ended_by: str = ""  # why the tracker cancelled it: "idle" or "replaced"


class CallTracker:
    """Admits, counts and, when needed, cancels the receiver's calls."""

    def __init__(
        self,
        max_calls: int,
        per_source: int,
        idle_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_calls = max_calls
        self.per_source = per_source
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: dict[int, OpenCall] = {}
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._working = 0  # handlers inside :meth:`working` (using the receiver's store)
        self._closed = False
        self._idle = threading.Condition(self._lock)
        self._waits = threading.Condition(self._lock)  # a call began to wait, or the stop

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the idle watchdog (idempotent)."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name="lr-rpc-watchdog", daemon=True
            )
            self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._waits.notify_all()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)

    # -- calls -------------------------------------------------------------------------------
    def admit(self, source: str, method: str, cancel: Callable[[], None]) -> OpenCall:
        """Register an authenticated call; raises :class:`CallLimitError` when full."""
        evicted: list[OpenCall] = []
        with self._lock:
            mine = sorted(
                (c for c in self._calls.values() if c.source == source), key=lambda c: c.seq
            )
            excess = len(mine) + 1 - self.per_source
            if excess > 0:
                evicted = mine[:excess]
            if len(self._calls) - len(evicted) >= self.max_calls:
                metrics.RECEIVER_CALLS_REFUSED.labels("busy").inc()
                raise CallLimitError(
                    f"the receiver has {len(self._calls)} open calls, its limit"
                    " (receiver.max_concurrent_calls)"
                )
            for old in evicted:
                old.ended_by = "replaced"
                self._end(old)
            call = OpenCall(source, method, cancel, next(self._seq))
            self._calls[call.seq] = call
            metrics.RECEIVER_OPEN_CALLS.set(len(self._calls))
        for old in evicted:
            metrics.RECEIVER_CALLS_REFUSED.labels("replaced").inc()
            log.warning(
                "ending the oldest %s call of %s: a newer call of that source replaces it",
                old.method,
                source,
            )
            old.cancel()
        return call

    def release(self, call: OpenCall) -> None:
        """The call ended (idempotent)."""
        with self._lock:
            self._end(call)
            metrics.RECEIVER_OPEN_CALLS.set(len(self._calls))

    @contextmanager
    def waiting(self, call: OpenCall) -> Iterator[None]:
        """While inside, the call waits for its peer and is cancelled once idle too long."""
        with self._lock:
            call.waiting_since = self._clock()
            self._waits.notify_all()
        try:
            yield
        finally:
            with self._lock:
                call.waiting_since = None

    @contextmanager
    def working(self) -> Iterator[None]:
        """While inside, a handler serves a request (the store in use): :meth:`drain` waits
        for it. A cancelled call's handler thread may still be inside after gRPC has
        ended the call; once drained, entering raises :class:`ReceiverStoppedError`."""
        with self._lock:
            if self._closed:
                raise ReceiverStoppedError("the receiver is stopping")
            self._working += 1
        try:
            yield
        finally:
            with self._lock:
                self._working -= 1
                self._idle.notify_all()

    def drain(self, timeout: float) -> bool:
        """Refuse new work and wait up to ``timeout`` s for the handlers inside
        :meth:`working`; whether none is left."""
        with self._lock:
            self._closed = True
            return self._idle.wait_for(lambda: self._working == 0, timeout)

    def open_calls(self, source: str | None = None) -> list[OpenCall]:
        """The open calls (of ``source``), oldest first."""
        with self._lock:
            calls = [c for c in self._calls.values() if source is None or c.source == source]
        return sorted(calls, key=lambda c: c.seq)

    def _end(self, call: OpenCall) -> None:
        self._calls.pop(call.seq, None)

    # -- watchdog ----------------------------------------------------------------------------
    def expire_idle(self) -> list[OpenCall]:
        """Cancel the calls that have waited longer than the idle timeout; returns them."""
        now = self._clock()
        with self._lock:
            idle = [
                c
                for c in self._calls.values()
                if c.waiting_since is not None and now - c.waiting_since >= self.idle_timeout
            ]
            for c in idle:
                c.ended_by = "idle"
                self._end(c)
            metrics.RECEIVER_OPEN_CALLS.set(len(self._calls))
        for c in idle:
            metrics.RECEIVER_CALLS_REFUSED.labels("idle").inc()
            log.warning(
                "cancelled an idle %s call of %s: nothing received within %gs"
                " (receiver.idle_call_timeout)",
                c.method,
                c.source,
                self.idle_timeout,
            )
            c.cancel()
        return idle

    def _watch(self) -> None:
        """Expire idle calls, sleeping until the first waiting call could be (or one
        begins to wait): an idle receiver's watchdog does not wake on a timer."""
        while not self._stop.is_set():
            with self._lock:
                since = [
                    c.waiting_since for c in self._calls.values() if c.waiting_since is not None
                ]
                timeout = None
                if since:
                    timeout = max(0.0, min(since) + self.idle_timeout - self._clock()) + 0.01
                if not self._stop.is_set():
                    self._waits.wait(timeout)
            try:
                self.expire_idle()
            except Exception:  # pragma: no cover - never let the watchdog die
                log.exception("idle call watchdog failed")
