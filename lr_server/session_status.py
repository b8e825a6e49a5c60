"""A sender session's row of ``lrq_session_status``: what ``lr status`` shows of it."""

from __future__ import annotations

import logging
import time

from lr_client.errors import LRError
from lr_client.store import Inspection

#: Seconds between writes of an unchanged session status row (``updated_at`` stays fresh).
STATUS_REFRESH = 30.0

#: (state, connected, in-flight batches, in-flight bytes, last error or why stopped)
Status = tuple[str, bool, int, int, str]


class StatusRow:
    """Writes the row when the status changes, and at least every ``refresh`` s."""

    def __init__(
        self, store: Inspection, destination: str, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self.store = store
        self.destination = destination
        self.refresh = STATUS_REFRESH
        self._log = log
        self._written: Status | None = None
        self._at = float("-inf")  # time.monotonic() of the last write

    def save(self, status: Status) -> None:
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


__all__ = ["STATUS_REFRESH", "Status", "StatusRow"]
