"""The checks of what an application gives with an entry: its payload and partition key."""

from __future__ import annotations

from lr_client.errors import InvalidPartitionKeyError, InvalidPayloadError, PayloadTooLargeError


def check_payload(value: object, limit: int, what: str = "payload") -> bytes:
    """``value`` as bytes, if it is bytes-like and at most ``limit`` bytes long.

    Raises :class:`~lr_client.errors.InvalidPayloadError` (not bytes) or
    :class:`~lr_client.errors.PayloadTooLargeError`; ``what`` names it in the message.
    """
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise InvalidPayloadError(f"{what} must be bytes, got {type(value).__name__}")
    if len(value) > limit:
        raise PayloadTooLargeError(f"{what} of {len(value)} bytes exceeds the limit of {limit}")
    return value


#: The longest partition key, in bytes (a str key counts its UTF-8 bytes).
MAX_PARTITION_KEY_BYTES = 256


def check_partition_key(value: object) -> bytes | None:
    """A partition key as stored: bytes of 1 to :data:`MAX_PARTITION_KEY_BYTES`, or None.

    A ``str`` is encoded as UTF-8. Raises
    :class:`~lr_client.errors.InvalidPartitionKeyError` for any other type, an
    empty key or a longer one.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise InvalidPartitionKeyError(
            f"partition key must be bytes or str, got {type(value).__name__}"
        )
    if not value:
        raise InvalidPartitionKeyError("partition key must not be empty (None: no key)")
    if len(value) > MAX_PARTITION_KEY_BYTES:
        raise InvalidPartitionKeyError(
            f"partition key of {len(value)} bytes exceeds the limit of {MAX_PARTITION_KEY_BYTES}"
        )
    return value


__all__ = ["MAX_PARTITION_KEY_BYTES", "check_partition_key", "check_payload"]
