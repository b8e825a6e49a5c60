"""An entry's headers: a small ``str -> str`` map that travels with its payload.

The one home of their rules and their encoding: :func:`check_headers` validates
what an application gives (:class:`~lr_client.errors.InvalidHeadersError`,
before anything is written), :func:`encode_headers` makes the stored form and
:func:`decode_headers` reads it back as a read-only mapping. The stored form is
compact JSON (UTF-8, keys sorted, no spaces) in one nullable column, NULL for
none: a few dozen bytes for a typical map, readable with any SQL client, parsed
by the standard library's C decoder, and it holds any string value without an
escape scheme of its own. On the wire the map is ``RoutingTableEntryMsg.headers``.

Names starting with :data:`RESERVED_PREFIX` belong to the library (the trace
context :mod:`lr_client.tracing` records): an application may not set them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from lr_client.errors import InvalidHeadersError, ProtocolError

#: The most headers an entry may carry.
MAX_HEADERS = 32
#: A name: lowercase ASCII letters, digits, ``-``, ``_`` and ``.``, 1 to 64 of them.
MAX_NAME_LENGTH = 64
#: The longest value, in UTF-8 bytes.
MAX_VALUE_BYTES = 1024
#: The most bytes an entry's headers take encoded (names, values and the JSON around them).
MAX_HEADERS_BYTES = 8192
#: Names the library reserves for itself (the trace context).
RESERVED_PREFIX = "lr-"
#: (count, encoded bytes) of headers with the library's own added to an application's.
LIBRARY_LIMITS = (MAX_HEADERS + 4, MAX_HEADERS_BYTES + 2 * MAX_VALUE_BYTES)
#: The entry header holding the W3C ``traceparent`` of its transmit (lr_client.tracing).
TRACEPARENT = RESERVED_PREFIX + "traceparent"
#: The entry header holding the W3C ``tracestate`` of its transmit, when it has one.
TRACESTATE = RESERVED_PREFIX + "tracestate"
_NAME = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,{MAX_NAME_LENGTH - 1}}}")

#: No headers: what a message without any carries.
EMPTY: Mapping[str, str] = MappingProxyType({})


def check_headers(value: object, *, library: bool = False) -> dict[str, str] | None:
    """``value`` as a plain dict of valid headers, None for none (None or empty).

    ``library``: names under :data:`RESERVED_PREFIX` are allowed (the library's own).
    Raises :class:`~lr_client.errors.InvalidHeadersError` saying what is wrong.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidHeadersError(
            f"headers must be a mapping of str to str, got {type(value).__name__}"
        )
    most, total = (MAX_HEADERS, MAX_HEADERS_BYTES) if not library else LIBRARY_LIMITS
    if len(value) > most:
        raise InvalidHeadersError(f"{len(value)} headers exceed the limit of {most}")
    out: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidHeadersError(
                f"header name {name!r} must be 1 to {MAX_NAME_LENGTH} of a-z, 0-9, '.', '_', '-'"
                " (starting with a letter or digit)"
            )
        if name.startswith(RESERVED_PREFIX) and not library:
            raise InvalidHeadersError(f"header name {name!r}: {RESERVED_PREFIX}* is reserved")
        if not isinstance(text, str):
            raise InvalidHeadersError(f"header {name!r} must be a str, got {type(text).__name__}")
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise InvalidHeadersError(f"header {name!r} is not valid Unicode text") from exc
        if size > MAX_VALUE_BYTES:
            raise InvalidHeadersError(
                f"header {name!r} of {size} bytes exceeds the limit of {MAX_VALUE_BYTES}"
            )
        out[name] = text
    if not out:
        return None
    size = len(encode_headers(out) or b"")
    if size > total:
        raise InvalidHeadersError(f"headers of {size} bytes encoded exceed the limit of {total}")
    return out


def encode_headers(headers: Mapping[str, str] | None) -> bytes | None:
    """The stored form of ``headers`` (checked already): compact JSON; None for none."""
    if not headers:
        return None
    return json.dumps(
        dict(headers), ensure_ascii=False, separators=(",", ":"), sort_keys=True
    ).encode()


def decode_headers(blob: Any) -> Mapping[str, str]:
    """The read-only mapping of a stored form (bytes, a driver's buffer, or None: none)."""
    if blob is None or not len(blob):
        return EMPTY
    found = json.loads(bytes(blob))
    return MappingProxyType({str(k): str(v) for k, v in found.items()})


def received_headers(value: Mapping[str, str]) -> bytes | None:
    """The stored form of headers a peer sent, checked as the sender checks them
    (the library's own names allowed); a malformed map is a
    :class:`~lr_client.errors.ProtocolError`."""
    try:
        return encode_headers(check_headers(dict(value), library=True))
    except InvalidHeadersError as exc:
        raise ProtocolError(f"malformed entry headers: {exc}") from exc


def stored(blob: Any) -> bytes | None:
    """A stored form as a driver returns it, as bytes (None: none)."""
    return None if blob is None else bytes(blob)


__all__ = [
    "EMPTY",
    "LIBRARY_LIMITS",
    "MAX_HEADERS",
    "MAX_HEADERS_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_VALUE_BYTES",
    "RESERVED_PREFIX",
    "TRACEPARENT",
    "TRACESTATE",
    "check_headers",
    "decode_headers",
    "encode_headers",
    "received_headers",
    "stored",
]
