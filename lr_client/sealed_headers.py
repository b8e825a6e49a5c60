"""Headers sealed with the payload: those a keyring names travel encrypted.

A :class:`~lr_client.keys.Keyring` built with ``sealed_headers`` names the
headers that must not be readable on the way (a tenant id, a customer key).
At transmit they are taken out of the entry's headers and sealed, as one
envelope of the same keys and bindings as the payload's
(:mod:`lr_client.encryption`), into the library's header :data:`SEALED`
(base64); the other headers stay in clear (routing, tracing). The subscriber
opens it before the listener and gives the listener every header as the
source gave them. The sealed value obeys the header limits: sealed headers
that do not fit raise :class:`~lr_client.errors.InvalidHeadersError` at
transmit, and nothing is written.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from lr_client.encryption import open_sealed, seal
from lr_client.errors import DecryptionError
from lr_client.headers import RESERVED_PREFIX, check_headers, decode_headers, encode_headers
from lr_client.keys import Keyring

#: The library's header holding the sealed ones (base64 of an envelope).
SEALED = RESERVED_PREFIX + "sealed"
#: What the sealed plaintext starts with: an envelope of a payload never opens as headers.
_MARK = b"lr-headers\0"


def seal_headers(
    keyring: Keyring,
    headers: dict[str, str] | None,
    destinations: Sequence[str],
    source_id: str,
    client: str,
) -> dict[str, str] | None:
    """``headers`` (checked) with those ``keyring`` seals replaced by :data:`SEALED`."""
    names = keyring.sealed_headers
    if not headers or not names or names.isdisjoint(headers):
        return headers
    hidden = {k: v for k, v in headers.items() if k in names}
    out = {k: v for k, v in headers.items() if k not in names}
    plain = _MARK + (encode_headers(hidden) or b"")
    out[SEALED] = base64.b64encode(seal(keyring, plain, destinations, source_id, client)).decode()
    return check_headers(out, library=True)


def open_headers(
    keyring: Keyring, headers: Mapping[str, str], source_id: str, client: str
) -> Mapping[str, str]:
    """``headers`` with :data:`SEALED` opened into the headers it holds (as they were)."""
    value = headers.get(SEALED)
    if value is None:
        return headers
    try:
        envelope = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise DecryptionError(f"header {SEALED} is not base64") from None
    plain = open_sealed(keyring, envelope, source_id, client)
    if not plain.startswith(_MARK):
        raise DecryptionError(f"header {SEALED} does not hold sealed headers")
    out = {k: v for k, v in headers.items() if k != SEALED}
    out.update(decode_headers(plain[len(_MARK) :]))
    return MappingProxyType(out)


__all__ = ["SEALED", "open_headers", "seal_headers"]
