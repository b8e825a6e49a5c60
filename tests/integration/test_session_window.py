"""Session mechanics with scripted transports: the in-flight window, a lost acknowledgement."""

from __future__ import annotations

import threading
from collections.abc import Callable

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import TransportError
from lr_client.records import SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_server.config import ClientConfig, ReplicationConfig, RetryConfig
from lr_server.receiving.receiver import Receiver
from lr_server.sending.session import SenderSession
from lr_server.transport.base import BatchStream, Transport
from lr_server.transport.inproc import InProcessTransport
from tests.kit.wait import join, wait_for


class SilentStream(BatchStream):
    """Takes batches and never acknowledges them (a sink that stopped reading).

    Counts the session's waits for an acknowledgement (``polls``): each one ends a
    round of its loop in which it could have sent more.
    """

    def __init__(self, transport: SilentTransport) -> None:
        self.transport = transport

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.transport.sent.append(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        if self.transport.hung_up.is_set():
            raise TransportError("the sink hung up")
        self.transport.polls += 1
        threading.Event().wait(min(timeout, 0.01))
        return None

    def close(self) -> None:
        pass


class SilentTransport(Transport):
    """``hung_up``: the connection is gone (a stopping session then does not wait out
    its shutdown drain for acknowledgements that never come)."""

    def __init__(self) -> None:
        self.sent: list[pb.ReplicationBatch] = []
        self.polls = 0
        self.hung_up = threading.Event()

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        return pb.NegotiateResponse(sink_id="b")

    def open_stream(self) -> BatchStream:
        return SilentStream(self)


def test_window_bounds_batches_and_bytes(store: SQLAlchemyQueueStore) -> None:
    nums = store.sites.register_sites(["b"])
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(bytes(1000), [nums["b"]])] * 500)
    for cfg, expect in (
        (ReplicationConfig(batch_max_entries=10, window_batches=3, poll_interval=0.01), 3),
        # 10 KB batches against a 25 KB byte window: the third batch fills it
        (
            ReplicationConfig(
                batch_max_entries=10, window_batches=100, window_bytes=25_000, poll_interval=0.01
            ),
            3,
        ),
    ):
        transport = SilentTransport()
        session = SenderSession(
            store, "a", "b", [ClientConfig("policy")], lambda t=transport: t, cfg
        )
        stop = threading.Event()
        worker = threading.Thread(target=session.run, args=(stop,))
        worker.start()
        try:
            wait_for(lambda t=transport, n=expect: len(t.sent) >= n)
            # It keeps running (20 more rounds of its loop, each a chance to send),
            # but sends nothing more while nothing is acknowledged.
            polls = transport.polls
            wait_for(lambda t=transport, p=polls: t.polls >= p + 20, what="20 more rounds")
            assert len(transport.sent) == expect
            assert store.shipping.get_cursor("b", "policy").position == 0
        finally:
            transport.hung_up.set()
            stop.set()
            join(worker, 30)


class LosesEndMarkerAck(Transport):
    """Applies batches at the sink but loses the acknowledgement of the snapshot's end once."""

    def __init__(self, inner: InProcessTransport) -> None:
        self.inner = inner
        self.lost = False
        self.snapshot_batches_after_loss = 0

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        return self.inner.negotiate(request, timeout)

    def open_stream(self) -> BatchStream:
        outer = self
        stream = self.inner.open_stream()

        class Stream(BatchStream):
            def send(self, batch: pb.ReplicationBatch) -> None:
                if outer.lost and batch.kind == pb.BATCH_SNAPSHOT:
                    outer.snapshot_batches_after_loss += 1
                stream.send(batch)
                ends = [e for e in batch.entries if e.type == pb.LAST_FULL_SYNC_ENTRY]
                if ends and not outer.lost:
                    outer.lost = True
                    stream.next_ack(5.0)  # swallow it
                    raise TransportError("connection lost before the ack arrived")

            def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
                return stream.next_ack(timeout)

            def close(self) -> None:
                stream.close()

        return Stream()


def test_lost_end_marker_ack_completes_without_resending(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    sink = open_store(db_url_factory("sink"))
    sink.create_schema()
    try:
        store.sites.register_sites(["b"])
        sid = store.snapshots.request_snapshot(None, "b", "policy", "test")
        store.snapshots.start_snapshot(sid)
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(
                conn, sid, 0, [b"%d" % i for i in range(30)]
            )
        store.snapshot_entries.finish_snapshot(sid)
        transport = LosesEndMarkerAck(InProcessTransport(Receiver(sink, "b", ["a"]), "a"))
        cfg = ReplicationConfig(batch_max_entries=10, poll_interval=0.01)
        retry = RetryConfig(initial_backoff=0.01, max_backoff=0.05)
        session = SenderSession(
            store, "a", "b", [ClientConfig("policy", snapshot="app")], lambda: transport, cfg, retry
        )
        stop = threading.Event()
        worker = threading.Thread(target=session.run, args=(stop,))
        worker.start()
        try:
            wait_for(lambda: store.snapshots.get_snapshot(sid).status is SnapshotStatus.COMPLETED)  # type: ignore[union-attr]
        finally:
            stop.set()
            join(worker, 30)
        assert transport.lost
        assert transport.snapshot_batches_after_loss == 0
        assert sink.recv.sink_progress("a", "policy").entries_received == 31
    finally:
        sink.engine.dispose()


def test_window_bounds_batches_across_clients(store: SQLAlchemyQueueStore) -> None:
    """A round reads every client's batch before sending: the reads count against the window."""
    nums = store.sites.register_sites(["b"])
    clients = ["c1", "c2", "c3"]
    with store.write() as conn:
        for name in clients:
            store.send.append_log_entries(conn, name, [(b"x", [nums["b"]])] * 5)
    transport = SilentTransport()
    cfg = ReplicationConfig(batch_max_entries=10, window_batches=2, poll_interval=0.01)
    session = SenderSession(
        store, "a", "b", [ClientConfig(n) for n in clients], lambda: transport, cfg
    )
    stop = threading.Event()
    worker = threading.Thread(target=session.run, args=(stop,))
    worker.start()
    try:
        # The state is written after the first round, the one that reads all three.
        wait_for(lambda: session.state == "log_entry_sync")
        assert [b.client_name for b in transport.sent] == ["c1", "c2"]
    finally:
        transport.hung_up.set()
        stop.set()
        worker.join(timeout=30)


def test_lanes_keep_every_batch_within_the_batch_limits(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    """Over three lanes a read takes three batches' worth; each batch sent, a run of
    unkeyed entries included, stays within ``batch_max_entries`` (the sink refuses more)."""
    sink = open_store(db_url_factory("sink"))
    sink.create_schema()
    try:
        nums = store.sites.register_sites(["b"])
        rows = [(b"u%d" % i, [nums["b"]]) for i in range(70)]  # unkeyed, in a row
        rows += [(b"k%d" % i, [nums["b"]], b"key%d" % (i % 7)) for i in range(70)]
        with store.write() as conn:
            store.send.append_log_entries(conn, "policy", rows)
        receiver = Receiver(sink, "b", ["a"], max_batch_entries=20)
        cfg = ReplicationConfig(batch_max_entries=20, poll_interval=0.01, streams_per_destination=3)
        session = SenderSession(
            store,
            "a",
            "b",
            [ClientConfig("policy")],
            lambda: InProcessTransport(receiver, "a"),
            cfg,
            RetryConfig(initial_backoff=0.01, max_backoff=0.05),
        )
        stop = threading.Event()
        worker = threading.Thread(target=session.run, args=(stop,))
        worker.start()
        try:
            wait_for(
                lambda: sink.recv.sink_progress("a", "policy").entries_received == 140,
                detail=lambda: f"{sink.recv.sink_progress('a', 'policy')} {session.last_error}",
            )
            last = store.shipping.read_client_log("policy", 0, 1000)[-1].position
            wait_for(  # the final low-water mark moves the cursor to the end
                lambda: store.shipping.get_cursor("b", "policy").position == last,
                detail=lambda: f"cursor {store.shipping.get_cursor('b', 'policy')}, last {last}",
            )
        finally:
            stop.set()
            join(worker, 30)
        assert session.last_error == ""
    finally:
        sink.engine.dispose()


def test_lanes_are_refused_by_a_sink_of_protocol_3_and_nothing_is_shipped(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    sink = open_store(db_url_factory("sink"))
    sink.create_schema()

    class OldSink(InProcessTransport):
        def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
            response = super().negotiate(request, timeout)
            response.protocol_version = 3
            return response

    try:
        nums = store.sites.register_sites(["b"])
        with store.write() as conn:
            store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]], b"k")])
        receiver = Receiver(sink, "b", ["a"])
        session = SenderSession(
            store,
            "a",
            "b",
            [ClientConfig("policy")],
            lambda: OldSink(receiver, "a"),
            ReplicationConfig(poll_interval=0.01, streams_per_destination=2),
            RetryConfig(initial_backoff=0.01, max_backoff=0.05),
        )
        stop = threading.Event()
        worker = threading.Thread(target=session.run, args=(stop,))
        worker.start()
        try:
            wait_for(lambda: "streams_per_destination > 1 needs 4" in session.last_error)
        finally:
            stop.set()
            join(worker, 30)
        assert session.last_error.startswith("IncompatibleVersionError")
        assert sink.queues.list_queues() == []
    finally:
        sink.engine.dispose()
