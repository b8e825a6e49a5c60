"""A session's status row (``lrq_session_status``, what ``lr status`` shows of it).

The row is written when what it says changes, and otherwise once it is
``refresh`` seconds old, so ``updated_at`` stays fresh without a write per round.
A failed write is logged, never raised: the session ships on.
"""

from __future__ import annotations

import logging
import time

from lr_client.errors import LRError
from lr_server.stores import StatusStore

#: Seconds between writes of an unchanged session status row (``updated_at`` stays fresh).
STATUS_REFRESH = 30.0

#: What the row says: state, connected, batches and bytes in flight, last error.
Status = tuple[str, bool, int, int, str]


class StatusRow:
    """Writes one destination's status row when it changes or grows old."""

    def __init__(
        self, store: StatusStore, destination: str, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self.store = store
        self.destination = destination
        self._log = log
        #: The status last written, and when (time.monotonic()).
        self._written: Status | None = None
        self._at = float("-inf")

    def save(self, status: Status, refresh: float = STATUS_REFRESH) -> None:
        """Write ``status`` if it changed, or if the row is ``refresh`` seconds old."""
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


__all__ = ["STATUS_REFRESH", "Status", "StatusRow"]
