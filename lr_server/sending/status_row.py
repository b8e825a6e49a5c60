"""A session's status row (``lrq_session_status``, what ``lr status`` shows of it).

The row is written when what it says changes, and otherwise once it is
``refresh`` seconds old, so ``updated_at`` stays fresh without a write per round.
A failed write is logged, never raised: the session ships on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import LRError
from lr_client.latency import StageBook
from lr_server import metrics
from lr_server.sending.streams import ClientStream, Mode
from lr_server.sending.window import InFlight
from lr_server.stores import StatusStore

#: Seconds between writes of an unchanged session status row (``updated_at`` stays fresh).
STATUS_REFRESH = 30.0

#: What the row says: state, connected, batches and bytes in flight, last error.
Status = tuple[str, bool, int, int, str]


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
    """Writes one destination's status row when it changes or grows old."""

    def __init__(
        self, store: StatusStore, destination: str, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self.store = store
        self.destination = destination
        self._log = log
        #: The latency of the stages of its log batches (written with the row).
        self.stages = SendStages(destination)
        #: The status last written, and when (time.monotonic()).
        self._written: Status | None = None
        self._at = float("-inf")

    def full_syncs(self, streams: Mapping[str, ClientStream]) -> None:
        """The gauge of which streams are in a full sync."""
        for name, cs in streams.items():
            active = 1 if cs.mode is Mode.SNAPSHOT else 0
            metrics.SNAPSHOT_ACTIVE.labels(self.destination, name).set(active)

    def save(self, status: Status, refresh: float = STATUS_REFRESH) -> None:
        """Write ``status`` if it changed, or if the row is ``refresh`` seconds old; the
        stages' latency at most every :data:`~lr_client.latency.FLUSH_INTERVAL` s."""
        self.stages.book.flush(self.store.latency)
        now = time.monotonic()
        if status == self._written and now - self._at < refresh:
            return
        try:
            self.store.inspection.save_session_status(
                self.destination,
                status[0],
                connected=status[1],
                inflight_batches=status[2],
                inflight_bytes=status[3],
                last_error=status[4],
            )
            self._written, self._at = status, now
        except LRError as exc:
            self._log.warning("cannot save session status: %s", exc)


__all__ = ["STATUS_REFRESH", "SendStages", "Status", "StatusRow"]
