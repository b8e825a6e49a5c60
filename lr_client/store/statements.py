"""Statements the store runs several times a second, each built once (per shape).

Built anew per call, such a statement cost more than running it (its construction and
cache key): a sender saves cursors and holds its leases, a receiver saves its progress,
per batch. The values are bind parameters; an upsert's update sets the conflicting row's
columns to those of the row it tried to insert (``excluded``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.engine import Connection

from lr_client.errors import FencedError
from lr_client.records import Fence
from lr_client.store.schema import tables as s

_L = s.unit_leases
_HOLD = (
    update(_L)
    .where(
        _L.c.unit == bindparam("f_unit"),
        _L.c.owner == bindparam("f_owner"),
        _L.c.token == bindparam("f_token"),
    )
    .values(token=_L.c.token)
)


def hold_fence(conn: Connection, fence: Fence) -> None:
    """Hold ``fence``'s lease row for the transaction, or raise :class:`FencedError`."""
    n = conn.execute(
        _HOLD, {"f_unit": fence.unit, "f_owner": fence.owner, "f_token": fence.token}
    ).rowcount
    if not n:
        raise FencedError(
            f"unit {fence.unit}: the lease of token {fence.token} is no longer this member's"
        )


class Upserts:
    """The statements of one dialect's ``INSERT ... ON CONFLICT``, by shape."""

    def __init__(self, dialect_insert: Callable[[Any], Any]) -> None:
        self.dialect_insert = dialect_insert
        self._built: dict[tuple[object, ...], Any] = {}

    def upsert(
        self, table: Any, columns: Sequence[str], keys: Sequence[str], keep: Sequence[str] = ()
    ) -> Any:
        """Insert ``columns``, or update all but ``keys`` and ``keep`` on a key conflict."""
        shape = ("upsert", table.name, tuple(columns), tuple(keys), tuple(keep))
        stmt = self._built.get(shape)
        if stmt is None:
            stmt = self.dialect_insert(table)
            set_ = {c: stmt.excluded[c] for c in columns if c not in keys and c not in keep}
            stmt = stmt.on_conflict_do_update(index_elements=list(keys), set_=set_)
            self._built[shape] = stmt
        return stmt

    def ignore(self, table: Any, keys: Sequence[str]) -> Any:
        """Insert, doing nothing on a conflict of ``keys``."""
        shape = ("ignore", table.name, tuple(keys))
        stmt = self._built.get(shape)
        if stmt is None:
            stmt = self.dialect_insert(table).on_conflict_do_nothing(index_elements=list(keys))
            self._built[shape] = stmt
        return stmt


__all__ = ["Upserts", "hold_fence"]
