"""The keys of end-to-end encryption: a :class:`Keyring` of 256-bit keys by id.

A source's keyring names, per destination, the key that seals new entries
(its ``current`` key, unless ``destinations`` names another); a sink's keyring
holds the keys it may find in an envelope (:mod:`lr_client.encryption`): the
current one and, during a rotation, the older ones. Keys are read from a TOML
file or an environment variable (:meth:`Keyring.from_file`,
:meth:`Keyring.from_env`, :meth:`Keyring.from_config`), never from the
database. A key file::

    current = "2026-12"                 # seals new entries (default: the first key)
    [keys]
    2026-12 = "base64 of 32 random bytes"
    2026-06 = "..."                     # older: still opens the entries it sealed
    [destinations]                      # optional: another key for one destination
    site-c = "c-2026-12"

The environment variable holds ``id:base64`` pairs separated by commas, the
current key first. ``python -m lr_client.keys`` prints a new key.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lr_client.errors import ConfigError, KeyUnavailableError

#: What a key id may be: it is stored in every envelope, in clear.
KEY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Bytes of a key (AES-256).
KEY_BYTES = 32


def aesgcm() -> Any:
    """The AES-GCM class of ``cryptography`` (the ``crypto`` extra), imported when used."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise ConfigError(
            "end-to-end encryption needs the cryptography package: pip install 'lr[crypto]'"
        ) from exc
    return AESGCM


def generate_key() -> str:
    """A new random key, base64-encoded (as a key file or variable holds it)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def _decode(key_id: str, value: object, where: str) -> bytes:
    if not isinstance(key_id, str) or not KEY_ID_RE.fullmatch(key_id):
        raise ConfigError(f"{where}: invalid key id {key_id!r}: expected {KEY_ID_RE.pattern}")
    if isinstance(value, bytes):
        raw = value
    else:
        try:
            raw = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: key {key_id!r} is not base64") from None
    if len(raw) != KEY_BYTES:
        raise ConfigError(f"{where}: key {key_id!r} must be {KEY_BYTES} bytes, not {len(raw)}")
    return raw


class Keyring:
    """Keys by id; the one that seals new entries, per destination.

    ``keys``: ``{key id: 32 bytes, or their base64}``; ``current``: the id that
    seals new entries (default: the first); ``destinations``: ``{destination:
    key id}`` for destinations sealed under another key; ``sealed_headers``: the names
    of headers sealed with the payload (:mod:`lr_client.sealed_headers`). Keys are held in memory
    only; ``repr`` shows their ids, never their bytes.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes | str],
        current: str | None = None,
        destinations: Mapping[str, str] | None = None,
        *,
        sealed_headers: Iterable[str] = (),
        where: str = "keyring",
    ) -> None:
        self._keys = {k: _decode(k, v, where) for k, v in keys.items()}
        if not self._keys:
            raise ConfigError(f"{where}: no keys")
        self.current = current or next(iter(self._keys))
        self.destinations = dict(destinations or {})
        #: Header names sealed with the payload (:mod:`lr_client.sealed_headers`).
        self.sealed_headers = frozenset(sealed_headers)
        if isinstance(sealed_headers, str) or not all(
            isinstance(n, str) for n in self.sealed_headers
        ):
            raise ConfigError(f"{where}: sealed_headers must be a list of header names")
        for name, kid in [("current", self.current), *self.destinations.items()]:
            if kid not in self._keys:
                raise ConfigError(f"{where}: {name} names key {kid!r}, which is not given")
        cls = aesgcm()
        self._ciphers = {k: cls(v) for k, v in self._keys.items()}

    def __repr__(self) -> str:
        return f"Keyring(ids={sorted(self._keys)}, current={self.current!r})"

    @property
    def ids(self) -> list[str]:
        """The ids of the keys held."""
        return list(self._keys)

    def has(self, key_id: str) -> bool:
        """Whether the keyring holds ``key_id``."""
        return key_id in self._keys

    def cipher(self, key_id: str) -> Any:
        """The AES-GCM cipher of ``key_id``; :class:`KeyUnavailableError` if not held."""
        try:
            return self._ciphers[key_id]
        except KeyError:
            raise KeyUnavailableError(f"key {key_id!r} is not in this keyring") from None

    def key_for(self, destination: str) -> str:
        """The id of the key that seals new entries for ``destination``."""
        return self.destinations.get(destination, self.current)

    # -- where keys come from ------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, current: str | None = None) -> Keyring:
        """The keyring of a TOML key file (see the module); ``current`` overrides its own."""
        where = str(path)
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read the key file: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not TOML: {exc}") from None
        keys, dests = doc.get("keys", {}), doc.get("destinations", {})
        if not isinstance(keys, dict) or not isinstance(dests, dict):
            raise ConfigError(f"{where}: [keys] and [destinations] must be tables")
        extra = set(doc) - {"current", "keys", "destinations"}
        if extra:
            raise ConfigError(f"{where}: unknown keys {sorted(extra)}")
        return cls(keys, current or doc.get("current"), dests, where=where)

    @classmethod
    def from_env(
        cls, name: str, current: str | None = None, environ: Mapping[str, str] | None = None
    ) -> Keyring:
        """The keyring of the environment variable ``name``: ``id:base64`` pairs separated
        by commas, the current key first (unless ``current``)."""
        value = (os.environ if environ is None else environ).get(name, "")
        if not value.strip():
            raise ConfigError(f"environment variable {name} holds no keys")
        keys: dict[str, str] = {}
        for item in value.split(","):
            kid, sep, key = item.strip().partition(":")
            if not sep:
                raise ConfigError(f"{name}: expected id:base64 pairs separated by commas")
            keys[kid] = key
        return cls(keys, current, where=name)

    @classmethod
    def from_config(cls, section: Mapping[str, Any], base: Path | None = None) -> Keyring:
        """The keyring of a configuration table: ``file`` (a key file, relative to ``base``)
        or ``env`` (a variable's name), and optionally ``current`` and ``destinations``."""
        unknown = set(section) - {"file", "env", "current", "destinations", "sealed_headers"}
        if unknown or ("file" in section) == ("env" in section):
            raise ConfigError("encryption: give one of file or env (and current, destinations)")
        current = section.get("current")
        if "file" in section:
            path = Path(section["file"])
            ring = cls.from_file(path if base is None or path.is_absolute() else base / path)
        else:
            ring = cls.from_env(str(section["env"]))
        dests = {**ring.destinations, **dict(section.get("destinations", {}))}
        sealed = section.get("sealed_headers", ())
        return cls(
            ring._keys, current or ring.current, dests, sealed_headers=sealed, where="encryption"
        )


if __name__ == "__main__":
    print(generate_key())


__all__ = ["KEY_BYTES", "KEY_ID_RE", "Keyring", "aesgcm", "generate_key"]
