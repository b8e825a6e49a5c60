"""One sender session between a source store and a sink store, driven step by step.

Tests use it to put the session in an exact state with no timing involved:
ship log entries, open a full sync, fix its base, let the session take one
round of its pump, and look at what the sink holds. The session's own
methods do the work (negotiation, one pump round, acknowledgements, the
periodic request check); only the loop around them is the test's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lr_client._proto import replication_pb2 as pb
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.records import ReplicationType, SnapshotStatus, WireEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.schema import tables as s
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.config import ClientConfig, ReplicationConfig
from lr_server.receiving.receiver import Receiver
from lr_server.sending.session import SenderSession
from lr_server.sending.streams import ClientStream
from lr_server.transport.base import BatchStream
from lr_server.transport.inproc import InProcessTransport
from tests.kit.sites import wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC


class Recorder(RoutingQueueListener):
    """Records every callback in order: ("log", positions), ("start", id), ..."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.events.append(("start", snapshot_id))

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.events.append(("snapshot", tuple(m.payload for m in messages)))
        return True

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.events.append(("end", snapshot_id))

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.events.append(("log", tuple(m.source_position for m in messages)))
        return True


class Rig:
    """A source store, a sink store and one session between them, driven by hand."""

    def __init__(
        self,
        src: SQLAlchemyQueueStore,
        sink: SQLAlchemyQueueStore,
        batch_max_entries: int,
        snapshot_batch_max_entries: int | None = None,
    ) -> None:
        self.src, self.sink = src, sink
        self.num = src.sites.register_sites(["b"])["b"]
        self.transport = InProcessTransport(Receiver(sink, "b", ["a"]), "a")
        self.session = SenderSession(
            src,
            "a",
            "b",
            [ClientConfig(CLIENT, snapshot="app")],
            lambda: self.transport,
            ReplicationConfig(
                batch_max_entries=batch_max_entries,
                snapshot_batch_max_entries=snapshot_batch_max_entries or batch_max_entries,
                poll_interval=0.01,
            ),
        )
        self.streams: dict[str, ClientStream] = {}
        self.stream: BatchStream | None = None

    def transmit(self, n: int) -> list[int]:
        """``n`` application transactions of one entry each; their positions."""
        refs = []
        for _ in range(n):
            with self.src.write() as conn:
                refs += self.src.send.append_log_entries(conn, CLIENT, [(b"e", [self.num])])
        return [p for p in self.src.send.positions_of(refs) if p is not None]

    def connect(self) -> None:
        request = pb.NegotiateRequest(source_id="a", clients=[CLIENT])
        self.streams = self.session._plan(self.transport.negotiate(request, 10.0))
        self.stream = self.transport.open_stream()

    def step(self) -> None:
        """One round of the session's pump: send what it may, take the acknowledgements."""
        assert self.stream is not None
        self.session._ship(self.stream, self.streams)
        self.session.acks.wait(threading.Event(), self.stream, self.streams, 0.0)

    def at_sink(self) -> list[tuple[ReplicationType, int]]:
        """(type, source position) of every entry in the sink's receive queue, in order."""
        r = s.recv_entries
        with self.sink.read() as conn:
            rows = conn.execute(select(r.c.type, r.c.source_position).order_by(r.c.seq)).all()
        return [(ReplicationType(t), p) for t, p in rows]

    def log_at_sink(self) -> list[int]:
        return [p for t, p in self.at_sink() if t is LOG]

    def provide(self, sid: str, payloads: list[bytes]) -> None:
        with self.src.write() as conn:
            self.src.snapshot_entries.write_snapshot_entries(conn, sid, 0, payloads)
        self.src.snapshot_entries.finish_snapshot(sid)

    def until_complete(self, sid: str) -> None:
        """Run the session (request checks included) until the sink has the whole snapshot."""

        def done() -> bool:
            self.session._check_requests(self.streams)
            self.step()
            snap = self.src.snapshots.get_snapshot(sid)
            return snap is not None and snap.status is SnapshotStatus.COMPLETED

        wait_for(done, timeout=60, interval=0.01)

    def drain(self, last: int) -> None:
        """Run the session until the sink has received every log entry up to ``last``."""

        def done() -> bool:
            self.step()
            return self.sink.recv.sink_progress("a", CLIENT).last_position >= last

        wait_for(done, timeout=60, interval=0.01)

    def deliver(self, listener: Recorder | None = None, **options: Any) -> list[tuple[str, object]]:
        """Deliver what the sink holds (what is ready of it) to ``listener``; its events.

        ``options`` go to the subscriber (``batch_size``, ``snapshot_batch_size``...).
        """
        listener = listener or Recorder()
        with RoutingQueueSubscriber(self.sink, CLIENT, listener, **options) as sub:
            while sub.poll_once():
                pass
        return listener.events


@contextmanager
def make_rig(
    src: SQLAlchemyQueueStore,
    make_url: Callable[[str], str],
    batch_max_entries: int = 100,
    snapshot_batch_max_entries: int | None = None,
) -> Iterator[Rig]:
    """A rig from ``src`` to a new sink whose queue already has the source's first entry."""
    sink = open_store(make_url("sink"))
    sink.create_schema()
    try:
        r = Rig(src, sink, batch_max_entries, snapshot_batch_max_entries)
        first = r.transmit(1)[0]
        # The sink already has the first entry: the session starts in log entry sync.
        sink.recv.apply_log_batch("a", CLIENT, [WireEntry(first, LOG, b"e")])
        yield r
    finally:
        sink.engine.dispose()
