"""Partitioners: which of a sink's ``N`` partitions delivers an entry's key.

A :class:`Partitioner` maps a partition key (bytes) and a partition count to
a partition in ``range(count)``. It must give the same answer in every
process and release for the same key and count: the partition count is
stored with each receive queue's delivery state, and a partitioner that
changed its mind between two runs would reorder the entries of a key.

Built in:

* ``"hash"`` (:class:`HashPartitioner`): BLAKE2b (8-byte digest) of the
  key, as an unsigned big-endian integer, modulo the count. Python's
  ``hash()`` is salted per process and is never used.
* ``"range"`` (:class:`RangePartitioner`): sorted boundaries; a key below the
  first goes to partition 0, one at or above boundary ``i`` to ``i + 1``
  (``len(boundaries) + 1`` partitions).

Any callable ``(key, count) -> int`` can be given from code, or as
``"package.module:function"`` from configuration (:func:`load_partitioner`).
"""

from __future__ import annotations

import bisect
import hashlib
import importlib
import itertools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from lr_client.errors import ConfigError


@runtime_checkable
class Partitioner(Protocol):
    """Maps a partition key to one of ``count`` partitions, the same way everywhere."""

    def __call__(self, key: bytes, count: int) -> int:
        """The partition of ``key``, in ``range(count)``."""
        ...


class HashPartitioner:
    """BLAKE2b-64 of the key modulo the partition count: stable across processes."""

    name = "hash"

    def __call__(self, key: bytes, count: int) -> int:
        digest = hashlib.blake2b(key, digest_size=8).digest()
        return int.from_bytes(digest, "big") % count

    def __repr__(self) -> str:
        return "HashPartitioner()"


class RangePartitioner:
    """Key ranges split at sorted ``boundaries`` (bytes; a str is UTF-8).

    Partition 0 holds the keys below ``boundaries[0]``, partition ``i`` those
    from ``boundaries[i - 1]`` up to ``boundaries[i]``: ``len(boundaries) + 1``
    partitions, which must be the subscriber's count.
    """

    name = "range"

    def __init__(self, boundaries: Sequence[bytes | str]) -> None:
        keys = [b.encode() if isinstance(b, str) else bytes(b) for b in boundaries]
        if not keys:
            raise ConfigError("a range partitioner needs at least one boundary")
        if any(a >= b for a, b in itertools.pairwise(keys)):
            raise ConfigError("range partitioner boundaries must be strictly increasing")
        self.boundaries = keys

    @property
    def partitions(self) -> int:
        """How many partitions the boundaries make."""
        return len(self.boundaries) + 1

    def __call__(self, key: bytes, count: int) -> int:
        if count != self.partitions:
            raise ConfigError(
                f"range partitioner has {self.partitions} partitions, the subscriber {count}"
            )
        return bisect.bisect_right(self.boundaries, key)

    def __repr__(self) -> str:
        return f"RangePartitioner({self.boundaries!r})"


def load_partitioner(
    spec: str | Partitioner, boundaries: Sequence[bytes | str] | None = None
) -> Partitioner:
    """A partitioner from its configuration: ``"hash"``, ``"range"`` (with
    ``boundaries``), ``"package.module:function"``, or a callable as it is.

    Raises :class:`~lr_client.errors.ConfigError` for anything else.
    """
    if not isinstance(spec, str):
        if not callable(spec):
            raise ConfigError(f"a partitioner must be callable, got {type(spec).__name__}")
        return spec
    if spec == "hash":
        return HashPartitioner()
    if spec == "range":
        return RangePartitioner(boundaries or ())
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"partitioner must be 'hash', 'range' or 'package.module:function', not {spec!r}"
        )
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load partitioner {spec!r}: {exc}") from exc
    if not callable(found):
        raise ConfigError(f"partitioner {spec!r} is not callable")
    return found  # type: ignore[no-any-return]


def partition_of(partitioner: Partitioner, key: bytes, count: int) -> int:
    """``partitioner(key, count)``, checked to be in ``range(count)`` (else ConfigError)."""
    found = partitioner(key, count)
    if not isinstance(found, int) or not 0 <= found < count:
        raise ConfigError(f"partitioner {partitioner!r} gave {found!r} for {count} partitions")
    return found


__all__ = [
    "HashPartitioner",
    "Partitioner",
    "RangePartitioner",
    "load_partitioner",
    "partition_of",
]
