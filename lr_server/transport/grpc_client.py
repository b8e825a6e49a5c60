"""gRPC transport: the sender side of the ``LogReplication`` service."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import grpc

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import LRError, TransportError
from lr_server._proto import replication_pb2_grpc as pb_grpc
from lr_server.config import DestinationConfig, SecurityConfig, SourceConfig
from lr_server.transport.base import BatchStream, Transport
from lr_server.transport.errors import map_rpc_error

_END = object()
#: Seconds a thread blocked in a grpc call (a stream's acknowledgements) sleeps at most
#: before it looks again, in an ``lr server`` process (:func:`quiet_waits`).
WAIT_SLICE = 30.0
#: Seconds a stream with nothing in flight keeps its call open without a batch.
PARK_AFTER = 10.0
#: Seconds an ending call is given to end (then, once cancelled, to be gone).
END_WAIT = 5.0


def quiet_waits() -> bool:
    """Let the threads blocked in grpc calls sleep until woken, at most ``WAIT_SLICE`` s.

    grpc's synchronous calls wait in slices of 0.1 s (``grpc._common``), so that a
    signal handler of a main thread blocked in a call runs soon: each open stream's
    reader wakes 10 times a second for nothing. ``lr server`` handles its signals on a
    main thread that never waits in grpc, so it sets a longer slice; an application
    that embeds a site keeps grpc's own. Whether grpc still has the setting."""
    common = getattr(grpc, "_common", None)
    if not isinstance(getattr(common, "MAXIMUM_WAIT_TIMEOUT", None), float):
        return False
    common.MAXIMUM_WAIT_TIMEOUT = WAIT_SLICE  # type: ignore[union-attr]
    return True


def channel_options(max_message_bytes: int) -> list[tuple[str, int | str]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


def open_channel(
    dest: DestinationConfig,
    security: SecurityConfig,
    max_message_bytes: int,
    own_connection: bool = False,
) -> grpc.Channel:
    options = channel_options(max_message_bytes)
    if own_connection:  # not shared with other channels to the same address (lanes)
        options.append(("grpc.use_local_subchannel_pool", 1))
    if security.transport == "plaintext":
        return grpc.insecure_channel(dest.address, options=options)
    assert security.ca_file is not None
    root = security.ca_file.read_bytes()
    key = cert = None
    if security.client_auth == "mtls":
        assert security.key_file is not None and security.cert_file is not None
        key, cert = security.key_file.read_bytes(), security.cert_file.read_bytes()
    if dest.server_name:
        options.append(("grpc.ssl_target_name_override", dest.server_name))
    creds = grpc.ssl_channel_credentials(root, key, cert)
    return grpc.secure_channel(dest.address, creds, options=options)


class _Call:
    """One ``Replicate`` call: its requests, and the thread that hands its acks over."""

    def __init__(
        self,
        stub: pb_grpc.LogReplicationStub,
        metadata: list[tuple[str, str]],
        acks: queue.Queue[pb.ReplicationAck | LRError | None],
    ) -> None:
        self.requests: queue.Queue[object] = queue.Queue()
        self.acks = acks
        self.ending = False  # ended by this side: its end is no error
        self.rpc = stub.Replicate(self._iter_requests(), metadata=metadata)
        self.reader = threading.Thread(target=self._read, name="lr-grpc-acks", daemon=True)
        self.reader.start()

    def _iter_requests(self) -> Iterator[pb.ReplicationBatch]:
        while True:
            item = self.requests.get()
            if item is _END:
                return
            assert isinstance(item, pb.ReplicationBatch)
            yield item

    def _read(self) -> None:
        try:
            for ack in self.rpc:
                self.acks.put(ack)
            failure: LRError = TransportError("stream ended by the sink")
        except grpc.RpcError as exc:
            failure = map_rpc_error(exc)
        except Exception as exc:  # grpc can surface other errors on teardown
            failure = TransportError(repr(exc))
        if not self.ending:
            self.acks.put(failure)

    def end(self, cancel: bool) -> None:
        """End the call: its requests first (the sink then ends it), or cancelled."""
        self.ending = True
        self.requests.put(_END)
        if cancel:
            self.rpc.cancel()
        self.reader.join(timeout=END_WAIT)
        if self.reader.is_alive():  # the sink did not end it in time
            self.rpc.cancel()
            self.reader.join(timeout=END_WAIT)


class GrpcStream(BatchStream):
    """A replication stream over ``Replicate`` calls: one open while batches travel.

    A stream with nothing in flight and no batch for ``park_after`` seconds ends its
    call (and so grpc's threads for it, which each wake 5 times a second while it is
    open); its next batch opens a new call on the same channel, which stays connected
    (its keepalive pings go on). A sink lost meanwhile shows at that batch, as the
    call's failure: the session reconnects and renegotiates as for any lost stream."""

    def __init__(
        self,
        stub: pb_grpc.LogReplicationStub,
        metadata: list[tuple[str, str]],
        park_after: float = PARK_AFTER,
    ) -> None:
        self._stub, self._metadata, self.park_after = stub, metadata, park_after
        self._acks: queue.Queue[pb.ReplicationAck | LRError | None] = queue.Queue()  # None: wake
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0  # batches sent and not acknowledged (one ack per batch)
        self._used_at = time.monotonic()
        self._call: _Call | None = _Call(stub, metadata, self._acks)

    @property
    def parked(self) -> bool:
        """Whether no call is open (the stream is idle)."""
        return self._call is None and not self._closed.is_set()

    def send(self, batch: pb.ReplicationBatch) -> None:
        if self._closed.is_set():
            raise TransportError("stream closed")
        with self._lock:
            if self._call is None:
                self._call = _Call(self._stub, self._metadata, self._acks)
            self._in_flight += 1
            self._used_at = time.monotonic()
            self._call.requests.put(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        # A wait past the moment the call falls idle ends the call then, not after it.
        deadline = time.monotonic() + timeout
        while True:
            park_in = self._park_if_idle()
            left = deadline - time.monotonic()
            try:
                item = self._acks.get(
                    timeout=max(0.0, left if park_in is None else min(left, park_in))
                )
                break
            except queue.Empty:
                if park_in is None or park_in >= left:
                    return None
        if isinstance(item, LRError):
            raise item
        if item is not None:
            with self._lock:
                self._in_flight = max(0, self._in_flight - 1)
                self._used_at = time.monotonic()
        return item

    def _park_if_idle(self) -> float | None:
        """End the call if it is idle; else the seconds until it is (None: not while
        no call is open or batches are in flight)."""
        with self._lock:
            call = self._call
            if call is None or self._in_flight:
                return None
            idle_in = self._used_at + self.park_after - time.monotonic()
            if idle_in > 0:
                return idle_in
            self._call = None
        call.end(cancel=False)
        return None

    def interrupt(self) -> None:
        self._acks.put(None)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            call.end(cancel=True)


class GrpcTransport(Transport):
    """Reaches one destination over gRPC (TLS, mTLS or, if configured, plaintext)."""

    def __init__(
        self,
        source_id: str,
        dest: DestinationConfig,
        security: SecurityConfig,
        max_message_bytes: int,
        own_connection: bool = False,
        park_after: float = PARK_AFTER,
    ) -> None:
        #: Seconds a stream of this transport stays open idle (:class:`GrpcStream`).
        self.park_after = park_after
        self._channel = open_channel(dest, security, max_message_bytes, own_connection)
        self._stub = pb_grpc.LogReplicationStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = [("x-lr-source", source_id)]
        token = dest.token or security.token
        if security.client_auth == "token" and token:
            self._metadata.append(("authorization", f"Bearer {token}"))

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        try:
            response: pb.NegotiateResponse = self._stub.Negotiate(
                request, timeout=timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise map_rpc_error(exc) from exc
        return response

    def open_stream(self) -> BatchStream:
        try:
            return GrpcStream(self._stub, self._metadata, self.park_after)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc) from exc

    def close(self) -> None:
        self._channel.close()


def call_cascade(
    node_id: str,
    provider: SourceConfig,
    security: SecurityConfig,
    report: pb.CascadeReport,
    timeout: float,
) -> pb.CascadeReply:
    """Send one ``Cascade`` report to ``provider`` (at its ``address``) as ``node_id``,
    authenticated as a sender is (``security.token``, or the client certificate); its
    reply. Errors are mapped as every call's (:func:`map_rpc_error`)."""
    dest = DestinationConfig(provider.id, provider.address, server_name=provider.server_name)
    channel = open_channel(dest, security, 1024 * 1024)
    metadata = [("x-lr-source", node_id)]
    if security.client_auth == "token" and security.token:  # this node's own, as a sender's
        metadata.append(("authorization", f"Bearer {security.token}"))
    try:
        stub = pb_grpc.LogReplicationStub(channel)  # type: ignore[no-untyped-call]
        reply: pb.CascadeReply = stub.Cascade(report, timeout=timeout, metadata=metadata)
        return reply
    except grpc.RpcError as exc:
        raise map_rpc_error(exc) from exc
    finally:
        channel.close()
