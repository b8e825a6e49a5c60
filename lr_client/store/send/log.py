"""The :class:`~lr_client.store.contract.SendLog` role: the application's transmit path."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from lr_client.records import CascadeRoute, EntryRef, NewLogEntry
from lr_client.store.cascade.relays import transmit_route
from lr_client.store.db_errors import mapped_errors
from lr_client.store.role import Role
from lr_client.store.schema import tables as s


class SendLogStore(Role):
    """Appends to the send log in the application's transaction."""

    def append_log_entries(
        self, conn: Connection, client_name: str, messages: Sequence[NewLogEntry]
    ) -> list[EntryRef]:
        if not messages:
            return []
        with mapped_errors():  # the application's transaction: map, never retry
            if not conn.in_transaction():
                # The rows go through the driver's own cursor, which SQLAlchemy
                # does not see: begin as its first statement would have (autobegin),
                # so the caller's commit() commits them.
                conn.begin()
            return self.core.insert_entries(conn, client_name, messages)

    def positions_of(self, refs: Sequence[EntryRef]) -> list[int | None]:
        if all(r.position is not None for r in refs):
            return [r.position for r in refs]
        self.core.sequence()
        with self.core.read() as conn:
            found = self.core.txn_bases(conn, sorted({r.txid for r in refs if r.position is None}))
        out: list[int | None] = []
        for r in refs:
            base = found.get(r.txid)
            if r.position is None and base is not None:
                out.append(base + r.ord)
            else:
                out.append(r.position)
        return out

    def flow_state(self, client_name: str) -> tuple[bool, list[str]]:
        """(backpressure on, slow destinations) for a client."""
        with self.core.read() as conn:
            row = conn.execute(
                select(s.flow_control).where(s.flow_control.c.client_name == client_name)
            ).first()
        if row is None:
            return False, []
        return bool(row.backpressure), [x for x in row.slow_destinations.split(",") if x]

    def transmit_route(self, client_name: str) -> CascadeRoute | None:
        with self.core.read() as conn:
            return transmit_route(conn, client_name)

    def analyze(self) -> None:
        self.core.analyze()

    def sequence(self) -> int:
        return self.core.sequence()

    def head_position(self, conn: Connection | None = None) -> int:
        return self.core.head_position(conn)


__all__ = ["SendLogStore"]
