"""Stopped streams and drop notices: what a session does when a sink lacks entries.

A client with no snapshot provider cannot be resynced: its stream stops
(``lrq_stream_stops``, ``lr_stream_stopped``, an error logged once) until an
operator accepts the loss or configures a provider. A drop notice tells the
sink's listener of a loss before the full sync or the resumption that
follows it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from lr_client.records import DropRecord, Fence, StreamStop
from lr_client.store import Retention, Shipping
from lr_server import metrics
from lr_server.streams import ClientStream, Mode, Notice


class StopStore(Retention, Shipping, Protocol):
    """What it needs of the store: stream stops, drop records, cursors."""


class StreamStops:
    """Stops, resumptions and drop notices of one destination's streams."""

    def __init__(
        self,
        store: StopStore,
        destination: str,
        log: logging.LoggerAdapter[logging.Logger],
        fence: Callable[[str], Fence | None] = lambda _client: None,
    ) -> None:
        self.store = store
        self.destination = destination
        self.fence = fence  # the lease a client's stream is written under (None: unfenced)
        self.notices = False  # the sink accepts drop notices (it said so when negotiating)
        self._log = log

    def stop(self, cs: ClientStream, reason: str, resume_after: int) -> None:
        """Stop a stream whose sink lacks entries the source no longer holds."""
        name = cs.config.name
        cs.mode, cs.snapshot, cs.notice = Mode.STOPPED, None, None
        cs.stop_reason = f"{name}: {reason}"
        metrics.STREAM_STOPPED.labels(self.destination, name).set(1)
        if self.store.stop_stream(self.destination, name, reason, resume_after):
            self._log.error(
                "%s/%s stopped: %s. The client has no snapshot provider: configure one and "
                "restart the server (a full sync follows), or accept the loss with "
                "`lr accept-loss` (log entries then resume after %d)",
                self.destination,
                name,
                reason,
                resume_after,
            )

    def clear(self, name: str) -> None:
        """The stream is no longer stopped (a provider was configured, or nothing is missing)."""
        self.store.clear_stream_stop(self.destination, name)
        metrics.STREAM_STOPPED.labels(self.destination, name).set(0)

    def resume_accepted(self, cs: ClientStream, stop: StreamStop) -> None:
        """An operator accepted the loss: notify the sink, then ship after ``resume_after``."""
        assert stop.accepted_at is not None
        name = cs.config.name
        cs.mode, cs.sent, cs.stop_reason = Mode.LOG, stop.resume_after, ""
        self._log.warning(
            "%s/%s: loss accepted by an operator; log entries resume after %d (%s)",
            self.destination,
            name,
            stop.resume_after,
            stop.reason,
        )
        if self.notices:
            cs.notice = Notice(
                f"a{int(stop.accepted_at * 1e6)}",
                stop.resume_after + 1,
                f"loss accepted by an operator: {stop.reason}",
            )
        else:  # the sink cannot be told; nothing to wait for
            self.resumed(name, stop.resume_after)

    def resumed(self, name: str, resume_after: int) -> None:
        """The stream runs again after an accepted loss (the sink has the notice)."""
        self.store.clear_drop(self.destination, name)
        self.store.set_cursor(
            self.destination, name, resume_after, needs_snapshot=False, fence=self.fence(name)
        )
        self.store.mark_stream_resumed(self.destination, name)
        metrics.STREAM_STOPPED.labels(self.destination, name).set(0)

    def drop_notice(self, drop: DropRecord | None) -> Notice | None:
        """The notice that precedes the full sync of a dropped stream (if the sink takes it)."""
        if drop is None or not self.notices:
            return None
        return Notice(
            f"d{int(drop.dropped_at * 1e6)}", drop.first_dropped_position, drop.reason or "dropped"
        )


def is_accepted_notice(notice_id: str) -> bool:
    """Whether a drop notice announces a loss an operator accepted (not a drop)."""
    return notice_id.startswith("a")


__all__ = ["StreamStops", "is_accepted_notice"]
