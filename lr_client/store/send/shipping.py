"""The :class:`~lr_client.store.contract.Shipping` role: a sender session's reads and cursors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Row

from lr_client.headers import stored
from lr_client.records import Backlog, Cursor, Fence, LogRange, ReplicationType, SendEntry
from lr_client.store.byte_bounds import fill, payload_size, sized, within
from lr_client.store.role import Role
from lr_client.store.schema import tables as s
from lr_client.store.watches import Watch


class ShippingStore(Role):
    """Reads of the send log by stream, and the acknowledged cursors."""

    def watch_sends(self, wake: Callable[[], None]) -> Watch | None:
        return self.core.watch_sends(wake)

    @property
    def every_send_wakes(self) -> bool:
        return self.core.every_send_wakes

    def read_log_entries(
        self,
        destination: str,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
        up_to: int | None = None,
    ) -> list[SendEntry]:
        num = self.core.site_numbers().get(destination)
        if num is None:
            num = self.core.site_numbers(refresh=True).get(destination)
            if num is None:
                return []
        self.core.sequence()
        e = s.send_log_entries
        query = self._log_read(num, limit, max_bytes, up_to is not None)
        params = {"client_name": client_name, "after": after, "up_to": up_to}
        # Statements, not a transaction (PostgreSQL: no BEGIN and COMMIT round trips per
        # batch): the rows found are immutable, and ``fill`` stops before one trimmed since.
        with self.core.read_statements() as conn:
            found = conn.execute(query, params).all()
            rows = fill(conn, within(found, max_bytes), e.c.position, e.c.payload)
            end = found[-1].position if len(found) >= limit else up_to
            sparse = self.core.tagged_read_walked_others(
                conn, num, client_name, after, end, len(found)
            )
        if sparse:
            self.core.index_destination(num)
        return [
            SendEntry(
                position=r.position,
                client_name=client_name,
                type=ReplicationType.LOG_ENTRY_SYNC,
                payload=payload,
                created_at=r.created_at,
                key=None if r.partition_key is None else bytes(r.partition_key),
                headers=stored(r.headers),
            )
            for r, payload in rows
        ]

    def _log_read(self, num: int, limit: int, max_bytes: int | None, bounded: bool) -> Any:
        """The statement of :meth:`read_log_entries`, built once per shape (a sender reads
        every few milliseconds at live rates: building it cost as much as running it)."""
        built: dict[tuple[int, int, int | None, bool], Any] = self.__dict__.setdefault(
            "_log_reads", {}
        )
        key = (num, limit, max_bytes, bounded)
        query = built.get(key)
        if query is None:
            e = s.send_log_entries
            query = self.core.tagged_query(num, bindparam("client_name"), bindparam("after"))
            query = query.add_columns(e.c.partition_key, e.c.headers)
            query = query.add_columns(*sized(e.c.payload, limit, max_bytes))
            if bounded:
                query = query.where(e.c.position <= bindparam("up_to"))
            built[key] = query = query.order_by(e.c.position).limit(limit)
        return query

    def read_client_log(
        self, client_name: str, after: int, limit: int, max_bytes: int | None = None
    ) -> LogRange:
        self.core.sequence()
        e = s.send_log_entries
        query = (
            select(
                e.c.position,
                e.c.dest_nums,
                e.c.created_at,
                e.c.partition_key,
                e.c.headers,
                *sized(e.c.payload, limit, max_bytes),
            )
            .where(e.c.client_name == client_name, e.c.position > after)
            .order_by(e.c.position)
            .limit(limit)
        )
        with self.core.read_statements() as conn:  # as read_log_entries
            found = conn.execute(query).all()
            rows = fill(conn, within(found, max_bytes), e.c.position, e.c.payload)
        names: dict[Any, tuple[str, ...]] = {}  # few distinct destination sets per read

        def destinations(value: Any) -> tuple[str, ...]:
            key = value if isinstance(value, str) else tuple(value)
            got = names.get(key)
            if got is None:
                got = names[key] = tuple(
                    self.core.site_name(n) for n in self.core.dest_nums_of(value)
                )
            return got

        return LogRange(
            (
                SendEntry(
                    position=r.position,
                    client_name=client_name,
                    type=ReplicationType.LOG_ENTRY_SYNC,
                    payload=payload,
                    destinations=destinations(r.dest_nums),
                    created_at=r.created_at,
                    key=None if r.partition_key is None else bytes(r.partition_key),
                    headers=stored(r.headers),
                )
                for r, payload in rows
            ),
            complete=len(found) < limit and len(rows) == len(found),
        )

    def oldest_position(self, client_name: str | None = None) -> int | None:
        query = select(func.min(s.send_log_entries.c.position))
        if client_name is not None:
            query = query.where(s.send_log_entries.c.client_name == client_name)
        with self.core.read() as conn:
            value = conn.execute(query).scalar()
        return None if value is None else int(value)

    @staticmethod
    def _cursor(row: Row[Any]) -> Cursor:
        return Cursor(
            destination=row.destination,
            client_name=row.client_name,
            position=row.position,
            acked_at=row.acked_at,
            needs_snapshot=bool(row.needs_snapshot),
        )

    def get_cursor(self, destination: str, client_name: str) -> Cursor:
        with self.core.read() as conn:
            row = conn.execute(
                select(s.cursors).where(
                    s.cursors.c.destination == destination, s.cursors.c.client_name == client_name
                )
            ).first()
        return self._cursor(row) if row else Cursor(destination, client_name)

    def list_cursors(self) -> list[Cursor]:
        with self.core.read() as conn:
            rows = conn.execute(
                select(s.cursors).order_by(s.cursors.c.destination, s.cursors.c.client_name)
            ).all()
        return [self._cursor(r) for r in rows]

    def set_cursor(
        self,
        destination: str,
        client_name: str,
        position: int,
        *,
        needs_snapshot: bool | None = None,
        fence: Fence | None = None,
    ) -> None:
        with self.core.write() as conn:
            self.core.hold_fence(conn, fence)
            self.core.write_cursor(conn, destination, client_name, position, needs_snapshot)

    def backlog(self, destination: str, client_name: str) -> Backlog:
        return self.backlogs([(destination, client_name)])[0]

    def backlogs(self, streams: Sequence[tuple[str, str]]) -> list[Backlog]:
        if not streams:
            return []
        nums = self.core.site_numbers()
        self.core.sequence()  # once for them all
        out = []
        with self.core.read() as conn:
            c = s.cursors
            cursors = {
                (r.destination, r.client_name): r.position
                for r in conn.execute(select(c.c.destination, c.c.client_name, c.c.position))
            }
            for destination, client_name in streams:
                num = nums.get(destination)
                if num is None:
                    out.append(Backlog(destination, client_name))
                    continue
                after = cursors.get((destination, client_name), 0)
                query = self.core.tagged_query(num, client_name, after)
                sub = query.add_columns(payload_size(s.send_log_entries.c.payload)).subquery()
                row = conn.execute(
                    select(
                        func.count(),
                        func.coalesce(func.sum(sub.c.size), 0),
                        func.min(sub.c.created_at),
                    )
                ).one()
                out.append(Backlog(destination, client_name, int(row[0]), int(row[1]), row[2]))
        return out

    def log_streams(self, after: int = 0) -> tuple[set[tuple[str, str]], int]:
        """The (destination, client) pairs of the send queue's entries after ``after``.

        Also the highest position read (``after`` when there is none), so a
        caller can read only what was sequenced since: positions are assigned
        in commit order, none can appear below it later.
        """
        self.core.sequence()
        e = s.send_log_entries
        with self.core.read() as conn:
            top = conn.execute(select(func.max(e.c.position)).where(e.c.position > after)).scalar()
            if top is None:
                return set(), after
            rows = conn.execute(
                select(e.c.client_name, e.c.dest_nums)
                .where(e.c.position > after, e.c.position <= top)
                .distinct()
            ).all()
        pairs = {
            (self.core.site_name(num), str(r.client_name))
            for r in rows
            for num in self.core.dest_nums_of(r.dest_nums)
        }
        return pairs, int(top)


__all__ = ["ShippingStore"]
