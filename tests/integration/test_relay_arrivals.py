"""A branch relays a batch as soon as its receiver stores it: the receiver rings the
sessions relaying the client (:mod:`lr_server.sending.arrivals`), which wait neither for
their next poll nor for an acknowledgement, and a relay read resumes where the
last one ended. On both backends, with in-process transports (the sessions' poll
is an hour: a session that waited for it would relay nothing while a test runs)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import StoreUnavailableError
from lr_client.records import CascadeNode
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.schema import tables as schema
from lr_server.config import (
    ClientConfig,
    DestinationConfig,
    ReplicationConfig,
    SecurityConfig,
    load_config,
)
from lr_server.protocol.versions import PROTOCOL_VERSION
from lr_server.receiving.receiver import Receiver
from lr_server.sending.arrivals import Arrivals
from lr_server.sending.session import SenderSession
from lr_server.server import SiteServer
from lr_server.transport.base import BatchStream, Transport
from lr_server.transport.grpc_client import GrpcTransport
from lr_server.transport.inproc import InProcessTransport
from lr_server.transport.lanes import LaneStreams
from tests.kit.relayed import from_root
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.wait import join, scaled, wait_for

#: A session that waited for its poll would relay nothing while the test runs.
HOUR = 3600.0


def _relaying(
    store: SQLAlchemyQueueStore,
    node: CascadeNode,
    arrivals: Arrivals,
    transport: Callable[[], Transport],
) -> SenderSession:
    """The branch ``s3``'s session to its child ``s4``, relaying ``policy`` (its poll an
    hour), woken by ``arrivals``."""
    return SenderSession(
        store,
        "s3",
        "s4",
        [ClientConfig("policy")],
        transport,
        ReplicationConfig(poll_interval=HOUR),
        cascade={"policy": node},
        arrivals=arrivals,
    )


@pytest.fixture
def leaf(db_url_factory: Callable[[str], str]) -> Iterator[SQLAlchemyQueueStore]:
    """The store of the leaf ``s4``, which takes ``policy`` (origin ``s1``) from ``s3``."""
    leaf = open_store(db_url_factory("s4"))
    leaf.create_schema()
    try:
        leaf.cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
        yield leaf
    finally:
        leaf.engine.dispose()


@contextlib.contextmanager
def _running(
    session: SenderSession, arrivals: Arrivals, held: HeldAcks | None = None
) -> Iterator[None]:
    stop = threading.Event()
    worker = threading.Thread(target=session.run, args=(stop,), daemon=True)
    worker.start()
    try:
        yield
    finally:
        if held is not None:  # the test is over: acknowledge, so the session stops at once
            held.release()
        stop.set()
        arrivals.ring("s1", "policy")  # end its wait now
        join(worker, 30)


def test_the_receiver_tells_of_each_log_batch_it_stores(store: SQLAlchemyQueueStore) -> None:
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    told: list[tuple[str, str, int]] = []
    receiver = Receiver(store, "s3", ["s1"], on_stored=lambda s, c, last: told.append((s, c, last)))
    receiver.apply("s1", from_root(1))
    assert told == [("s1", "policy", 1)]
    assert receiver.apply("s1", from_root(1)).duplicate  # nothing stored: nothing told
    assert told == [("s1", "policy", 1)]


def test_arrivals_wake_the_listeners_of_the_client_until_forgotten() -> None:
    arrivals = Arrivals()
    woken: list[str] = []
    policy, other = (lambda: woken.append("policy")), (lambda: woken.append("other"))
    arrivals.listen(["policy"], policy)
    arrivals.listen(["other", "policy"], other)
    arrivals.ring("s1", "policy")
    assert woken == ["policy", "other"]
    arrivals.forget(policy)
    arrivals.ring("s1", "policy")
    arrivals.ring("s1", "third")
    assert woken == ["policy", "other", "other"]


def test_a_listener_s_bound_methods_are_forgotten() -> None:
    """A session listens with its bound methods and forgets them with new ones, equal
    but not the same objects: a stopped session is woken no more."""

    class Listener:
        def __init__(self) -> None:
            self.woken = 0

        def wake(self) -> None:
            self.woken += 1

    arrivals, listener = Arrivals(), Listener()
    arrivals.listen(["policy"], listener.wake)
    arrivals.ring("s1", "policy")
    arrivals.forget(listener.wake)
    arrivals.ring("s1", "policy")
    assert listener.woken == 1


class HeldAcks(Transport):
    """A sink that takes batches and acknowledges none; its waits end only when
    interrupted (or after their timeout)."""

    def __init__(self) -> None:
        self.sent: list[pb.ReplicationBatch] = []
        self.released = False  # from then on, every batch is acknowledged
        self.acked = 0  # batches of ``sent`` acknowledged since

    def release(self) -> None:
        """Acknowledge what was sent and what will be (a session that stops waits up
        to 5 s for its batches in flight to be acknowledged)."""
        self.released = True

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        return pb.NegotiateResponse(sink_id="s4", protocol_version=PROTOCOL_VERSION)

    def open_stream(self) -> BatchStream:
        return HeldAcksStream(self)


class HeldAcksStream(BatchStream):
    def __init__(self, transport: HeldAcks) -> None:
        self.transport = transport
        self.woken: queue.Queue[None] = queue.Queue()

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.transport.sent.append(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        held = self.transport
        if held.released and held.acked < len(held.sent):
            batch = held.sent[held.acked]
            held.acked += 1
            return pb.ReplicationAck(batch_id=batch.batch_id, last_position=batch.last_position)
        with contextlib.suppress(queue.Empty):
            self.woken.get(timeout=timeout)
        return None

    def interrupt(self) -> None:
        self.woken.put(None)

    def close(self) -> None:
        pass


def test_a_branch_relays_a_batch_stored_while_the_previous_one_is_in_flight(
    store: SQLAlchemyQueueStore,
) -> None:
    """The provider gathered the relayed entries into its batches: the branch sends
    each as it is stored, without waiting for the acknowledgement of the last."""
    node = store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    arrivals = Arrivals()
    receiver = Receiver(store, "s3", ["s1"], on_stored=arrivals.ring)
    sink = HeldAcks()
    session = _relaying(store, node, arrivals, lambda: sink)
    with _running(session, arrivals, sink):
        wait_for(lambda: session.connected, timeout=scaled(30), what="the session connected")
        receiver.apply("s1", from_root(1))
        wait_for(lambda: len(sink.sent) == 1, timeout=scaled(30), what="the first batch")
        receiver.apply("s1", from_root(2))  # the first is not acknowledged, nor ever will be
        wait_for(lambda: len(sink.sent) == 2, timeout=scaled(30), what="the second batch")
        assert [(b.first_position, b.previous_position) for b in sink.sent] == [(1, 0), (2, 1)]


def test_a_branch_relays_a_stored_batch_without_waiting_for_its_poll(
    store: SQLAlchemyQueueStore, leaf: SQLAlchemyQueueStore
) -> None:
    branch = store
    node = branch.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    arrivals = Arrivals()
    receiver = Receiver(branch, "s3", ["s1"], on_stored=arrivals.ring)
    receiver.apply("s1", from_root(1))  # stored before the session starts
    at_leaf = Receiver(leaf, "s4", ["s3"])
    session = _relaying(branch, node, arrivals, lambda: InProcessTransport(at_leaf, "s3"))
    with _running(session, arrivals):
        received = lambda: leaf.recv.sink_progress("s1", "policy").last_position  # noqa: E731
        wait_for(lambda: received() == 1, timeout=scaled(30), what="the first entry")
        # Caught up with nothing in flight: the session waits. What is stored now
        # goes at once, not after the hour's poll.
        receiver.apply("s1", from_root(2))
        wait_for(lambda: received() == 2, timeout=scaled(30), what="the entry stored later")
        assert [e.position for e in leaf.cascade.read_relay("policy", "s1", 0, 10)] == [1, 2]


def test_every_stream_s_wait_for_an_acknowledgement_ends_when_interrupted(
    tmp_path: Path,
) -> None:
    """gRPC, in-process and lanes: :meth:`BatchStream.interrupt` ends the wait (None)."""
    port = free_port()
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    spec = SiteSpec("sink", url, port=port, sources=["s3"])
    server = SiteServer(load_config(write_config(tmp_path, spec, security="token")))
    server.start()
    store = open_store(url)
    try:
        dest = DestinationConfig(id="sink", address=f"127.0.0.1:{port}", server_name="sink")
        security = SecurityConfig(transport="plaintext", client_auth="token", token="token-s3")
        grpc = GrpcTransport("s3", dest, security, 1 << 20)
        local = InProcessTransport(Receiver(store, "sink", ["s3"]), "s3")
        streams = {
            "grpc": grpc.open_stream(),
            "in-process": local.open_stream(),
            "lanes": LaneStreams([local.open_stream(), local.open_stream()]),
        }
        for kind, stream in streams.items():
            got: list[object] = []
            waiter = threading.Thread(
                target=lambda s=stream, g=got: g.append(s.next_ack(HOUR)), daemon=True
            )
            waiter.start()
            stream.interrupt()
            waiter.join(scaled(30))
            assert not waiter.is_alive() and got == [None], kind
            stream.close()
        grpc.close()
    finally:
        server.stop()
        store.engine.dispose()


def test_a_relay_read_resumes_at_the_entry_the_last_one_ended_at(
    store: SQLAlchemyQueueStore,
) -> None:
    """A relayed queue keeps what the nodes below have not acknowledged; a read after
    the position where the last read ended does not pass those entries again."""
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    receiver = Receiver(store, "s3", ["s1"])
    for position in (1, 2, 3):
        receiver.apply("s1", from_root(position))
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 0, 10)] == [1, 2, 3]
    # A trap the queue never holds (an entry stored before the read's end with a higher
    # position): only a read that passes the entries before its start again finds it.
    e = schema.recv_entries
    with store.write() as conn:
        conn.execute(update(e).where(e.c.source_position == 1).values(source_position=99))
    receiver.apply("s1", from_root(4))
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 3, 10)] == [4]
    # Where no read ended, it reads from the relay's start, as ever (and finds the trap).
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 2, 10)] == [99]


# -- forwarding before storing (lr_server.sending.relay_inbox) ---------------------------------


def _forwarding_receiver(store: SQLAlchemyQueueStore, arrivals: Arrivals) -> Receiver:
    """The branch ``s3``'s receiver as its server wires it: it hands each batch to the
    sessions relaying it before storing it, and tells them once stored."""
    return Receiver(store, "s3", ["s1"], on_stored=arrivals.ring, on_received=arrivals.offer)


def test_a_branch_forwards_a_batch_before_it_has_stored_it(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    arrivals = Arrivals()
    receiver = _forwarding_receiver(store, arrivals)
    sink = HeldAcks()
    session = _relaying(store, node, arrivals, lambda: sink)
    release = threading.Event()
    store_batch = store.recv.apply_log_batch

    def held(*args: Any, **kwargs: Any) -> tuple[bool, int]:
        assert release.wait(scaled(60)), "the test never let the branch store"
        return store_batch(*args, **kwargs)

    monkeypatch.setattr(store.recv, "apply_log_batch", held)
    with _running(session, arrivals, sink):
        wait_for(lambda: session.connected, timeout=scaled(30), what="the session connected")
        applying = threading.Thread(target=receiver.apply, args=("s1", from_root(1)))
        applying.start()
        try:
            wait_for(lambda: len(sink.sent) == 1, timeout=scaled(30), what="the forwarded batch")
            assert store.recv.sink_progress("s1", "policy").last_position == 0  # not stored yet
        finally:
            release.set()
            join(applying, 30)
        batch = sink.sent[0]
        assert (batch.source_id, batch.previous_position) == ("s1", 0)
        assert [(e.position, e.opaque_payload) for e in batch.entries] == [(1, b"x1")]
        assert store.recv.sink_progress("s1", "policy").last_position == 1


def test_a_batch_the_branch_failed_to_store_reaches_the_leaf_once(
    store: SQLAlchemyQueueStore,
    leaf: SQLAlchemyQueueStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forwarded, then the branch's transaction fails: the provider sends the batch
    again, the branch stores it, and the leaf, which has it, keeps it once."""
    branch = store
    node = branch.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    arrivals = Arrivals()
    receiver = _forwarding_receiver(branch, arrivals)
    at_leaf = Receiver(leaf, "s4", ["s3"])
    session = _relaying(branch, node, arrivals, lambda: InProcessTransport(at_leaf, "s3"))
    store_batch = branch.recv.apply_log_batch

    def failing(*args: Any, **kwargs: Any) -> tuple[bool, int]:
        raise StoreUnavailableError("the branch's database went away")

    with _running(session, arrivals):
        wait_for(lambda: session.connected, timeout=scaled(30), what="the session connected")
        received = lambda: leaf.recv.sink_progress("s1", "policy").last_position  # noqa: E731
        monkeypatch.setattr(branch.recv, "apply_log_batch", failing)
        with pytest.raises(StoreUnavailableError):
            receiver.apply("s1", from_root(1))
        wait_for(lambda: received() == 1, timeout=scaled(30), what="the forwarded entry")
        assert branch.recv.sink_progress("s1", "policy").last_position == 0
        monkeypatch.setattr(branch.recv, "apply_log_batch", store_batch)
        assert not receiver.apply("s1", from_root(1)).duplicate  # sent again, stored
        receiver.apply("s1", from_root(2))
        wait_for(lambda: received() == 2, timeout=scaled(30), what="the next entry")
    assert [e.position for e in leaf.cascade.read_relay("policy", "s1", 0, 10)] == [1, 2]
    assert leaf.recv.sink_progress("s1", "policy").entries_received == 2
    assert branch.snapshots.list_snapshots() == []  # no full sync anywhere


def test_a_child_past_what_its_branch_stored_resumes_where_it_is(
    store: SQLAlchemyQueueStore, leaf: SQLAlchemyQueueStore
) -> None:
    """A child can hold entries its branch forwarded and then failed to store (or, after
    a provider switch, got from another node): their positions are the origin's, so it
    is no restored database. It resumes where it is, without a full sync or a stop, and
    gets what follows once the branch has it."""
    branch = store
    node = branch.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    at_leaf = Receiver(leaf, "s4", ["s3"])
    for position in (1, 2):
        at_leaf.apply("s3", from_root(position))
    arrivals = Arrivals()
    receiver = _forwarding_receiver(branch, arrivals)
    receiver.apply("s1", from_root(1))  # the branch has 1 only
    session = _relaying(branch, node, arrivals, lambda: InProcessTransport(at_leaf, "s3"))
    with _running(session, arrivals):
        wait_for(lambda: session.connected, timeout=scaled(30), what="the session connected")
        for position in (2, 3):
            receiver.apply("s1", from_root(position))
        received = lambda: leaf.recv.sink_progress("s1", "policy").last_position  # noqa: E731
        wait_for(lambda: received() == 3, timeout=scaled(30), what="the entry after it")
    assert [e.position for e in leaf.cascade.read_relay("policy", "s1", 0, 10)] == [1, 2, 3]
    assert branch.snapshots.list_snapshots() == []
    assert branch.retention.get_stream_stop("s4", "policy") is None


def test_a_relay_read_that_finds_nothing_marks_where_the_next_one_starts(
    store: SQLAlchemyQueueStore,
) -> None:
    """A branch that forwards batches before storing them reads after positions no read
    ended at, and finds nothing: that read marks the queue's end, so the next read after
    the same position does not pass the entries before it again."""
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    receiver = Receiver(store, "s3", ["s1"])
    for position in (1, 2, 3):
        receiver.apply("s1", from_root(position))
    assert store.cascade.read_relay("policy", "s1", 3, 10) == []  # no read ended at 3
    # The trap of the test above: only a read that passes the entries before 3 finds it.
    e = schema.recv_entries
    with store.write() as conn:
        conn.execute(update(e).where(e.c.source_position == 1).values(source_position=99))
    assert store.cascade.read_relay("policy", "s1", 3, 10) == []
    receiver.apply("s1", from_root(4))
    assert [e.position for e in store.cascade.read_relay("policy", "s1", 3, 10)] == [4]


def test_arrivals_remember_what_was_stored_here_for_a_while() -> None:
    arrivals = Arrivals()
    assert not arrivals.nothing_stored_past("s1", "policy", 10)  # nothing known
    arrivals.ring("s1", "policy", 7)
    assert arrivals.nothing_stored_past("s1", "policy", 7)
    assert arrivals.nothing_stored_past("s1", "policy", 9)
    assert not arrivals.nothing_stored_past("s1", "policy", 6)  # 7 is past 6
    assert not arrivals.nothing_stored_past("s2", "policy", 9)  # another origin's
    arrivals.ring("s1", "policy", 5)  # a lower position does not lower it
    assert not arrivals.nothing_stored_past("s1", "policy", 6)
    arrivals.ring("s1", "policy")  # a wake-up that says no position changes nothing
    assert arrivals.nothing_stored_past("s1", "policy", 7)
    expired = Arrivals(stored_ttl=0.0)
    expired.ring("s1", "policy", 7)
    assert not expired.nothing_stored_past("s1", "policy", 9)  # not trusted any more


def _counting_reads(store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``after`` of every read of the receive queue for relaying, as it happens."""
    reads: list[int] = []
    read = store.cascade.read_relay

    def counted(client: str, origin: str, after: int, *args: Any, **kwargs: Any) -> Any:
        reads.append(after)
        return read(client, origin, after, *args, **kwargs)

    monkeypatch.setattr(store.cascade, "read_relay", counted)
    return reads


@pytest.mark.parametrize("stored_ttl", [3600.0, 0.0])
def test_a_branch_that_forwarded_all_it_stored_does_not_read_its_queue_again(
    store: SQLAlchemyQueueStore,
    leaf: SQLAlchemyQueueStore,
    monkeypatch: pytest.MonkeyPatch,
    stored_ttl: float,
) -> None:
    """Each batch forwarded as received, then stored here: a read of the receive queue
    after it would find nothing, and is not made while this process's stores are recent
    (``stored_ttl``; with none trusted, every wake-up reads, as before)."""
    branch = store
    node = branch.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    arrivals = Arrivals(stored_ttl=stored_ttl)
    receiver = _forwarding_receiver(branch, arrivals)
    at_leaf = Receiver(leaf, "s4", ["s3"])
    session = _relaying(branch, node, arrivals, lambda: InProcessTransport(at_leaf, "s3"))
    received = lambda: leaf.recv.sink_progress("s1", "policy").last_position  # noqa: E731
    with _running(session, arrivals):
        wait_for(lambda: session.connected, timeout=scaled(30), what="the session connected")
        receiver.apply("s1", from_root(1))
        wait_for(lambda: received() == 1, timeout=scaled(30), what="the first entry")
        reads = _counting_reads(branch, monkeypatch)
        for position in (2, 3, 4):
            receiver.apply("s1", from_root(position))
            wait_for(lambda p=position: received() == p, timeout=scaled(30), what="an entry")
    if stored_ttl:
        assert reads == []
    else:
        assert reads  # read after each wake-up, finding nothing
    assert [e.position for e in leaf.cascade.read_relay("policy", "s1", 0, 10)] == [1, 2, 3, 4]


def test_a_batch_stored_by_another_process_is_relayed_once_the_last_store_here_is_old(
    store: SQLAlchemyQueueStore, leaf: SQLAlchemyQueueStore
) -> None:
    """Another member of the branch's site (another process) may store a batch: nothing
    here rings, and the session reads the queue at its poll once what it knows of the
    stores here is older than ``stored_ttl``."""
    branch = store
    node = branch.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["s4"])
    arrivals = Arrivals(stored_ttl=0.2)
    here = _forwarding_receiver(branch, arrivals)
    elsewhere = Receiver(branch, "s3", ["s1"])  # another member: tells this one nothing
    at_leaf = Receiver(leaf, "s4", ["s3"])
    session = SenderSession(
        branch,
        "s3",
        "s4",
        [ClientConfig("policy")],
        lambda: InProcessTransport(at_leaf, "s3"),
        ReplicationConfig(poll_interval=0.05),
        cascade={"policy": node},
        arrivals=arrivals,
    )
    received = lambda: leaf.recv.sink_progress("s1", "policy").last_position  # noqa: E731
    with _running(session, arrivals):
        wait_for(lambda: session.connected, timeout=scaled(30), what="the session connected")
        here.apply("s1", from_root(1))
        wait_for(lambda: received() == 1, timeout=scaled(30), what="the forwarded entry")
        elsewhere.apply("s1", from_root(2))
        wait_for(lambda: received() == 2, timeout=scaled(30), what="the entry stored elsewhere")
