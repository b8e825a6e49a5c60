"""Reads bounded by bytes: the one byte-cut rule, and size-first reads of payloads.

Every read of entries (send log, snapshot, receive queue) takes at most
``limit`` entries and, past the first, no more than ``max_bytes``; it loads no
large payload of an entry beyond that.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import case, func, null, select
from sqlalchemy.engine import Connection

#: Bytes counted per entry on top of its payload when a read is bounded by bytes.
ENTRY_OVERHEAD = 32


class ByteCut:
    """The one byte-cut rule of every read bounded by bytes.

    Entries are taken in order while their payloads, plus ``ENTRY_OVERHEAD``
    each, stay within ``max_bytes`` (no limit if None); the first is always
    taken, so an entry larger than the limit travels alone.
    """

    __slots__ = ("count", "max_bytes", "total")

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.count = 0

    def take(self, payload_bytes: int) -> bool:
        """Count the next entry if it is within the limit; whether it is."""
        total = self.total + payload_bytes + ENTRY_OVERHEAD
        if self.max_bytes is not None and self.count and total > self.max_bytes:
            return False
        self.total, self.count = total, self.count + 1
        return True


def bytes_prefix(sizes: Iterable[int], max_bytes: int | None) -> int:
    """How many leading entries of these payload sizes one read within ``max_bytes`` takes."""
    cut = ByteCut(max_bytes)
    for size in sizes:
        if not cut.take(size):
            break
    return cut.count


def cut_to_bytes(rows: Sequence[Any], max_bytes: int | None) -> list[Any]:
    """The prefix of ``rows`` (each with a ``payload``) within ``max_bytes``; at least one."""
    return list(rows[: bytes_prefix((len(r.payload) for r in rows), max_bytes)])


def payload_size(payload: Any) -> Any:
    """A payload's size in bytes, read without loading the payload.

    SQLite takes a blob's length from its record header, PostgreSQL a bytea's
    from its (TOAST) header: neither reads the value itself.
    """
    return func.length(payload).label("size")


@functools.lru_cache(maxsize=64)
def sized(payload: Any, limit: int, max_bytes: int | None) -> tuple[Any, Any]:
    """The last two columns, ``size`` and ``inline``, of a read of at most ``limit`` entries.

    ``inline`` is the payload itself when it is small (at most ``max_bytes //
    limit``, so all such payloads of the read together stay within
    ``max_bytes``), else NULL: the payload is loaded afterwards (:func:`fill`)
    only if its entry is within the byte limit. So a read of small entries
    stays one query, and a read never loads more than twice its limit.
    """
    size = payload_size(payload)
    if max_bytes is None:
        return size, payload.label("inline")
    small = max(0, max_bytes // max(1, limit))
    return size, case((func.length(payload) <= small, payload), else_=null()).label("inline")


def within(rows: Sequence[Any], max_bytes: int | None) -> list[Any]:
    """The leading ``rows`` (read with :func:`sized`) one read takes, by the byte-cut rule."""
    if max_bytes is None:
        return list(rows)
    # The running totals of (payload + overhead), then the first beyond the limit:
    # :class:`ByteCut`'s rule, without a call per row.
    totals = list(itertools.accumulate(r[-2] + ENTRY_OVERHEAD for r in rows))
    return list(rows[: max(1, bisect.bisect_right(totals, max_bytes))]) if rows else []


def fill(
    conn: Connection, rows: Sequence[Any], key: Any, payload: Any, *scope: Any
) -> list[tuple[Any, bytes]]:
    """Each of ``rows`` (key first, read with :func:`sized`) with its payload.

    Loads the payloads that were not inline, by their ``key`` column (and the
    ``scope`` conditions, e.g. a partition's); stops before an entry deleted
    meanwhile (a trim, a superseded snapshot).
    """
    missing = [r[0] for r in rows if r[-1] is None]
    found: dict[Any, Any] = {}
    if missing:
        query = select(key, payload).where(key.in_(missing), *scope)
        found = {k: v for k, v in conn.execute(query)}
    out: list[tuple[Any, bytes]] = []
    for r in rows:
        value = r[-1]
        if value is None:
            value = found.get(r[0])
            if value is None:
                break
        out.append((r, value if type(value) is bytes else bytes(value)))
    return out


__all__ = [
    "ENTRY_OVERHEAD",
    "ByteCut",
    "bytes_prefix",
    "cut_to_bytes",
    "fill",
    "payload_size",
    "sized",
    "within",
]
