"""What ``lr status`` shows of a sender session: its row of ``lrq_session_status``, and
the latency of its log batches' stages (:mod:`lr_client.latency`)."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import LRError
from lr_client.latency import StageBook
from lr_client.store import Inspection
from lr_client.store.latency import StageLatencies
from lr_server import metrics
from lr_server.window import InFlight

#: Seconds between writes of an unchanged session status row (``updated_at`` stays fresh).
STATUS_REFRESH = 30.0

#: (state, connected, in-flight batches, in-flight bytes, last error or why stopped)
Status = tuple[str, bool, int, int, str]


class StatusStore(Inspection, StageLatencies, Protocol):
    """Where the session's status and its stages' latency are written."""


class SendStages:
    """The stages of a destination's log batches that the session sees end: ``queued``
    and ``sent`` (known for the batches it read itself) and ``stored`` (the acknowledgement)."""

    def __init__(self, destination: str) -> None:
        self.destination = destination
        self.book = StageBook()

    def acked(self, f: InFlight, now: float) -> None:
        """``f`` was acknowledged at ``now`` (``time.monotonic()``)."""
        stored = now - f.sent_at
        metrics.BATCH_LATENCY.labels(self.destination).observe(stored)
        if f.kind != pb.BATCH_LOG_ENTRY or f.replay:
            return
        stages = [("stored", stored)]
        if f.queued >= 0:
            stages += [("queued", f.queued), ("sent", f.sending)]
        for stage, seconds in stages:
            self.book.add(self.destination, f.client, stage, seconds)
            metrics.STAGE_LATENCY.labels(self.destination, f.client, stage).observe(seconds)


class StatusRow:
    """Writes the row when the status changes, and at least every ``refresh`` s; the
    stages' latency at most every :data:`~lr_client.latency.FLUSH_INTERVAL` s."""

    def __init__(
        self, store: StatusStore, destination: str, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self.store = store
        self.destination = destination
        self.refresh = STATUS_REFRESH
        self.stages = SendStages(destination)
        self._log = log
        self._written: Status | None = None
        self._at = float("-inf")  # time.monotonic() of the last write

    def save(self, status: Status) -> None:
        self.stages.book.flush(self.store)
        now = time.monotonic()
        if status == self._written and now - self._at < self.refresh:
            return
        state, connected, batches, nbytes, error = status
        try:
            self.store.save_session_status(
                self.destination,
                state,
                connected=connected,
                inflight_batches=batches,
                inflight_bytes=nbytes,
                last_error=error,
            )
            self._written, self._at = status, now
        except LRError as exc:
            self._log.warning("cannot save session status: %s", exc)


__all__ = ["STATUS_REFRESH", "SendStages", "Status", "StatusRow", "StatusStore"]
