"""Where cascaded entries are relayed: the queries every store role shares about relayed
receive queues (which are relayed, their marks, their ends) and a client's transmit route."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Select,
    and_,
    bindparam,
    func,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.engine import Connection

from lr_client.cascade_roles import CascadeRole
from lr_client.names import recv_queue_name
from lr_client.records import CascadeRoute, ReplicationType
from lr_client.store.schema import tables as s

_R, _C, _K, _G = s.recv_entries, s.cascade, s.cascade_children, s.queue_registry
_LOG = int(ReplicationType.LOG_ENTRY_SYNC)
_END = int(ReplicationType.LAST_FULL_SYNC_ENTRY)
#: A queue's highest ``seq`` (the index on (queue_id, seq) serves it).
_RELAY_TOP = select(func.max(_R.c.seq)).where(_R.c.queue_id == bindparam("qid"))
#: ``lrq_meta`` key of the sets' nodes as applied here: a JSON object {client: [node, ...]}.
NODES_KEY = "cascade_nodes"


def _recorded_nodes(conn: Connection) -> dict[str, list[str]]:
    raw = conn.execute(select(s.meta.c.value).where(s.meta.c.key == NODES_KEY)).scalar()
    return {} if raw is None else dict(json.loads(raw))


def transmit_route(conn: Connection, client_name: str) -> CascadeRoute | None:
    """Where ``client_name`` may be transmitted here (None: it is not cascaded here)."""
    row = conn.execute(
        select(_C.c.origin_id, _C.c.role).where(_C.c.client_name == client_name)
    ).first()
    if row is None:
        return None
    nodes = _recorded_nodes(conn).get(client_name)
    route_nodes = None if nodes is None else tuple(nodes)
    return CascadeRoute(row.origin_id, CascadeRole(row.role), route_nodes)


def relayed_queue_ids(conn: Connection, client_name: str | None = None) -> list[int]:
    """The receive queues this node relays: those of (client, origin) it is a branch of
    (of ``client_name`` only, unless None)."""
    query = select(_G.c.queue_id).join(
        _C,
        and_(
            _C.c.client_name == _G.c.client_name,
            _C.c.origin_id == _G.c.source_id,
            _C.c.role == CascadeRole.BRANCH.value,
        ),
    )
    if client_name is not None:
        query = query.where(_G.c.client_name == client_name)
    return [int(q) for q in conn.execute(query).scalars()]


#: Whether a queue is relayed (built once: it runs in every SQLite delivery).
_RELAYED = (
    select(_G.c.queue_id)
    .join(
        _C,
        and_(
            _C.c.client_name == _G.c.client_name,
            _C.c.origin_id == _G.c.source_id,
            _C.c.role == CascadeRole.BRANCH.value,
        ),
    )
    .where(_G.c.queue_id == bindparam("qid"))
)


def is_relayed(conn: Connection, queue_id: int) -> bool:
    """Whether delivery must keep the queue's entries (a queue this node relays)."""
    return conn.execute(_RELAYED, {"qid": queue_id}).first() is not None


def relayed_as_leased(leased: dict[int, bool], conn: Connection, queue_id: int) -> bool:
    """Whether a delivering subscriber must keep the queue's entries: ``leased`` holds
    the answer read when its lease was taken (the delivery is fenced by that lease, see
    :func:`revoke_leases`); without one it is read now."""
    relayed = leased.get(queue_id)
    return is_relayed(conn, queue_id) if relayed is None else relayed


def revoke_leases(conn: Connection, queue_ids: Sequence[int]) -> None:
    """Take the subscribers' leases of these queues, whose relaying changed.

    A subscriber reads whether a queue is relayed when it takes the queue's
    lease, and keeps the answer while it holds it
    (:meth:`~lr_client.store.recv.queues.SubscriberQueuesStore.acquire_lease`):
    every delivery is fenced by the lease, so one in flight rolls back, and the
    next takes the lease again and reads the new answer, in whatever process
    it runs.
    """
    t = s.subscriber_state
    conn.execute(
        update(t).where(t.c.queue_id.in_(list(queue_ids))).values(lease_owner="", lease_expires=0.0)
    )


def last_end_query(queue_id: int) -> Select[Any]:
    """The statement of :func:`last_end_seq`.

    Ordered by an expression, so that no index serves the order: by ``seq`` the
    planner walks the queue's index back from its newest entry, through every entry
    a relayed queue keeps, looking for an end marker; this way it takes the end
    markers' own partial index (``lrq_recv_entries_ends``) and sorts the few it
    finds. The condition on ``snapshot_id`` (true of every row) bounds that index's
    second column, which makes it SQLite's choice too.
    """
    return (
        select(_R.c.seq, _R.c.base_position)
        .where(
            _R.c.queue_id == queue_id,
            _R.c.type == literal_column(str(_END)),  # in the text: SQLite's partial index
            _R.c.snapshot_id >= "",
        )
        .order_by((_R.c.seq + 0).desc())
        .limit(1)
    )


def last_end_seq(conn: Connection, queue_id: int) -> tuple[int, int]:
    """(seq, base) of the queue's last full sync end marker; (0, 0) if none is held."""
    row = conn.execute(last_end_query(queue_id)).first()
    return (0, 0) if row is None else (int(row[0]), int(row[1] or 0))


def relay_queue_id(conn: Connection, client_name: str, origin_id: str) -> int | None:
    """The receive queue of (client, origin), if it exists."""
    name = recv_queue_name(client_name, origin_id)
    qid = conn.execute(select(_G.c.queue_id).where(_G.c.queue_name == name)).scalar()
    return None if qid is None else int(qid)


def relay_mark(conn: Connection, client_name: str, origin_id: str) -> int:
    """The relay trim mark of (client, origin): every relayed log entry above it is held."""
    t, st = s.trim_marks, s.sites
    mark = conn.execute(
        select(t.c.trimmed_through)
        .join(st, st.c.site_num == t.c.dest_num)
        .where(st.c.site_id == origin_id, t.c.client_name == client_name)
    ).scalar()
    return int(mark or 0)


def relay_delivered(conn: Connection, client_name: str, origin_id: str) -> int:
    """The origin position of the last entry delivered here from (client, origin)."""
    qid = relay_queue_id(conn, client_name, origin_id)
    if qid is None:
        return 0
    st = s.subscriber_state
    delivered = int(
        conn.execute(select(st.c.delivered_seq).where(st.c.queue_id == qid)).scalar() or 0
    )
    start, base = last_end_seq(conn, qid)
    if start > delivered:  # the last full sync is not delivered yet: what was is older
        start, base = 0, 0
    # Log entries are stored in origin order: the last one delivered is the highest,
    # found by walking the queue's index back from ``delivered`` (a max() read all).
    found = conn.execute(
        select(_R.c.source_position)
        .where(
            _R.c.queue_id == qid,
            _R.c.seq > start,
            _R.c.seq <= delivered,
            _R.c.type == literal(_LOG, literal_execute=True),
        )
        .order_by(_R.c.seq.desc())
        .limit(1)
    ).scalar()
    return max(int(found or 0), base, relay_mark(conn, client_name, origin_id))


def relay_head(conn: Connection, client_name: str, origin_id: str) -> int:
    """The origin position of the last entry stored here from (client, origin): no node
    below can hold one past it, except one this branch forwarded and has not stored yet."""
    qid = relay_queue_id(conn, client_name, origin_id)
    if qid is None:
        return 0
    start, base = last_end_seq(conn, qid)
    found = conn.execute(
        select(_R.c.source_position)
        .where(
            _R.c.queue_id == qid,
            _R.c.seq > start,
            _R.c.type == literal(_LOG, literal_execute=True),
        )
        .order_by(_R.c.seq.desc())
        .limit(1)
    ).scalar()
    return max(int(found or 0), base, relay_mark(conn, client_name, origin_id))


def relay_keep(conn: Connection) -> dict[int, tuple[int, int]]:
    """{relayed queue id: (its relay trim mark, seq of its last end marker)}: what
    PostgreSQL's rotation keeps of each (log entries above the mark, the marker on)."""
    out: dict[int, tuple[int, int]] = {}
    for qid in relayed_queue_ids(conn):
        client, origin = conn.execute(
            select(_G.c.client_name, _G.c.source_id).where(_G.c.queue_id == qid)
        ).one()
        out[qid] = (relay_mark(conn, client, origin), last_end_seq(conn, qid)[0])
    return out


__all__ = [
    "NODES_KEY",
    "is_relayed",
    "last_end_query",
    "last_end_seq",
    "relay_delivered",
    "relay_head",
    "relay_keep",
    "relay_mark",
    "relay_queue_id",
    "relayed_as_leased",
    "relayed_queue_ids",
    "revoke_leases",
    "transmit_route",
]
