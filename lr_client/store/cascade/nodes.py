"""The :class:`~lr_client.store.contract.Cascading` role: a node's cascade rows and relay reads.

A branch relays a cascaded client ``C`` of origin ``R`` from its own receive
queue ``LRQ_Recv_<C>__<R>`` (no second copy): its log entries keep their
origin positions (``source_position``), in ``seq`` order. Such a queue is
*relayed* (``lrq_cascade`` says this node is a branch of ``C`` with origin
``R``), and its entries stay past delivery until every node below has them:

* the *relay floor* (:meth:`CascadeStore.relay_floor`): the lowest position
  acknowledged by a child that is not dropped (its ``lrq_cursors`` row), and
  at most ``extra_floor`` (the set's global watermark, given by the caller);
* SQLite deletes a relayed queue's entries at :meth:`CascadeStore.trim_relay`
  only, not at delivery; PostgreSQL's rotation
  (:mod:`lr_client.store.recv.rotation`) truncates no slot that holds an
  entry of a relayed queue above its floor, and deletes no row;
* the last end marker of a full sync the branch applied stays: its base is
  where the relay's log entries start (older log entries of the queue may
  repeat positions above it, and are never relayed);
* the relay's trim mark (``lrq_trim_marks`` of the origin's site number and
  ``C``): every log entry above it is still held. A child can be served
  from position ``p`` iff ``p`` is at or above this mark and the base.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection

from lr_client.cascade_roles import CascadeRole
from lr_client.headers import stored
from lr_client.names import recv_queue_name, validate_name
from lr_client.records import CascadeChild, CascadeNode, ReplicationType, SendEntry
from lr_client.store.byte_bounds import fill, sized, within
from lr_client.store.cascade.relays import (
    NODES_KEY,
    last_end_query,
    last_end_seq,
    relay_delivered,
    relay_mark,
    relay_queue_id,
    relayed_queue_ids,
    revoke_leases,
)
from lr_client.store.role import Role
from lr_client.store.schema import tables as s

_R, _C, _K, _G = s.recv_entries, s.cascade, s.cascade_children, s.queue_registry
_RELAY_TOP = select(func.max(_R.c.seq)).where(_R.c.queue_id == bindparam("qid"))

_LOG = int(ReplicationType.LOG_ENTRY_SYNC)
_END = int(ReplicationType.LAST_FULL_SYNC_ENTRY)


class CascadeStore(Role):
    """Cascade rows (``lrq_cascade``, ``lrq_cascade_children``) and relay reads."""

    @staticmethod
    def _node(r: Any) -> CascadeNode:
        return CascadeNode(
            r.client_name,
            r.origin_id,
            CascadeRole(r.role),
            r.provider_id,
            int(r.epoch),
            r.config_provider,
            int(r.global_watermark),
            float(r.updated_at),
        )

    def apply_cascade_config(
        self,
        client_name: str,
        origin_id: str,
        role: str,
        provider_id: str,
        children: Sequence[str] = (),
        nodes: Sequence[str] | None = None,
    ) -> CascadeNode:
        validate_name(client_name, "client name")
        validate_name(origin_id, "site id")
        if provider_id:
            validate_name(provider_id, "site id")
        for child in [*children, *(nodes or ())]:
            validate_name(child, "site id")
        try:
            role = CascadeRole(role).value
        except ValueError:
            roles = tuple(r.value for r in CascadeRole)
            raise ValueError(f"role must be one of {roles}, not {role!r}") from None
        now = time.time()
        with self.core.write() as conn:
            row = conn.execute(
                select(_C).where(_C.c.client_name == client_name).with_for_update()
            ).first()
            relayed = set(relayed_queue_ids(conn, client_name))
            if row is None:
                conn.execute(
                    _C.insert().values(
                        client_name=client_name,
                        origin_id=origin_id,
                        role=role,
                        provider_id=provider_id,
                        epoch=1 if provider_id else 0,
                        config_provider=provider_id,
                        global_watermark=0,
                        updated_at=now,
                    )
                )
            else:
                values: dict[str, Any] = {"origin_id": origin_id, "role": role, "updated_at": now}
                if provider_id != row.config_provider:  # the operator edited the configuration
                    values.update(
                        provider_id=provider_id,
                        config_provider=provider_id,
                        epoch=int(row.epoch) + 1,
                    )
                conn.execute(update(_C).where(_C.c.client_name == client_name).values(**values))
            if children:
                self.core.insert_ignore(
                    conn,
                    _K,
                    [{"client_name": client_name, "child_id": c} for c in children],
                    ["client_name", "child_id"],
                )
            if nodes is not None:
                self._record_nodes(conn, client_name, nodes)
            changed = relayed.symmetric_difference(relayed_queue_ids(conn, client_name))
            if changed:
                revoke_leases(conn, sorted(changed))
            found = conn.execute(select(_C).where(_C.c.client_name == client_name)).one()
        return self._node(found)

    def _record_nodes(self, conn: Connection, client_name: str, nodes: Sequence[str]) -> None:
        self.core.insert_ignore(conn, s.meta, [{"key": NODES_KEY, "value": "{}"}], ["key"])
        locked = select(s.meta.c.value).where(s.meta.c.key == NODES_KEY).with_for_update()
        sets = dict(json.loads(conn.execute(locked).scalar_one()))
        sets[client_name] = sorted(set(nodes))
        conn.execute(
            update(s.meta)
            .where(s.meta.c.key == NODES_KEY)
            .values(value=json.dumps(sets, sort_keys=True))
        )

    def cascade_node(self, client_name: str) -> CascadeNode | None:
        with self.core.read() as conn:
            row = conn.execute(select(_C).where(_C.c.client_name == client_name)).first()
        return None if row is None else self._node(row)

    def list_cascade_nodes(self) -> list[CascadeNode]:
        with self.core.read() as conn:
            rows = conn.execute(select(_C).order_by(_C.c.client_name)).all()
        return [self._node(r) for r in rows]

    def cascade_children(self, client_name: str) -> list[CascadeChild]:
        with self.core.read() as conn:
            rows = conn.execute(
                select(_K).where(_K.c.client_name == client_name).order_by(_K.c.child_id)
            ).all()
        return [
            CascadeChild(
                r.client_name,
                r.child_id,
                int(r.epoch),
                int(r.local_watermark),
                int(r.acked_position),
                float(r.reported_at),
                bool(r.dropped),
            )
            for r in rows
        ]

    def mark_child_dropped(self, client_name: str, child_id: str, dropped: bool = True) -> bool:
        with self.core.write() as conn:
            done = conn.execute(
                update(_K)
                .where(_K.c.client_name == client_name, _K.c.child_id == child_id)
                .values(dropped=dropped)
            )
        return bool(done.rowcount)

    # -- relay reads ------------------------------------------------------------------------
    def _relay_queue(self, conn: Connection, client_name: str, origin_id: str) -> int | None:
        name = recv_queue_name(client_name, origin_id)
        if name not in self.core.queue_ids:
            qid = relay_queue_id(conn, client_name, origin_id)
            if qid is None:
                return None
            self.core.queue_ids[name] = qid
        return self.core.queue_ids[name]

    def read_relay(
        self,
        client_name: str,
        origin_id: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[SendEntry]:
        marks = self.core.relay_marks
        with self.core.read_statements() as conn:
            qid = self._relay_queue(conn, client_name, origin_id)
            if qid is None:
                return []
            # After the last full sync's end (looked up in the same statement: one
            # round trip), and at the entry a mark says (:mod:`.relay_marks`), not at
            # the relay's start: a relayed queue keeps what every node below has not
            # acknowledged, and a read from the start would pass all of it again each time.
            start, exact = marks.start(qid, after)
            # Where no read ended at ``after``, the queue's highest seq, read first:
            # if the read finds nothing, every entry up to it is at or before
            # ``after``, and so is marked (what commits later gets a higher seq).
            top = None if exact else conn.execute(_RELAY_TOP, {"qid": qid}).scalar()
            end = last_end_query(qid).with_only_columns(_R.c.seq).scalar_subquery()
            query = (
                select(_R.c.seq, _R.c.source_position, _R.c.received_at, _R.c.partition_key)
                .add_columns(_R.c.headers, *sized(_R.c.payload, limit, max_bytes))
                .where(
                    _R.c.queue_id == qid,
                    _R.c.seq > func.coalesce(end, 0),
                    _R.c.seq > start,
                    _R.c.type == _LOG,  # bound: the query runs on the driver (PostgreSQL)
                    _R.c.source_position > after,
                )
                .order_by(_R.c.seq)
                .limit(limit)
            )
            rows = fill(
                conn, within(self.core.fetch_rows(conn, query), max_bytes), _R.c.seq, _R.c.payload
            )
        out: list[SendEntry] = []
        last = after
        if rows:
            marks.note(qid, max(after, max(int(r[1]) for r, _ in rows)), int(rows[-1][0][0]))
        elif top is not None:
            marks.note(qid, after, int(top))
        for r, payload in rows:
            position = int(r[1])
            if position <= last:  # a repeat after an accepted loss: sent once
                continue
            last = position
            out.append(
                SendEntry(
                    position,
                    client_name,
                    ReplicationType.LOG_ENTRY_SYNC,
                    payload,
                    created_at=float(r[2]),
                    key=stored(r[3]),
                    headers=stored(r[4]),
                )
            )
        return out

    def relay_resume_floor(self, client_name: str, origin_id: str) -> int:
        with self.core.read() as conn:
            qid = self._relay_queue(conn, client_name, origin_id)
            base = 0 if qid is None else last_end_seq(conn, qid)[1]
            return max(base, relay_mark(conn, client_name, origin_id))

    def relay_delivered_position(
        self, client_name: str, origin_id: str, conn: Connection | None = None
    ) -> int:
        if conn is not None:
            return relay_delivered(conn, client_name, origin_id)
        with self.core.read() as own:
            return relay_delivered(own, client_name, origin_id)

    def relay_floor(self, client_name: str, origin_id: str, extra_floor: int | None = None) -> int:
        c = s.cursors
        with self.core.read() as conn:
            children = [
                ch
                for ch in conn.execute(
                    select(_K.c.child_id).where(
                        _K.c.client_name == client_name,
                        _K.c.dropped == False,  # noqa: E712
                    )
                ).scalars()
            ]
            acked = dict(
                conn.execute(
                    select(c.c.destination, c.c.position).where(
                        c.c.client_name == client_name, c.c.destination.in_(children)
                    )
                ).all()
            )
        floors = [int(acked.get(ch, 0)) for ch in children]
        if extra_floor is not None:
            floors.append(extra_floor)
        if not floors:  # nobody below (every child dropped): nothing to keep for them
            return self.relay_delivered_position(client_name, origin_id)
        return min(floors)

    def trim_relay(self, client_name: str, origin_id: str, extra_floor: int | None = None) -> int:
        floor = self.relay_floor(client_name, origin_id, extra_floor)
        with self.core.write() as conn:
            qid = self._relay_queue(conn, client_name, origin_id)
            if qid is None:
                return 0
            st = s.subscriber_state
            delivered = int(
                conn.execute(select(st.c.delivered_seq).where(st.c.queue_id == qid)).scalar() or 0
            )
            floor = min(floor, relay_delivered(conn, client_name, origin_id))
            self.core.insert_ignore(conn, s.sites, [{"site_id": origin_id}], ["site_id"])
            num = conn.execute(
                select(s.sites.c.site_num).where(s.sites.c.site_id == origin_id)
            ).scalar_one()
            self._record_relay_mark(conn, int(num), client_name, floor)
            if (
                self.core.keeps_delivered
            ):  # PostgreSQL: rotation truncates (the floor is read there)
                return 0
            marker, _ = last_end_seq(conn, qid)
            done = conn.execute(
                delete(_R).where(
                    _R.c.queue_id == qid,
                    _R.c.seq <= delivered,
                    or_(
                        and_(
                            _R.c.type == literal(_LOG, literal_execute=True),
                            _R.c.source_position <= floor,
                        ),
                        _R.c.seq < marker,
                        and_(
                            _R.c.type != literal(_LOG, literal_execute=True),
                            _R.c.type != literal(_END, literal_execute=True),
                        ),
                    ),
                )
            )
        return int(done.rowcount or 0)

    def _record_relay_mark(self, conn: Connection, num: int, client_name: str, floor: int) -> None:
        t = s.trim_marks
        current = conn.execute(
            select(t.c.trimmed_through).where(t.c.dest_num == num, t.c.client_name == client_name)
        ).scalar()
        if current is None or int(current) < floor:
            self.core.upsert(
                conn,
                t,
                {"dest_num": num, "client_name": client_name, "trimmed_through": floor},
                ["dest_num", "client_name"],
            )


__all__ = ["CascadeStore"]
