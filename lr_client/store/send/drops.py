"""The records of streams the send queue gave up (``lrq_drops``), as every role reads them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, Row

from lr_client.records import DropRecord
from lr_client.store.schema import tables as s


def drop_record(row: Row[Any]) -> DropRecord:
    return DropRecord(
        row.destination, row.client_name, row.first_dropped_position, row.dropped_at, row.reason
    )


_DROPS = select(s.drops)
_DROPS_OF = _DROPS.where(s.drops.c.destination == bindparam("destination"))


def read_drops(conn: Connection, destination: str | None = None) -> list[DropRecord]:
    """The drop records (of one destination, if given)."""
    if destination is None:
        rows = conn.execute(_DROPS)
    else:
        rows = conn.execute(_DROPS_OF, {"destination": destination})
    return [drop_record(r) for r in rows.all()]


__all__ = ["drop_record", "read_drops"]
