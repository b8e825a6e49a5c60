"""gRPC status codes <-> the SDK's exception types, mapped at the boundary."""

from __future__ import annotations

import grpc

from lr_client.errors import (
    QUEUE_FULL,
    AuthenticationError,
    IncompatibleVersionError,
    LRError,
    NotProviderError,
    PermissionDeniedError,
    ProtocolError,
    ReceiveQueueFullError,
    StoreUnavailableError,
    TransportError,
)

#: Every status a peer can answer with, and what it means to a sender session.
STATUS_TO_ERROR: dict[grpc.StatusCode, type[LRError]] = {
    grpc.StatusCode.OK: TransportError,  # never raised with OK; listed for completeness
    grpc.StatusCode.CANCELLED: TransportError,
    grpc.StatusCode.UNKNOWN: TransportError,
    grpc.StatusCode.INVALID_ARGUMENT: ProtocolError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransportError,
    grpc.StatusCode.NOT_FOUND: ProtocolError,
    grpc.StatusCode.ALREADY_EXISTS: ProtocolError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ProtocolError,
    grpc.StatusCode.FAILED_PRECONDITION: IncompatibleVersionError,
    grpc.StatusCode.ABORTED: TransportError,
    grpc.StatusCode.OUT_OF_RANGE: ProtocolError,
    grpc.StatusCode.UNIMPLEMENTED: ProtocolError,
    grpc.StatusCode.INTERNAL: TransportError,
    grpc.StatusCode.UNAVAILABLE: TransportError,
    grpc.StatusCode.DATA_LOSS: TransportError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
}

#: What a :class:`NotProviderError`'s message holds: FAILED_PRECONDITION with it is that
#: error (a sink refusing a relay), without it an :class:`IncompatibleVersionError`.
NOT_PROVIDER = " is not the provider of "

#: What the sink answers for each of our errors.
ERROR_TO_STATUS: dict[type[LRError], grpc.StatusCode] = {
    AuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    IncompatibleVersionError: grpc.StatusCode.FAILED_PRECONDITION,
    NotProviderError: grpc.StatusCode.FAILED_PRECONDITION,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ProtocolError: grpc.StatusCode.INVALID_ARGUMENT,
    ReceiveQueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StoreUnavailableError: grpc.StatusCode.UNAVAILABLE,
}


def map_rpc_error(exc: grpc.RpcError) -> LRError:
    """Our exception for a failed call."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    cls = STATUS_TO_ERROR.get(code, TransportError)
    if code == grpc.StatusCode.FAILED_PRECONDITION and NOT_PROVIDER in (details or ""):
        cls = NotProviderError
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and QUEUE_FULL in (details or ""):
        cls = ReceiveQueueFullError
    return cls(f"{code.name}: {details}")


def status_for(exc: LRError) -> grpc.StatusCode:
    """The status to answer for one of our exceptions."""
    for cls in type(exc).__mro__:
        if cls in ERROR_TO_STATUS:
            return ERROR_TO_STATUS[cls]
    return grpc.StatusCode.INTERNAL
