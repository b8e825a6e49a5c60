"""The exception tree of the SDK.

::

    LRError
    ├── InvalidInputError          bad input from the caller; nothing was changed
    │   ├── InvalidNameError       a site id or client name outside [a-z0-9][a-z0-9-]{0,62}
    │   ├── InvalidDestinationsError   empty, duplicated or malformed destination list
    │   ├── UnknownDestinationError    a destination that is not registered
    │   ├── CascadeRouteError          a cascaded client transmitted off its root or outside its set
    │   ├── InvalidSessionError        not a SQLAlchemy Session or Connection
    │   ├── InvalidPayloadError        payload not bytes
    │   ├── PayloadTooLargeError       payload over the configured limit
    │   ├── InvalidPartitionKeyError   partition key not bytes/str, empty, or too long
    │   └── InvalidHeadersError    headers not a str map, a bad or reserved name, or too large
    ├── ConfigError                a configuration file or value is wrong
    │   ├── PartitionCountError    a queue not drained is delivered with another partition count
    │   └── UnsupportedSettingError    a setting this component does not support (yet)
    ├── TransientError             worth retrying: the operation may succeed later
    │   ├── StoreUnavailableError  the database could not be reached
    │   ├── TransportError         the peer could not be reached or the stream broke
    │   ├── ListenerError          a listener rejected or failed a batch; it comes again
    │   ├── ReceiveQueueFullError  a sink's receive queue is at its limit (RESOURCE_EXHAUSTED)
    │   └── BackpressureError      destinations are too far behind; slow down
    └── PermanentError             retrying will not help
        ├── FencedError            this member lost the unit's lease; the write was refused
        ├── SchemaError            the database schema is missing or not ours
        ├── AuthenticationError    the peer rejected our identity (UNAUTHENTICATED)
        ├── PermissionDeniedError  the peer does not accept us (PERMISSION_DENIED)
        ├── ProtocolError          the peer sent something malformed or out of order
        │   ├── IncompatibleVersionError  the peer speaks a wire protocol too old for us
        │   ├── NotProviderError   the sink takes this cascaded client from another provider
        │   └── DecompressionError a compressed batch is malformed or expands past the limit
        ├── SnapshotError          a snapshot was cancelled, superseded or failed
        └── EncryptionError        a payload could not be encrypted or decrypted
            ├── KeyUnavailableError    no key of the keyring opens it
            └── DecryptionError        the key is wrong, or the envelope was altered or moved

Each class's docstring is its default message.
"""

from __future__ import annotations


class LRError(Exception):
    """Routing-queue replication error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip().splitlines()[0])


class InvalidInputError(LRError, ValueError):
    """Invalid input; nothing was changed."""


class InvalidNameError(InvalidInputError):
    """Invalid name: expected ``[a-z0-9][a-z0-9-]{0,62}``."""


class InvalidDestinationsError(InvalidInputError):
    """Invalid destination list."""


class UnknownDestinationError(InvalidInputError):
    """Destination is not a registered site."""


class CascadeRouteError(InvalidInputError):
    """A cascaded client is transmitted at its root only, to nodes of its set only."""


class InvalidSessionError(InvalidInputError, TypeError):
    """Expected a SQLAlchemy Session or Connection."""


class InvalidPayloadError(InvalidInputError, TypeError):
    """Payload must be bytes."""


class PayloadTooLargeError(InvalidInputError):
    """Payload exceeds the configured maximum size."""


class InvalidPartitionKeyError(InvalidInputError, TypeError):
    """Invalid partition key: expected bytes or str of 1 to 256 bytes."""


class InvalidHeadersError(InvalidInputError, TypeError):
    """Invalid headers: expected a small mapping of header names to str values."""


class ConfigError(LRError):
    """Invalid configuration."""


class PartitionCountError(ConfigError):
    """The receive queue is delivered with another partition count; drain it before changing."""


class UnsupportedSettingError(ConfigError):
    """This component does not support that setting."""


class TransientError(LRError):
    """Transient failure; the operation may succeed if retried."""


class StoreUnavailableError(TransientError):
    """The database could not be reached."""


class TransportError(TransientError):
    """The peer could not be reached or the stream broke."""


class ListenerError(TransientError):
    """The listener rejected or failed a batch; it will be delivered again."""

    def __init__(
        self,
        message: str | None = None,
        *,
        source_id: str = "",
        client_name: str = "",
        callback: str = "",
        first_seq: int = 0,
        last_seq: int = 0,
        attempt: int = 0,
    ) -> None:
        super().__init__(message)
        self.source_id = source_id
        self.client_name = client_name
        self.callback = callback
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.attempt = attempt


class ReceiveQueueFullError(TransientError):
    """A sink's receive queue is at its limit: the batch was refused; send it again later."""


#: What a :class:`ReceiveQueueFullError`'s message holds: gRPC RESOURCE_EXHAUSTED with it
#: is that error (retryable), without it a :class:`ProtocolError` (a message too large).
QUEUE_FULL = "receive queue is full"


class BackpressureError(TransientError):
    """Too many destinations are behind; transmit refused to protect the queue."""


class PermanentError(LRError):
    """Permanent failure; retrying will not help."""


class FencedError(PermanentError):
    """This member no longer holds the lease of the unit of work: the write was refused."""


class SchemaError(PermanentError):
    """The database schema is missing or incompatible."""


class AuthenticationError(PermanentError):
    """The peer did not accept our credentials."""


class PermissionDeniedError(PermanentError):
    """The peer does not accept this source."""


class ProtocolError(PermanentError):
    """The peer sent a malformed or out-of-order message."""


class IncompatibleVersionError(ProtocolError):
    """The peer speaks a wire protocol version this release no longer accepts."""


class NotProviderError(ProtocolError):
    """This site is not the sink's provider of the cascaded client (FAILED_PRECONDITION)."""


class DecompressionError(ProtocolError):
    """A compressed batch is malformed or expands past the receiver's limit."""


class SnapshotError(PermanentError):
    """The snapshot was cancelled, superseded or failed."""


class EncryptionError(PermanentError):
    """A payload could not be encrypted or decrypted."""


class KeyUnavailableError(EncryptionError):
    """No key of the keyring opens the payload."""


class DecryptionError(EncryptionError):
    """The payload did not decrypt: a wrong key, or an envelope altered or moved."""


__all__ = [
    "AuthenticationError",
    "BackpressureError",
    "CascadeRouteError",
    "ConfigError",
    "DecompressionError",
    "DecryptionError",
    "EncryptionError",
    "FencedError",
    "IncompatibleVersionError",
    "InvalidDestinationsError",
    "InvalidHeadersError",
    "InvalidInputError",
    "InvalidNameError",
    "InvalidPartitionKeyError",
    "InvalidPayloadError",
    "InvalidSessionError",
    "KeyUnavailableError",
    "LRError",
    "ListenerError",
    "NotProviderError",
    "PartitionCountError",
    "PayloadTooLargeError",
    "PermanentError",
    "PermissionDeniedError",
    "ProtocolError",
    "ReceiveQueueFullError",
    "SchemaError",
    "SnapshotError",
    "StoreUnavailableError",
    "TransientError",
    "TransportError",
    "UnknownDestinationError",
]
