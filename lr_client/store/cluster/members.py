"""The :class:`~lr_client.store.contract.Members` role: a site's ``lr server`` processes.

``lrq_members`` holds one row per member (id, the process run that holds it
now, address, weight, heartbeat). Times are the *database's* clock, so the
members' own clocks never decide who is alive.

``lrq_unit_leases`` holds one row per unit of work. A unit's owner is a
member's *instance* (its process run): a member restarted after a crash
takes its row over with a new instance, so the leases of the dead run are
free at once. A lease is valid while its owner's heartbeat is; taking a unit
over raises its fencing token, in one conditional ``UPDATE`` on the row read
``FOR UPDATE``, so two members can never both take it.

Fencing: a write made for a unit (a cursor, a snapshot's completion, a trim)
first runs ``UPDATE lrq_unit_leases SET token = token WHERE unit = :u AND
owner = :me AND token = :t`` in its own transaction. Matching no row raises
:class:`~lr_client.errors.FencedError` and the transaction rolls back; a
match locks the lease row until commit, so a takeover waits for the write
and the new owner reads what it wrote.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import bindparam, delete, func, literal_column, select, true, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from lr_client.errors import InvalidInputError
from lr_client.records import Fence, Member, UnitLease
from lr_client.store.cluster.contract import Roster
from lr_client.store.db_errors import mapped_errors
from lr_client.store.role import Role
from lr_client.store.schema import tables as s

#: The longest member id and unit name the tables hold.
MAX_MEMBER_ID = 128
MAX_UNIT = 200


def _db_clock() -> ColumnElement[Any]:
    """PostgreSQL's clock, in seconds since the epoch."""
    return func.extract("epoch", func.clock_timestamp())


def _pg_heartbeat() -> Select[Any]:
    """PostgreSQL's heartbeat in one statement: the stamp, then every member and the
    count of leases the instance holds. The roster is read in the statement's snapshot,
    from before its own update (the caller puts the new stamp in the member's row);
    no row: the member is not this instance's."""
    m, u = s.members, s.unit_leases
    beat = (
        update(m)
        .where(
            m.c.member_id == bindparam("beat_member"), m.c.instance == bindparam("beat_instance")
        )
        .values(heartbeat_at=_db_clock())
        .returning(m.c.heartbeat_at.label("beat_at"))
        .cte("beat")
    )
    held = select(func.count()).where(u.c.owner == bindparam("beat_instance")).scalar_subquery()
    return (
        select(beat.c.beat_at, held.label("held"), *m.c)
        .select_from(beat.join(m, true()))
        .order_by(m.c.member_id)
    )


_PG_HEARTBEAT = _pg_heartbeat()


def _check_member_id(member_id: str) -> None:
    if not member_id or len(member_id) > MAX_MEMBER_ID or not member_id.isprintable():
        raise InvalidInputError(f"invalid member id {member_id!r}: 1 to 128 printable characters")


class MembersStore(Role):
    """Members, their heartbeats, and the leases of units of work."""

    def db_now(self, conn: Connection | None = None) -> float:
        """The database's clock, in seconds since the epoch (SQLite: this process's)."""
        if self.core.dialect != "postgresql":
            return time.time()
        stmt = select(_db_clock())
        if conn is not None:
            return float(conn.execute(stmt).scalar_one())
        with self.core.read() as own:
            return float(own.execute(stmt).scalar_one())

    # -- members --------------------------------------------------------------------------
    def join_member(self, member_id: str, instance: str, address: str, weight: int) -> Member:
        _check_member_id(member_id)
        if weight < 0:
            raise InvalidInputError(f"member weight must be >= 0, not {weight}")
        with self.core.write() as conn:
            now = self.db_now(conn)
            row = {
                "member_id": member_id,
                "instance": instance,
                "address": address,
                "weight": weight,
                "joined_at": now,
                "heartbeat_at": now,
            }
            self.core.upsert(conn, s.members, row, ["member_id"])
        return Member(member_id, instance, address, weight, now, now)

    def heartbeat_member(
        self, member_id: str, instance: str, lease_timeout: float
    ) -> Roster | None:
        if self.core.dialect == "postgresql":
            return self._pg_heartbeat(member_id, instance, lease_timeout)
        m = s.members
        mine = update(m).where(m.c.member_id == member_id, m.c.instance == instance)
        with self.core.write() as conn:
            at = time.time()
            if not conn.execute(mine.values(heartbeat_at=at)).rowcount:
                return None
            u = s.unit_leases
            held = conn.execute(select(func.count()).where(u.c.owner == instance)).scalar_one()
            return Roster(self._members(conn, at, lease_timeout), int(held))

    def _pg_heartbeat(self, member_id: str, instance: str, lease_timeout: float) -> Roster | None:
        """One statement, without a transaction of its own (a member beats every
        second: no BEGIN and COMMIT round trips)."""
        with mapped_errors(), self.core.engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            rows = auto.execute(
                _PG_HEARTBEAT, {"beat_member": member_id, "beat_instance": instance}
            ).all()
        if not rows:
            return None
        at = float(rows[0].beat_at)
        members = []
        for r in rows:
            own = (r.member_id, r.instance) == (member_id, instance)
            beat = at if own else float(r.heartbeat_at)
            members.append(
                Member(
                    str(r.member_id),
                    str(r.instance),
                    str(r.address),
                    int(r.weight),
                    float(r.joined_at),
                    beat,
                    at - beat <= lease_timeout,
                )
            )
        return Roster(members, int(rows[0].held))

    def leave_member(self, member_id: str, instance: str) -> int:
        leases = s.unit_leases
        with self.core.write() as conn:
            released = conn.execute(
                update(leases).where(leases.c.owner == instance).values(owner=None)
            ).rowcount
            conn.execute(
                delete(s.members).where(
                    s.members.c.member_id == member_id, s.members.c.instance == instance
                )
            )
        return int(released)

    def list_members(self, lease_timeout: float) -> list[Member]:
        with self.core.read() as conn:
            return self._members(conn, self.db_now(conn), lease_timeout)

    def _members(self, conn: Connection, now: float, lease_timeout: float) -> list[Member]:
        rows = conn.execute(select(s.members).order_by(s.members.c.member_id)).all()
        return [self._member(r, now - r.heartbeat_at <= lease_timeout) for r in rows]

    @staticmethod
    def _member(r: Row[tuple[object, ...]], alive: bool) -> Member:
        m = r._mapping
        return Member(
            str(m["member_id"]),
            str(m["instance"]),
            str(m["address"]),
            int(m["weight"]),
            float(m["joined_at"]),
            float(m["heartbeat_at"]),
            alive,
        )

    def set_member_weight(self, member_id: str, weight: int) -> bool:
        if weight < 0:
            raise InvalidInputError(f"member weight must be >= 0, not {weight}")
        m = s.members
        with self.core.write() as conn:
            n = conn.execute(
                update(m).where(m.c.member_id == member_id).values(weight=weight)
            ).rowcount
        return bool(n)

    def remove_member(self, member_id: str) -> bool:
        with self.core.write() as conn:
            found = conn.execute(
                select(s.members.c.instance).where(s.members.c.member_id == member_id)
            ).scalar()
            if found is None:
                return False
            conn.execute(
                update(s.unit_leases).where(s.unit_leases.c.owner == found).values(owner=None)
            )
            conn.execute(delete(s.members).where(s.members.c.member_id == member_id))
        return True

    # -- leases ---------------------------------------------------------------------------
    def list_leases(self) -> list[UnitLease]:
        u = s.unit_leases
        with self.core.read() as conn:
            rows = conn.execute(select(u).order_by(u.c.unit)).all()
        return [
            UnitLease(
                str(r.unit),
                None if r.owner is None else str(r.owner),
                str(r.member_id),
                int(r.token),
                float(r.acquired_at),
            )
            for r in rows
        ]

    def acquire_unit(
        self, unit: str, member_id: str, instance: str, lease_timeout: float
    ) -> Fence | None:
        if not unit or len(unit) > MAX_UNIT:
            raise InvalidInputError(f"invalid unit name {unit!r}")
        u, m = s.unit_leases, s.members
        with self.core.write() as conn:
            now = self.db_now(conn)
            blank: dict[str, object] = {
                "unit": unit,
                "owner": None,
                "member_id": "",
                "token": 0,
                "acquired_at": 0.0,
            }
            self.core.insert_ignore(conn, u, [blank], ["unit"])
            row = conn.execute(select(u).where(u.c.unit == unit).with_for_update()).one()
            if row.owner == instance:
                return Fence(unit, instance, int(row.token))
            if row.owner is not None:
                owner_alive: object = conn.execute(
                    select(literal_column("1")).where(
                        m.c.instance == row.owner, m.c.heartbeat_at >= now - lease_timeout
                    )
                ).first()
                if owner_alive is not None:
                    return None  # held: its owner releases it, or its heartbeat lapses
            token = int(row.token) + 1
            n = conn.execute(
                update(u)
                .where(u.c.unit == unit, u.c.token == row.token)
                .values(owner=instance, member_id=member_id, token=token, acquired_at=now)
            ).rowcount
        return Fence(unit, instance, token) if n else None

    def release_unit(self, fence: Fence) -> bool:
        u = s.unit_leases
        with self.core.write() as conn:
            n = conn.execute(
                update(u)
                .where(u.c.unit == fence.unit, u.c.owner == fence.owner, u.c.token == fence.token)
                .values(owner=None)
            ).rowcount
        return bool(n)

    def check_fence(self, fence: Fence) -> None:
        with self.core.write() as conn:
            self.core.hold_fence(conn, fence)


__all__ = ["MAX_MEMBER_ID", "MAX_UNIT", "MembersStore"]
