"""gRPC transport: the sink side, with authentication of sources (I6)."""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import TypeVar

import grpc

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import (
    AuthenticationError,
    LRError,
    PermissionDeniedError,
)
from lr_server import metrics
from lr_server.config import SiteConfig
from lr_server.receiving.receiver import Receiver
from lr_server.transport.calls import CallLimitError, CallTracker, OpenCall
from lr_server.transport.errors import status_for

log = logging.getLogger("lr.grpc")

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

#: The full name of the gRPC service (``lr.v1.LogReplication``).
SERVICE: str = pb.DESCRIPTOR.services_by_name["LogReplication"].full_name


class Authenticator:
    """Who is calling: the source id from the client certificate or the token.

    With ``client_auth = "none"`` (plaintext on loopback only, see the config) it is
    the source id the caller claims, still one of the configured sources.
    """

    def __init__(self, config: SiteConfig) -> None:
        self.mode = config.security.client_auth
        self.tokens = {s.id: s.token for s in config.sources}

    def identify(self, context: grpc.ServicerContext) -> str:
        metadata = dict(context.invocation_metadata() or ())
        claimed = str(metadata.get("x-lr-source", ""))
        if self.mode == "mtls":
            identities = [i.decode() for i in (context.peer_identities() or [])]
            if not identities:
                raise AuthenticationError("no client certificate")
            known = [i for i in identities if i in self.tokens]
            if not known:
                raise PermissionDeniedError(f"source {identities[0]!r} is not accepted here")
            if claimed and claimed not in known:
                raise PermissionDeniedError(
                    f"certificate of {known[0]!r} cannot speak as {claimed!r}"
                )
            return str(known[0])
        if self.mode == "none":
            if not claimed:
                raise AuthenticationError("missing source id")
            if claimed not in self.tokens:
                raise PermissionDeniedError(f"source {claimed!r} is not accepted here")
            return claimed
        auth = str(metadata.get("authorization", ""))
        if not auth.startswith("Bearer ") or not claimed:
            raise AuthenticationError("missing source id or bearer token")
        expected = self.tokens.get(claimed)
        if expected is None:
            raise PermissionDeniedError(f"source {claimed!r} is not accepted here")
        if not hmac.compare_digest(auth[len("Bearer ") :].encode(), expected.encode()):
            raise AuthenticationError("invalid token")
        return claimed


class LogReplicationService:
    """The sink side of ``LogReplication``; every call is authenticated before any read.

    ``Negotiate`` is served as a client-streaming method: its wire format is the same as
    a unary call's (unary clients call it unchanged), but the handler starts at once, so
    it authenticates the caller from the call's metadata and peer certificate before it
    waits for the request message. (gRPC's own unary handling reads the request first,
    holding a server thread for as long as the client sends nothing.)
    """

    def __init__(self, receiver: Receiver, auth: Authenticator, calls: CallTracker) -> None:
        self.receiver = receiver
        self.auth = auth
        self.calls = calls

    def _fail(self, context: grpc.ServicerContext, exc: LRError) -> None:
        metrics.ERRORS.labels(type(exc).__name__).inc()
        log.warning("rejected: %s", exc)
        context.abort(status_for(exc), str(exc))

    def _admit(self, context: grpc.ServicerContext, method: str) -> OpenCall:
        """Authenticate and register the call; aborts it when it cannot be served."""
        try:
            source = self.auth.identify(context)
        except LRError as exc:
            self._fail(context, exc)
            raise  # unreachable: abort raises
        try:
            call = self.calls.admit(source, method, context.cancel)
        except CallLimitError as exc:
            log.warning("refused a %s call of %s: %s", method, source, exc)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            raise  # unreachable: abort raises
        if not context.add_callback(lambda: self.calls.release(call)):
            self.calls.release(call)  # already over; the first read raises
        return call

    def _one_request(
        self,
        method: str,
        request_iterator: Iterator[RequestT],
        context: grpc.ServicerContext,
        serve: Callable[[str, RequestT], ResponseT],
    ) -> ResponseT:
        """A unary method: admit the caller, then wait (bounded) for its one request."""
        call = self._admit(context, method)
        try:
            with self.calls.waiting(call):
                request = next(request_iterator, None)
            if request is None:
                # The stream ended without a message, or the call was cancelled (here or
                # by the caller: gRPC shows that the same way), so neither logged nor
                # counted as the caller's error.
                if call.ended_by:
                    context.abort(grpc.StatusCode.CANCELLED, f"{method} call {call.ended_by}")
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{method} takes exactly one request message"
                )
                raise AssertionError("unreachable: abort raises")
            with self.calls.working():
                return serve(call.source, request)
        except LRError as exc:
            self._fail(context, exc)
            raise  # unreachable: abort raises
        finally:
            self.calls.release(call)

    def Negotiate(
        self, request_iterator: Iterator[pb.NegotiateRequest], context: grpc.ServicerContext
    ) -> pb.NegotiateResponse:
        return self._one_request("Negotiate", request_iterator, context, self.receiver.negotiate)

    def Cascade(
        self, request_iterator: Iterator[pb.CascadeReport], context: grpc.ServicerContext
    ) -> pb.CascadeReply:
        return self._one_request("Cascade", request_iterator, context, self.receiver.cascade)

    def Replicate(
        self, request_iterator: Iterator[pb.ReplicationBatch], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicationAck]:
        call = self._admit(context, "Replicate")
        try:
            # No idle time-out here: a source keeps its stream open while it ships, and
            # ends it after some time with nothing to send (its channel stays connected,
            # pinging the sink every 10 s); the per-source cap bounds these.
            for batch in request_iterator:
                try:
                    with self.calls.working():
                        ack = self.receiver.apply(call.source, batch)
                except LRError as exc:
                    self._fail(context, exc)
                    return
                # Not held while the acknowledgement is out: the source then sends more,
                # and the next batch arrives before the loop would rebind the name (the
                # sink's memory bound, docs/operations.md, counts one batch applied).
                del batch
                yield ack
        finally:
            self.calls.release(call)


def method_handlers(service: LogReplicationService) -> dict[str, grpc.RpcMethodHandler]:
    """The service's methods, with ``Negotiate`` read as a stream (see the class).

    Raises if the service (``protos/lr/replication.proto``) has a method not served here:
    a new unary method must be registered as a stream too, through ``_one_request``.
    """
    handlers = {
        "Negotiate": grpc.stream_unary_rpc_method_handler(
            service.Negotiate,
            request_deserializer=pb.NegotiateRequest.FromString,
            response_serializer=pb.NegotiateResponse.SerializeToString,
        ),
        "Cascade": grpc.stream_unary_rpc_method_handler(
            service.Cascade,
            request_deserializer=pb.CascadeReport.FromString,
            response_serializer=pb.CascadeReply.SerializeToString,
        ),
        "Replicate": grpc.stream_stream_rpc_method_handler(
            service.Replicate,
            request_deserializer=pb.ReplicationBatch.FromString,
            response_serializer=pb.ReplicationAck.SerializeToString,
        ),
    }
    declared = {m.name for m in pb.DESCRIPTOR.services_by_name["LogReplication"].methods}
    if declared != set(handlers):
        raise RuntimeError(
            f"LogReplication methods {sorted(declared)} != served {sorted(handlers)}"
        )
    return handlers


#: Threads (and gRPC's own call limit) beyond ``max_concurrent_calls``: they serve the
#: calls that are refused at once (unauthenticated, over the limit) without queueing.
REFUSAL_THREADS = 16


class GrpcReceiver:
    """The started gRPC server of a sink, with its call tracker."""

    def __init__(self, server: grpc.Server, calls: CallTracker) -> None:
        self.server = server
        self.calls = calls

    def stop(self, grace: float | None, drain: float = 10.0) -> threading.Event:
        """Stop serving; returns the event set once every call has ended and no handler
        uses the store any more (a cancelled call's handler may still be applying a
        batch: it is waited for up to ``drain`` s, so the store can then be closed)."""
        ended: threading.Event = self.server.stop(grace)
        self.calls.stop()
        done = threading.Event()

        def wait() -> None:
            ended.wait()
            if self.calls.drain(drain):
                done.set()
            else:
                log.warning("a receiver handler still runs %gs after the stop", drain)

        threading.Thread(target=wait, name="lr-rpc-drain", daemon=True).start()
        return done


def start_grpc_server(config: SiteConfig, receiver: Receiver) -> GrpcReceiver:
    """Serve ``LogReplication`` on ``config.listen``; returns the started server."""
    limits = config.receiver
    calls = CallTracker(
        limits.max_concurrent_calls, limits.max_calls_per_source, limits.idle_call_timeout
    )
    # Every admitted call holds one thread for its whole life: the pool has one per
    # allowed call plus some for refusals, and gRPC refuses (RESOURCE_EXHAUSTED) what
    # would otherwise queue for a thread.
    workers = limits.max_concurrent_calls + REFUSAL_THREADS
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lr-rpc"),
        options=[
            ("grpc.max_send_message_length", config.replication.max_message_bytes),
            ("grpc.max_receive_message_length", config.replication.max_message_bytes),
            # Accept the senders' keepalive pings (every 10 s, also when idle).
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
        ],
        maximum_concurrent_rpcs=workers,
    )
    handlers = method_handlers(LogReplicationService(receiver, Authenticator(config), calls))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    sec = config.security
    try:
        if sec.transport == "plaintext":
            bound = server.add_insecure_port(config.listen)
        else:
            assert sec.key_file and sec.cert_file and sec.ca_file
            creds = grpc.ssl_server_credentials(
                [(sec.key_file.read_bytes(), sec.cert_file.read_bytes())],
                root_certificates=sec.ca_file.read_bytes(),
                require_client_auth=sec.client_auth == "mtls",
            )
            bound = server.add_secure_port(config.listen, creds)
    except RuntimeError:  # grpc: "Failed to bind to address ..."
        bound = 0
    if bound == 0:
        raise OSError(f"site.listen: cannot listen on {config.listen}")
    server.start()
    calls.start()
    return GrpcReceiver(server, calls)
