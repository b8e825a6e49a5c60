"""A session's acknowledgements: the window settled, cursors saved, full syncs advanced.

An acknowledged log batch moves its client's cursor, saved in coalesced writes at
most every ``FLUSH_INTERVAL`` s (:meth:`~lr_server.sending.window.Window.flush_due`),
by the wait for acknowledgements when none comes; over lanes, only to the lowest
position acknowledged on every lane. An acknowledged snapshot batch records how far
the full sync shipped; the acknowledgement of its end completes it, unless a newer one
superseded it (:meth:`~lr_server.sending.snapshot_requests.SnapshotRequests.end_acked`);
an accepted loss's notice lets its stream run again; a replay's batch moves the replay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_client.records import Fence, SnapshotStatus
from lr_server import metrics
from lr_server.sending.replay import Replayer
from lr_server.sending.snapshot_requests import SnapshotRequests
from lr_server.sending.status_row import SendStages
from lr_server.sending.stops import StreamStops, is_accepted_notice
from lr_server.sending.streams import ClientStream
from lr_server.sending.window import Window
from lr_server.stores import AckStore
from lr_server.transport.base import BatchStream
from lr_server.transport.lanes import LaneStreams

#: Seconds an idle session takes at most to see its stop, unless whoever stops it wakes it
#: (``stop_check = None``: a server does).
STOP_CHECK = 0.25


class Acknowledgements:
    """Takes one destination's acknowledgements and does what each settles."""

    def __init__(
        self,
        store: AckStore,
        destination: str,
        window: Window,
        stops: StreamStops,
        requests: SnapshotRequests,
        replays: Replayer,
        fence: Callable[[str], Fence | None],
        woken: Callable[[], bool] = lambda: False,
        stages: SendStages | None = None,
    ) -> None:
        self.store = store
        self.destination = destination
        self.window = window
        self.stops, self.requests, self.replays = stops, requests, replays
        self.fence = fence
        #: Whether the session was woken meanwhile (its wait for acknowledgements ends).
        self.woken = woken
        #: The latency of the stages its log batches went through (SendStages).
        self.stages = stages if stages is not None else SendStages(destination)
        #: Seconds between looks at the stop while waiting; None: none, the stop wakes it.
        self.stop_check: float | None = STOP_CHECK

    def wait(
        self,
        stop: threading.Event,
        stream: BatchStream,
        streams: dict[str, ClientStream],
        timeout: float,
    ) -> int:
        """Handle acknowledgements for up to ``timeout`` s, or until a wake-up or the stop
        (seen within ``stop_check`` s, or at once where the stop wakes it); how many came.
        Cursors that acknowledgements moved are saved when due, within the wait too."""
        deadline = time.monotonic() + timeout
        check = self.stop_check
        if check is None and type(stream).interrupt is BatchStream.interrupt:
            check = STOP_CHECK  # a wake-up cannot end its wait
        while True:
            now = time.monotonic()
            left = deadline - now
            slice_ = left if check is None else min(left, check)
            flush = self.window.flush_in(now)
            if flush is not None:
                slice_ = min(slice_, flush)
            n = self.drain(stream, streams, max(0.0, slice_))
            if self.window.flush_due(time.monotonic()):
                self.flush_cursors()
            if n or left <= slice_ or self.woken() or stop.is_set():
                return n

    def drain(self, stream: BatchStream, streams: dict[str, ClientStream], timeout: float) -> int:
        """Handle the acknowledgements that come within ``timeout``; how many."""
        n = 0
        if isinstance(stream, LaneStreams):
            got = stream.next_ack_from(timeout)
            while got is not None:
                self.on_ack(got[1], streams, got[0])
                n += 1
                got = stream.next_ack_from(0.0)
            return n
        ack = stream.next_ack(timeout)
        while ack is not None:
            self.on_ack(ack, streams)
            n += 1
            ack = stream.next_ack(0.0)
        return n

    def on_ack(
        self, ack: pb.ReplicationAck, streams: dict[str, ClientStream], index: int = 0
    ) -> None:
        """Settle what one acknowledgement (of lane ``index``) covers."""
        done = self.window.acknowledge(ack.batch_id, index)
        now = time.monotonic()
        for f in done:
            if f.replay:
                self.replays.acked(f)
                continue
            if f.lane:  # the cursor: the lowest position acknowledged on every lane
                ls = streams[f.client].lanes
                if ls is not None and ls.settled(f.batch_id, f.low_water):
                    self.window.cursors[f.client] = ls.cursor
            self.stages.acked(f, now)  # the stages' latency
            metrics.BATCHES_ACKED.labels(self.destination).inc()
            metrics.ENTRIES_SHIPPED.labels(self.destination, f.client).inc(f.entries)
            metrics.BYTES_SHIPPED.labels(self.destination, f.client).inc(f.nbytes)
            if f.kind == pb.BATCH_LOG_ENTRY:
                continue  # its cursor is coalesced below
            if f.kind == pb.BATCH_DROP_NOTICE:
                if is_accepted_notice(f.snapshot_id):  # an accepted loss: the stream runs again
                    self.stops.resumed(f.client, f.last_position - 1)
            elif f.is_end:
                self.requests.end_acked(f.snapshot_id, streams[f.client])
            else:
                metrics.SNAPSHOT_ROWS.labels(self.destination, f.client).set(f.last_position)
                self.store.snapshots.update_snapshot(
                    f.snapshot_id,
                    expect=[SnapshotStatus.READY],
                    destination=self.destination,
                    shipped_position=f.last_position,
                )
        # Log acks from before a snapshot's end must not move the cursor past its base.
        self.window.coalesce(done)
        if self.window.flush_due(now):
            self.flush_cursors()
        metrics.INFLIGHT_BATCHES.labels(self.destination).set(len(self.window))

    def settle(
        self, stream: BatchStream, streams: dict[str, ClientStream], seconds: float = 5.0
    ) -> None:
        """Before the stream closes: the acknowledgements of the batches in flight, for
        up to ``seconds``, and the cursors they moved saved."""
        deadline = time.monotonic() + seconds
        while self.window.batches and time.monotonic() < deadline:
            self.drain(stream, streams, 0.1)
        self.flush_cursors()

    def flush_cursors(self) -> None:
        """Save the cursors the acknowledgements moved."""
        for client, position in self.window.cursors.items():
            self.store.shipping.set_cursor(
                self.destination, client, position, fence=self.fence(client)
            )
        self.window.flushed(time.monotonic())


__all__ = ["STOP_CHECK", "Acknowledgements"]
