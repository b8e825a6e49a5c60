"""End-to-end encryption of payloads: the envelope a source seals and a sink opens.

A payload is encrypted once, with AES-256-GCM under a random data key; the
data key is wrapped (AES-GCM) under the key of each destination
(:meth:`~lr_client.keys.Keyring.key_for`, one wrap per distinct key), so one
stored entry serves every destination, a relay forwards it unread, and each
sink opens it with its own key alone. The envelope describes itself::

    b"LRE" | version (1) | n (1) | n x [id length (1) | key id | nonce (12) | wrapped key (48)]
        | nonce (12) | ciphertext and tag

Both encryptions bind the envelope to its source (the origin, in a cascade) and
client as associated data; the payload's also covers the header (every key id
and wrap). An envelope moved to another client or source, or altered, does
not open (:class:`~lr_client.errors.DecryptionError`); one whose key ids are
all unknown to the keyring raises :class:`~lr_client.errors.KeyUnavailableError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from lr_client.errors import DecryptionError, KeyUnavailableError
from lr_client.keys import KEY_BYTES, Keyring, aesgcm

MAGIC = b"LRE"
VERSION = 1
NONCE = 12
TAG = 16
WRAPPED = NONCE + KEY_BYTES + TAG


def _aad(kind: bytes, source_id: str, client_name: str) -> bytes:
    return b"lr-e2e\0%b\0%b\0%b" % (kind, source_id.encode(), client_name.encode())


def is_sealed(payload: bytes) -> bool:
    """Whether ``payload`` is an envelope (of a version this release reads or not)."""
    return payload[:3] == MAGIC


def seal(
    keyring: Keyring, payload: bytes, destinations: Iterable[str], source_id: str, client: str
) -> bytes:
    """``payload`` sealed for ``destinations``, bound to ``source_id`` and ``client``."""
    return seal_for_keys(
        keyring, payload, {keyring.key_for(d) for d in destinations}, source_id, client
    )


def seal_for_keys(
    keyring: Keyring, payload: bytes, key_ids: Iterable[str], source_id: str, client: str
) -> bytes:
    """``payload`` sealed under each of ``key_ids`` (of ``keyring``)."""
    ids = sorted(set(key_ids))
    data_key = os.urandom(KEY_BYTES)
    parts = [MAGIC, bytes((VERSION, len(ids)))]
    for kid in ids:
        raw = kid.encode()
        nonce = os.urandom(NONCE)
        wrap_aad = _aad(b"key:" + raw, source_id, client)
        parts += [
            bytes((len(raw),)),
            raw,
            nonce,
            keyring.cipher(kid).encrypt(nonce, data_key, wrap_aad),
        ]
    header = b"".join(parts)
    nonce = os.urandom(NONCE)
    body = aesgcm()(data_key).encrypt(nonce, payload, _aad(b"payload", source_id, client) + header)
    return header + nonce + bytes(body)


def sealer(keyring: Keyring, source_id: str, client: str) -> Callable[[bytes], bytes]:
    """Seals a payload for every destination ``keyring`` knows: under its current key and
    each destination's (a full sync's rows, which destinations may join later)."""
    ids = {keyring.current, *keyring.destinations.values()}
    return lambda payload: seal_for_keys(keyring, payload, ids, source_id, client)


def key_ids(envelope: bytes) -> list[str]:
    """The ids of the keys ``envelope`` is wrapped under."""
    return [kid for kid, _ in _parse(envelope)[0]]


def _parse(envelope: bytes) -> tuple[list[tuple[str, bytes]], int]:
    """The (key id, nonce + wrapped key) entries and where the header ends."""
    if not is_sealed(envelope) or len(envelope) < 5:
        raise DecryptionError("the payload is not an encrypted envelope")
    if envelope[3] != VERSION:
        raise DecryptionError(f"an envelope of version {envelope[3]}: this release reads {VERSION}")
    at, wraps = 5, []
    try:
        for _ in range(envelope[4]):
            size = envelope[at]
            kid = envelope[at + 1 : at + 1 + size].decode()
            at += 1 + size
            wrapped = envelope[at : at + WRAPPED]
            if len(wrapped) != WRAPPED:
                raise IndexError
            wraps.append((kid, wrapped))
            at += WRAPPED
    except (IndexError, UnicodeDecodeError):
        raise DecryptionError("a malformed envelope header") from None
    if len(envelope) < at + NONCE + TAG:
        raise DecryptionError("a truncated envelope")
    return wraps, at


def open_sealed(keyring: Keyring, envelope: bytes, source_id: str, client: str) -> bytes:
    """The payload of ``envelope``; :class:`KeyUnavailableError` if the keyring holds none
    of its keys, :class:`DecryptionError` if it does not open."""
    from cryptography.exceptions import InvalidTag

    wraps, end = _parse(envelope)
    held = [(kid, w) for kid, w in wraps if keyring.has(kid)]
    if not held:
        names = ", ".join(kid for kid, _ in wraps) or "none"
        raise KeyUnavailableError(
            f"no key of this keyring opens the entry: it is sealed under {names}; "
            f"the keyring holds {', '.join(keyring.ids)}"
        )
    kid, wrapped = held[0]
    try:
        data_key = keyring.cipher(kid).decrypt(
            wrapped[:NONCE], wrapped[NONCE:], _aad(b"key:" + kid.encode(), source_id, client)
        )
        aad = _aad(b"payload", source_id, client) + envelope[:end]
        body = envelope[end:]
        return bytes(aesgcm()(data_key).decrypt(body[:NONCE], body[NONCE:], aad))
    except InvalidTag:
        raise DecryptionError(
            f"the entry does not open with key {kid!r}: a wrong key under that id, or an "
            f"envelope altered or not of {source_id}/{client}"
        ) from None


__all__ = [
    "MAGIC",
    "VERSION",
    "is_sealed",
    "key_ids",
    "open_sealed",
    "seal",
    "seal_for_keys",
    "sealer",
]
