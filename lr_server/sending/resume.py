"""Where each client's stream resumes on a new connection: the plan carried out.

The session hands over what the sink reported at negotiation; the resumer reads
what the plan needs of the store (cursors, open full syncs, drops, stops, and for
a stream the sink may be behind on, the trim mark and the head), plans
(:func:`lr_server.sending.negotiation.plan`, pure) and applies each client's plan:
a stream to ship log entries from, a full sync to run, or a stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from lr_client.records import CascadeNode, Fence
from lr_server.config import ClientConfig, SnapshotProvider
from lr_server.sending import negotiation
from lr_server.sending.negotiation import ClientFacts, ClientPlan, SinkState, Step
from lr_server.sending.snapshot_requests import SnapshotRequests
from lr_server.sending.stops import StreamStops
from lr_server.sending.streams import ClientStream, Mode
from lr_server.stores import ResumeStore


class Resumer:
    """Plans and applies where one destination's streams resume."""

    def __init__(
        self,
        store: ResumeStore,
        source_id: str,
        destination: str,
        cascade: Mapping[str, CascadeNode],
        requests: SnapshotRequests,
        stops: StreamStops,
        fence: Callable[[str], Fence | None],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.store = store
        self.source_id = source_id
        self.destination = destination
        #: The session's rows of the cascaded clients it ships (the same mapping).
        self.cascade = cascade
        self.requests, self.stops, self.fence = requests, stops, fence
        self._log = log

    def plan(
        self, sink: dict[str, SinkState], clients: Mapping[str, ClientConfig]
    ) -> dict[str, ClientStream]:
        """Decide, per client, where to resume: read, plan (:func:`negotiation.plan`), apply."""
        facts = self._gather(sink, clients)
        plans = negotiation.plan(facts)
        checks = [name for name, p in plans.items() if p.step is Step.CHECK]
        if checks:
            for name in checks:
                lower = plans[name].lower_cursor_to
                if lower is not None:
                    # Lower the cursor first: a trim from now on keeps what the
                    # replay needs, and the trim mark read next covers any before.
                    self.store.shipping.set_cursor(
                        self.destination, name, lower, fence=self.fence(name)
                    )
            marks = {n: self._trimmed_through(n) for n in checks}
            # The highest position assigned, read without waiting for
            # transmitters: the sink can never be past it.
            head = self.store.inspection.head_position_estimate()
            sinks = {f.name: f.sink.last_position for f in facts}
            heads = {n: self._head(n, head, sinks[n]) for n in checks}
            facts = [
                replace(f, trimmed_through=marks[f.name], head=heads[f.name])
                if f.name in marks
                else f
                for f in facts
            ]
            plans = negotiation.plan(facts)
        return {name: self._apply(p, clients[p.name]) for name, p in plans.items()}

    def _origin(self, name: str) -> str | None:
        """The origin of a client this session relays (None: shipped from this node's log)."""
        node = self.cascade.get(name)
        return None if node is None or node.origin_id == self.source_id else node.origin_id

    def _trimmed_through(self, name: str) -> int:
        """Every entry of the stream above it is still held here (relayed: in the receive
        queue, after the base of the last full sync this node applied)."""
        origin = self._origin(name)
        if origin is None:
            return self.store.retention.trimmed_through(self.destination, name)
        return self.store.cascade.relay_resume_floor(name, origin)

    def _head(self, name: str, head: int, sink_position: int) -> int:
        """The highest position of the stream here (relayed: the last one received, or
        the sink's if higher: a child may hold entries this branch forwarded before it
        stored them (:mod:`lr_server.sending.relay_inbox`), and their positions are the
        origin's, so a child past what is stored here is not a sign of a database
        restored from a backup; it resumes where it is, and this node relays what
        follows once it has it)."""
        origin = self._origin(name)
        if origin is None:
            return head
        return max(self.store.recv.sink_progress(origin, name).last_position, sink_position)

    def _gather(
        self, sink: dict[str, SinkState], clients: Mapping[str, ClientConfig]
    ) -> list[ClientFacts]:
        """What the plan needs to know of each configured client (all but the trim marks)."""
        drops = {d.client_name: d for d in self.store.retention.list_drops(self.destination)}
        return [
            ClientFacts(
                name,
                config.snapshot != SnapshotProvider.NONE,
                sink.get(name, SinkState()),
                self.store.shipping.get_cursor(self.destination, name),
                self.requests.open_snapshot(name),
                drops.get(name),
                self.store.retention.get_stream_stop(self.destination, name),
            )
            for name, config in clients.items()
        ]

    def _apply(self, p: ClientPlan, config: ClientConfig) -> ClientStream:
        """Carry out one client's plan; the client's stream for this connection."""
        name, stream = p.name, ClientStream(config)
        if p.refuse is not None:
            self.requests.refuse(p.refuse)
        if p.clear_stop:
            self.stops.clear(name)
        if p.step is Step.RESUME_ACCEPTED:
            assert p.stop is not None
            self.stops.resume_accepted(stream, p.stop)
            return stream
        if p.finish is not None:
            self.requests.finish(name, p.finish)
            self.store.shipping.set_cursor(
                self.destination, name, p.sink_position, fence=self.fence(name)
            )
        drop = p.drop
        if p.record_drop is not None:
            d = p.record_drop
            drop = (
                self.store.retention.drop_stream(self.destination, name, d.reason, d.first_missing)
                or drop
            )
        if p.unstop and p.stop is not None:
            self.stops.clear(name)
            self._log.info("%s/%s: no longer stopped: %s", self.destination, name, p.stop.reason)
        if p.step is Step.STOP:
            self.stops.stop(stream, p.reason, p.resume_after)
        elif p.step is Step.SNAPSHOT:
            stream.mode, stream.snap_sent, stream.snapshot = (
                Mode.SNAPSHOT,
                p.snapshot_after,
                p.snapshot,
            )
            if p.snapshot is None:
                # Through the requests, which note the write: a read of the requests
                # begun before it (the board's, shared by the sessions) is not taken
                # for this one's, or its request would seem gone and be made again.
                stream.snapshot = req = self.requests.request(name, p.reason)
                sid = "?" if req is None else req.snapshot_id
                self._log.info("%s/%s: full sync %s (%s)", self.destination, name, sid, p.reason)
            if p.notify:
                stream.notice = self.stops.drop_notice(drop)
        else:
            assert p.step is Step.LOG  # a CHECK is planned again, with the trim mark
            stream.sent = p.resume_after
            if p.raise_cursor:
                self.store.shipping.set_cursor(
                    self.destination, name, p.resume_after, fence=self.fence(name)
                )
        return stream


__all__ = ["Resumer"]
