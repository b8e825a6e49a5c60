"""gRPC transport: the sink side, with authentication of sources (I6)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from concurrent import futures

import grpc

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import (
    AuthenticationError,
    LRError,
    PermissionDeniedError,
)
from lr_server import metrics
from lr_server._proto import replication_pb2_grpc as pb_grpc
from lr_server.config import SiteConfig
from lr_server.receiver import Receiver
from lr_server.transport.errors import status_for

log = logging.getLogger("lr.grpc")


class Authenticator:
    """Who is calling: the source id from the client certificate or the token."""

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
        auth = str(metadata.get("authorization", ""))
        if not auth.startswith("Bearer ") or not claimed:
            raise AuthenticationError("missing source id or bearer token")
        expected = self.tokens.get(claimed)
        if expected is None:
            raise PermissionDeniedError(f"source {claimed!r} is not accepted here")
        if not hmac.compare_digest(auth[len("Bearer ") :].encode(), expected.encode()):
            raise AuthenticationError("invalid token")
        return claimed


class LogReplicationService(pb_grpc.LogReplicationServicer):
    def __init__(self, receiver: Receiver, auth: Authenticator) -> None:
        self.receiver = receiver
        self.auth = auth

    def _fail(self, context: grpc.ServicerContext, exc: LRError) -> None:
        metrics.ERRORS.labels(type(exc).__name__).inc()
        log.warning("rejected: %s", exc)
        context.abort(status_for(exc), str(exc))

    def Negotiate(
        self, request: pb.NegotiateRequest, context: grpc.ServicerContext
    ) -> pb.NegotiateResponse:
        try:
            source = self.auth.identify(context)
            return self.receiver.negotiate(source, request)
        except LRError as exc:
            self._fail(context, exc)
            raise  # unreachable: abort raises

    def Replicate(
        self, request_iterator: Iterator[pb.ReplicationBatch], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicationAck]:
        try:
            source = self.auth.identify(context)
        except LRError as exc:
            self._fail(context, exc)
            return
        for batch in request_iterator:
            try:
                ack = self.receiver.apply(source, batch)
            except LRError as exc:
                self._fail(context, exc)
                return
            yield ack


def start_grpc_server(config: SiteConfig, receiver: Receiver, max_workers: int = 16) -> grpc.Server:
    """Serve ``LogReplication`` on ``config.listen``; returns the started server."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lr-rpc"),
        options=[
            ("grpc.max_send_message_length", config.replication.max_message_bytes),
            ("grpc.max_receive_message_length", config.replication.max_message_bytes),
            # Accept the senders' keepalive pings (every 10 s, also when idle).
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
        ],
    )
    pb_grpc.add_LogReplicationServicer_to_server(  # type: ignore[no-untyped-call]
        LogReplicationService(receiver, Authenticator(config)), server
    )
    sec = config.security
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
    if bound == 0:
        raise OSError(f"cannot listen on {config.listen}")
    server.start()
    return server
