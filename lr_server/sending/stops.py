"""Stopped streams and drop notices: what a session does when a sink lacks entries.

A client with no snapshot provider cannot be resynced: its stream stops
(``lrq_stream_stops``, ``lr_stream_stopped``, an error logged once) until an
operator accepts the loss or configures a provider. A drop notice tells the
sink's listener of a loss before the full sync or the resumption that
follows it.

A log entry larger than the destination accepts (its ``max_message_bytes``,
announced at negotiation from protocol 6 on, or this site's, whichever is
smaller) can never ship: its stream stops the same way at that entry
(:meth:`StreamStops.sized`, ``lr_entry_too_large``), the error naming the
entry, the destination and both sizes, until an operator skips it with ``lr
accept-loss`` or raises the limits. A provider configured meanwhile does not
clear such a stop: a full sync would not make the entry fit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_client.records import DropRecord, Fence, SendEntry, StreamStop
from lr_server import metrics
from lr_server.config.models import WIRE_BYTES_PER_BATCH, WIRE_BYTES_PER_ENTRY
from lr_server.sending.streams import ClientStream, Mode, Notice
from lr_server.stores import StopStore


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
        self.max_message_bytes = 0  # the largest message the destination accepts (0: any)
        self._log = log
        #: When it last cleared a drop (``time.monotonic()``): older reads still have it.
        self.wrote = float("-inf")

    def negotiated(self, response: pb.NegotiateResponse, own_limit: int) -> None:
        """Note what the sink said of itself: drop notices, its largest message."""
        self.notices = bool(response.drop_notices)
        theirs = response.max_message_bytes
        self.max_message_bytes = min(own_limit, theirs) if theirs else own_limit

    def sized(self, cs: ClientStream, entries: list[SendEntry]) -> list[SendEntry]:
        """The entries that may be sent: those before the first that cannot fit in a
        message the destination accepts. At that entry (the first read) the stream stops."""
        limit = self.max_message_bytes
        for i, e in enumerate(entries):
            size = len(e.payload) + WIRE_BYTES_PER_ENTRY + WIRE_BYTES_PER_BATCH
            if limit and size > limit:
                if i == 0:
                    self.too_large(cs, e.position, size)
                return entries[:i]
        return entries

    def too_large(self, cs: ClientStream, position: int, size: int) -> None:
        """Stop a stream at an entry that can never ship; log entries resume after it
        once an operator accepts the loss."""
        name = cs.config.name
        reason = (
            f"entry {name}@{position} of {size} bytes on the wire exceeds the "
            f"{self.max_message_bytes} bytes {self.destination} accepts ({TOO_LARGE})"
        )
        cs.mode, cs.snapshot, cs.notice = Mode.STOPPED, None, None
        cs.stop_reason = f"{name}: {reason}"
        metrics.STREAM_STOPPED.labels(self.destination, name).set(1)
        metrics.ENTRY_TOO_LARGE.labels(self.destination, name).set(1)
        if self.store.retention.stop_stream(self.destination, name, reason, position):
            self._log.error(
                "%s/%s stopped: %s. It can never ship: raise max_message_bytes at %s and "
                "here and restart both, or skip it with `lr accept-loss` (log entries "
                "then resume after %d)",
                self.destination,
                name,
                reason,
                self.destination,
                position,
            )

    def stop(self, cs: ClientStream, reason: str, resume_after: int) -> None:
        """Stop a stream whose sink lacks entries the source no longer holds."""
        name = cs.config.name
        cs.mode, cs.snapshot, cs.notice = Mode.STOPPED, None, None
        cs.stop_reason = f"{name}: {reason}"
        metrics.STREAM_STOPPED.labels(self.destination, name).set(1)
        if self.store.retention.stop_stream(self.destination, name, reason, resume_after):
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
        """The stream is no longer stopped (a provider was configured, or nothing is missing);
        a stop at an entry too large stays (:meth:`sized` finds the entry again)."""
        stop = self.store.retention.get_stream_stop(self.destination, name)
        if stop is not None and stop.is_stopped and TOO_LARGE in stop.reason:
            return
        self.store.retention.clear_stream_stop(self.destination, name)
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
        self.store.retention.clear_drop(self.destination, name)
        self.wrote = time.monotonic()
        self.store.shipping.set_cursor(
            self.destination, name, resume_after, needs_snapshot=False, fence=self.fence(name)
        )
        self.store.retention.mark_stream_resumed(self.destination, name)
        metrics.STREAM_STOPPED.labels(self.destination, name).set(0)
        metrics.ENTRY_TOO_LARGE.labels(self.destination, name).set(0)

    def drop_notice(self, drop: DropRecord | None) -> Notice | None:
        """The notice that precedes the full sync of a dropped stream (if the sink takes it)."""
        if drop is None or not self.notices:
            return None
        return Notice(
            f"d{int(drop.dropped_at * 1e6)}", drop.first_dropped_position, drop.reason or "dropped"
        )


#: What the reason of a stop at an entry too large says of the limit.
TOO_LARGE = "max_message_bytes"


def is_accepted_notice(notice_id: str) -> bool:
    """Whether a drop notice announces a loss an operator accepted (not a drop)."""
    return notice_id.startswith("a")


__all__ = ["TOO_LARGE", "StreamStops", "is_accepted_notice"]
