"""The receiver's gRPC server cannot be locked out by calls that open and never send.

Real gRPC on loopback. Idle calls are made by hand: a ``Negotiate`` opened as a
client stream whose request never comes, a ``Replicate`` stream whose first batch
never comes. Every caller is authenticated before the sink waits for anything,
an authenticated call waiting for its ``Negotiate`` request is cancelled after
``receiver.idle_call_timeout``, a source's newest call replaces its oldest beyond
``receiver.max_calls_per_source``, and at most ``receiver.max_concurrent_calls``
calls are open (one more gets ``RESOURCE_EXHAUSTED``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client._proto import replication_pb2 as pb
from lr_client.errors import TransportError
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_server import metrics
from lr_server._proto import replication_pb2_grpc as pb_grpc
from lr_server.config import DestinationConfig, SecurityConfig, load_config
from lr_server.server import SiteServer
from lr_server.transport.calls import CallTracker
from lr_server.transport.grpc_client import GrpcStream, GrpcTransport
from tests.kit.certs import Pki, make_pki
from tests.kit.rawgrpc import DEADLINE, Calls, Metadata, code_of, next_ack, token_meta
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config


def log_batch(positions: list[int], previous: int = 0) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=positions[0],
        client_name="policy",
        kind=pb.BATCH_LOG_ENTRY,
        previous_position=previous,
        first_position=positions[0],
        last_position=positions[-1],
        entries=[
            pb.RoutingTableEntryMsg(type=pb.LOG_ENTRY_SYNC, opaque_payload=b"p%d" % p, position=p)
            for p in positions
        ],
    )


def refused_count(reason: str) -> float:
    value: float = metrics.RECEIVER_CALLS_REFUSED.labels(reason)._value.get()
    return value


class Sink:
    """Site ``sink`` serving in this process; ``receiver`` in its config is tunable."""

    def __init__(
        self,
        tmp_path: Path,
        sources: list[str],
        receiver: str = "",
        security: str = "token",
        pki: Pki | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"sqlite:///{tmp_path / 'sink.db'}"
        extra = f"[receiver]\n{receiver}" if receiver else ""
        spec = SiteSpec("sink", self.url, port=self.port, sources=sources, extra=extra)
        self.config = load_config(write_config(tmp_path, spec, security=security, pki=pki))
        self.server = SiteServer(self.config)
        self.server.start()
        self.store = open_store(self.url)
        self.target = f"127.0.0.1:{self.port}"

    @property
    def calls(self) -> CallTracker:
        tracker: CallTracker = self.server._grpc.calls
        return tracker

    def received(self, source: str) -> list[bytes]:
        queues = [q for q in self.store.queues.list_queues("policy") if q.source_id == source]
        if not queues:
            return []
        with self.store.read() as conn:
            return [
                e.payload for e in self.store.queues.read_queue(conn, queues[0].queue_id, 10_000)
            ]

    def close(self) -> None:
        self.server.stop()
        self.store.engine.dispose()


def transmit(store: SQLAlchemyQueueStore, payloads: list[bytes]) -> None:
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    client.register_destinations(["sink"])
    with Session(store.engine) as session, session.begin():
        for payload in payloads:
            client.transmit_log_entry_message(session, payload, ["sink"])


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", client_names=("a", "sink", "site-x"))


def _mtls_credentials(pki: Pki, who: str) -> grpc.ChannelCredentials:
    client = pki.client(who)
    return grpc.ssl_channel_credentials(pki.ca.cert_pem(), client.key_pem(), client.cert_pem())


# -- a flood of idle calls cannot lock a configured source out ------------------------------
@pytest.mark.parametrize(
    ("security", "flooder"),
    [
        ("token", "anonymous"),  # no credentials at all
        ("token", "a"),  # the source's own credentials (a stolen token, or its last process)
        ("mtls", "site-x"),  # a certificate of the CA that names no configured source
        ("mtls", "a"),  # the source's own certificate
    ],
)
def test_a_flood_of_idle_calls_cannot_lock_out_a_configured_source(
    tmp_path: Path, pki: Pki, security: str, flooder: str
) -> None:
    sink = Sink(tmp_path, ["a"], security=security, pki=pki)
    creds = _mtls_credentials(pki, flooder) if security == "mtls" else None
    calls = Calls(sink.target, creds)
    source = None
    try:
        meta = [] if flooder == "anonymous" else token_meta(flooder)
        flood = calls.flood(meta if security == "token" else [("x-lr-source", flooder)])
        spec = SiteSpec("a", f"sqlite:///{tmp_path / 'a.db'}", destinations=[("sink", sink.port)])
        source = SiteServer(load_config(write_config(tmp_path, spec, security=security, pki=pki)))
        source.start()
        src_store = open_store(spec.db_url)
        try:
            payloads = [b"entry-%d" % i for i in range(30)]
            transmit(src_store, payloads)
            # End to end: every entry arrives, in order, while the flood is open.
            wait_for(lambda: sink.received("a") == payloads, DEADLINE)
        finally:
            src_store.engine.dispose()
        if flooder in ("anonymous", "site-x"):
            # Refused before the sink waited for any message: none was ever sent.
            want = (
                grpc.StatusCode.UNAUTHENTICATED
                if flooder == "anonymous"
                else grpc.StatusCode.PERMISSION_DENIED
            )
            assert [code_of(c) for c in flood] == [want] * len(flood)
        else:
            # Authenticated, so capped per source: the flood keeps no more than the cap.
            cap = sink.config.receiver.max_calls_per_source
            wait_for(lambda: sum(not c.done() for c in flood) <= cap, DEADLINE)
        assert all(f.sent == 0 for f in calls.feeds)
    finally:
        calls.close()
        if source is not None:
            source.stop()
        sink.close()


# -- authentication comes before any wait ----------------------------------------------------
@pytest.mark.parametrize(
    ("meta", "code"),
    [
        ([], grpc.StatusCode.UNAUTHENTICATED),
        (token_meta("a", "wrong"), grpc.StatusCode.UNAUTHENTICATED),
        (token_meta("x", "token-a"), grpc.StatusCode.PERMISSION_DENIED),
    ],
    ids=["no-credentials", "wrong-token", "unknown-source"],
)
def test_unauthenticated_idle_calls_are_refused_without_waiting_for_a_message(
    tmp_path: Path, meta: Metadata, code: grpc.StatusCode
) -> None:
    # An idle time-out far beyond the test's deadline: only authentication can end them.
    sink = Sink(tmp_path, ["a"], receiver="idle_call_timeout = 3600.0")
    calls = Calls(sink.target)
    try:
        negotiate, n_feed = calls.negotiate(meta)
        replicate, r_feed = calls.replicate(meta)
        assert code_of(negotiate) == code
        assert code_of(replicate) == code
        assert n_feed.sent == r_feed.sent == 0
        assert sink.calls.open_calls() == []
        assert sink.store.queues.list_queues() == []
    finally:
        calls.close()
        sink.close()


def test_mtls_refuses_an_unknown_certificate_without_waiting(tmp_path: Path, pki: Pki) -> None:
    sink = Sink(tmp_path, ["a"], receiver="idle_call_timeout = 3600.0", security="mtls", pki=pki)
    calls = Calls(sink.target, _mtls_credentials(pki, "site-x"))
    try:
        negotiate, feed = calls.negotiate([("x-lr-source", "site-x")])
        assert code_of(negotiate) == grpc.StatusCode.PERMISSION_DENIED
        assert feed.sent == 0
    finally:
        calls.close()
        sink.close()


# -- idle calls are timed out; healthy idle streams are not ---------------------------------
def test_an_idle_negotiate_is_cancelled_and_an_idle_stream_is_kept(tmp_path: Path) -> None:
    sink = Sink(tmp_path, ["a"], receiver="idle_call_timeout = 0.5")
    calls = Calls(sink.target)
    idle_before = refused_count("idle")
    protocol_errors = metrics.ERRORS.labels("ProtocolError")._value.get()
    try:
        stream, stream_feed = calls.replicate(token_meta("a"))
        stream_feed.put(log_batch([1]))
        assert next_ack(stream).last_position == 1  # open and served, then idle
        negotiate, feed = calls.negotiate(token_meta("a"))
        assert code_of(negotiate) == grpc.StatusCode.CANCELLED
        assert feed.sent == 0
        assert refused_count("idle") == idle_before + 1
        # A cancelled call is not a protocol error of the caller.
        assert metrics.ERRORS.labels("ProtocolError")._value.get() == protocol_errors
        # The stream has been idle longer than the cancelled call, and it still works.
        assert not stream.done()
        stream_feed.put(log_batch([2, 3], previous=1))
        assert next_ack(stream).last_position == 3
        assert sink.received("a") == [b"p1", b"p2", b"p3"]
        assert [c.method for c in sink.calls.open_calls()] == ["Replicate"]
    finally:
        calls.close()
        sink.close()


def test_a_negotiate_that_sends_its_request_in_time_is_answered(tmp_path: Path) -> None:
    sink = Sink(tmp_path, ["a"], receiver="idle_call_timeout = 3600.0")
    calls = Calls(sink.target)
    try:
        negotiate, feed = calls.negotiate(token_meta("a"))
        wait_for(lambda: len(sink.calls.open_calls("a")) == 1)  # admitted, waiting
        feed.put(pb.NegotiateRequest(source_id="a", clients=["policy"]))
        feed.end()
        response = negotiate.result(timeout=DEADLINE)
        assert [c.client_name for c in response.clients] == ["policy"]
        # A call that ends without its request message is refused.
        empty, empty_feed = calls.negotiate(token_meta("a"))
        empty_feed.end()
        assert code_of(empty) == grpc.StatusCode.INVALID_ARGUMENT
        # Callers that give up before sending are not counted as protocol errors.
        protocol_errors = metrics.ERRORS.labels("ProtocolError")._value.get()
        for _ in range(20):
            gave_up, _ = calls.negotiate(token_meta("a"))
            wait_for(lambda: len(sink.calls.open_calls("a")) == 1)
            gave_up.cancel()
            wait_for(lambda: sink.calls.open_calls("a") == [])
        assert metrics.ERRORS.labels("ProtocolError")._value.get() == protocol_errors
    finally:
        calls.close()
        sink.close()


def test_the_generated_unary_stub_still_negotiates(tmp_path: Path) -> None:
    """Old and current senders call Negotiate as a unary method: unchanged on the wire."""
    sink = Sink(tmp_path, ["a"])
    channel = grpc.insecure_channel(sink.target)
    try:
        stub = pb_grpc.LogReplicationStub(channel)  # type: ignore[no-untyped-call]
        request = pb.NegotiateRequest(source_id="a", clients=["policy"])
        response = stub.Negotiate(request, metadata=token_meta("a"), timeout=DEADLINE)
        assert [c.client_name for c in response.clients] == ["policy"]
        with pytest.raises(grpc.RpcError) as info:
            stub.Negotiate(request, metadata=token_meta("a", "wrong"), timeout=DEADLINE)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert sink.calls.open_calls() == []
    finally:
        channel.close()
        sink.close()


# -- a source's newest call replaces its oldest beyond the cap -------------------------------
def test_a_sources_newest_call_replaces_its_oldest_beyond_the_cap(tmp_path: Path) -> None:
    sink = Sink(tmp_path, ["a", "b"], receiver="max_calls_per_source = 2")
    calls = Calls(sink.target)
    replaced_before = refused_count("replaced")
    try:
        other, other_feed = calls.replicate(token_meta("b"))
        other_feed.put(log_batch([7]))
        assert next_ack(other).last_position == 7
        streams = []
        for position in (1, 2, 3):  # each admitted (acknowledged) before the next opens
            call, feed = calls.replicate(token_meta("a"))
            feed.put(log_batch([position], previous=position - 1))
            assert next_ack(call).last_position == position
            streams.append((call, feed))
        (oldest, _), (middle, middle_feed), (newest, newest_feed) = streams
        assert code_of(oldest) == grpc.StatusCode.CANCELLED
        assert refused_count("replaced") == replaced_before + 1
        middle_feed.put(log_batch([4], previous=3))
        assert next_ack(middle).last_position == 4
        newest_feed.put(log_batch([5], previous=4))
        assert next_ack(newest).last_position == 5
        other_feed.put(log_batch([8], previous=7))  # another source's stream is not touched
        assert next_ack(other).last_position == 8
        assert sink.received("a") == [b"p1", b"p2", b"p3", b"p4", b"p5"]
        assert [c.source for c in sink.calls.open_calls()] == ["b", "a", "a"]
    finally:
        calls.close()
        sink.close()


# -- more than 16 streams at once; a bound beyond which calls are refused --------------------
def test_twenty_sources_stream_to_one_sink_at_once(tmp_path: Path) -> None:
    sources = [f"s{i:02d}" for i in range(20)]
    sink = Sink(tmp_path, sources)
    calls = Calls(sink.target)
    try:
        streams = [calls.replicate(token_meta(s)) for s in sources]
        for (call, feed), _source in zip(streams, sources, strict=True):
            feed.put(log_batch([1]))
            assert next_ack(call).last_position == 1
        # All twenty are open together, and each still answers.
        assert sorted(c.source for c in sink.calls.open_calls()) == sources
        for call, feed in streams:
            feed.put(log_batch([2], previous=1))
            assert next_ack(call).last_position == 2
        assert all(sink.received(s) == [b"p1", b"p2"] for s in sources)
    finally:
        calls.close()
        sink.close()


def test_calls_beyond_the_bound_get_resource_exhausted(tmp_path: Path) -> None:
    sink = Sink(tmp_path, ["a", "b", "c"], receiver="max_concurrent_calls = 2")
    calls = Calls(sink.target)
    busy_before = refused_count("busy")
    try:
        first, first_feed = calls.replicate(token_meta("a"))
        second, second_feed = calls.replicate(token_meta("b"))
        for call, feed in ((first, first_feed), (second, second_feed)):
            feed.put(log_batch([1]))
            assert next_ack(call).last_position == 1  # both admitted
        assert metrics.RECEIVER_OPEN_CALLS._value.get() == 2
        third, third_feed = calls.replicate(token_meta("c"))
        third_feed.put(log_batch([1]))
        assert code_of(third) == grpc.StatusCode.RESOURCE_EXHAUSTED
        refused, _ = calls.negotiate(token_meta("c"))
        assert code_of(refused) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused_count("busy") == busy_before + 2
        assert sink.received("c") == []
        second_feed.put(log_batch([2], previous=1))  # the admitted calls are still served
        assert next_ack(second).last_position == 2
        # Once a call ends, there is room again.
        first.cancel()
        wait_for(lambda: len(sink.calls.open_calls()) == 1)
        again, feed = calls.replicate(token_meta("c"))
        feed.put(log_batch([1]))
        assert next_ack(again).last_position == 1
        assert sink.received("c") == [b"p1"]
    finally:
        calls.close()
        sink.close()


def test_calls_that_would_wait_for_a_thread_are_refused_not_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool has a thread per allowed call plus REFUSAL_THREADS; gRPC refuses beyond."""
    from lr_server.transport import grpc_server

    entered: list[str] = []
    release = threading.Event()
    identify = grpc_server.Authenticator.identify

    def slow_identify(self: grpc_server.Authenticator, context: grpc.ServicerContext) -> str:
        entered.append("x")
        release.wait(DEADLINE)
        return identify(self, context)

    monkeypatch.setattr(grpc_server.Authenticator, "identify", slow_identify)
    sink = Sink(tmp_path, ["a"], receiver="max_concurrent_calls = 1")
    calls = Calls(sink.target)
    threads = 1 + grpc_server.REFUSAL_THREADS
    try:
        held = [calls.negotiate(token_meta("a"))[0] for _ in range(threads)]
        wait_for(lambda: len(entered) == threads, DEADLINE)  # every thread is busy
        extra, _ = calls.replicate(token_meta("a"))
        assert code_of(extra) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert extra.details() == "Concurrent RPC limit exceeded!"  # gRPC's own refusal
        assert len(entered) == threads  # it never reached a thread
        release.set()
        # Then one held call is admitted (and waits for its request), the rest are over
        # the bound.
        wait_for(lambda: sum(c.done() for c in held) >= threads - 1, DEADLINE)
        busy = [c for c in held if c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert len(busy) == threads - 1
    finally:
        release.set()
        calls.close()
        sink.close()


# -- an idle stream ends its call; the next batch opens another ------------------------------
def _parking_stream(tmp_path: Path, park_after: float) -> tuple[Sink, GrpcTransport, GrpcStream]:
    """A sink taking site ``a``'s token, and ``a``'s stream to it parking after ``park_after`` s."""
    sink = Sink(tmp_path, ["a"])
    security = SecurityConfig(transport="plaintext", client_auth="token", token="token-a")
    dest = DestinationConfig(id="sink", address=sink.target)
    transport = GrpcTransport("a", dest, security, 1 << 20, park_after=park_after)
    stream = transport.open_stream()
    assert isinstance(stream, GrpcStream)
    return sink, transport, stream


def test_an_idle_stream_ends_its_call_and_its_next_batch_opens_another(tmp_path: Path) -> None:
    """With nothing in flight for ``park_after`` s the sender's stream ends its call (the
    sink holds no call of it any more, the call's threads end); the next batch opens a
    new call on the same channel and is applied after the ones before it."""
    sink, transport, stream = _parking_stream(tmp_path, 0.2)
    try:
        stream.send(log_batch([1]))
        ack = stream.next_ack(DEADLINE)
        assert ack is not None and ack.last_position == 1
        assert [c.method for c in sink.calls.open_calls("a")] == ["Replicate"]
        readers = [t for t in threading.enumerate() if t.name == "lr-grpc-acks"]
        wait_for(lambda: stream.next_ack(0.05) is None and stream.parked, what="parked")
        wait_for(lambda: sink.calls.open_calls("a") == [], what="the sink's call ended")
        assert not any(t.is_alive() for t in readers)
        stream.send(log_batch([2, 3], previous=1))
        ack = stream.next_ack(DEADLINE)
        assert ack is not None and ack.last_position == 3 and not stream.parked
        assert sink.received("a") == [b"p1", b"p2", b"p3"]
        assert [c.method for c in sink.calls.open_calls("a")] == ["Replicate"]
        # A batch in flight keeps the call open, however long its ack takes to come.
        stream.park_after = 0.0
        stream.send(log_batch([4], previous=3))
        ack = stream.next_ack(DEADLINE)
        assert ack is not None and ack.last_position == 4
        assert stream.next_ack(0.0) is None and stream.parked  # then nothing is in flight
    finally:
        stream.close()
        transport.close()
        sink.close()


def test_a_stream_waiting_past_its_idle_moment_ends_its_call_then(tmp_path: Path) -> None:
    """An idle session waits for acknowledgements far longer than ``park_after`` (until
    its sweep, a minute): its call ends ``park_after`` s after the last batch, during
    that wait, not when the wait is over."""
    sink, transport, stream = _parking_stream(tmp_path, 0.2)
    got: list[pb.ReplicationAck | None] = []
    try:
        stream.send(log_batch([1]))
        ack = stream.next_ack(DEADLINE)
        assert ack is not None and ack.last_position == 1
        waiting = threading.Thread(target=lambda: got.append(stream.next_ack(600.0)))
        waiting.start()
        wait_for(lambda: stream.parked, what="parked while waiting")
        wait_for(lambda: sink.calls.open_calls("a") == [], what="the sink's call ended")
        assert waiting.is_alive() and got == []  # the wait goes on, parked
        stream.interrupt()  # a wake-up ends it, as before
        waiting.join(DEADLINE)
        assert got == [None]
        stream.send(log_batch([2], previous=1))
        ack = stream.next_ack(DEADLINE)
        assert ack is not None and ack.last_position == 2 and not stream.parked
    finally:
        stream.close()
        transport.close()
        sink.close()


def test_a_sink_lost_while_a_stream_is_parked_shows_at_the_next_batch(tmp_path: Path) -> None:
    """No call is open to notice the loss; the next batch's call fails, as a lost
    stream's would, so the session reconnects and renegotiates."""
    sink, transport, stream = _parking_stream(tmp_path, 0.1)
    try:
        stream.send(log_batch([1]))
        assert stream.next_ack(DEADLINE) is not None
        wait_for(lambda: stream.next_ack(0.05) is None and stream.parked, what="parked")
    finally:
        sink.close()
    try:
        stream.send(log_batch([2], previous=1))
        with pytest.raises(TransportError):
            stream.next_ack(DEADLINE)
    finally:
        stream.close()
        transport.close()
