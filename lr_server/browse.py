"""The queue browser behind ``lr browse``: outstanding entries of a queue, decoded.

Queues (see ``lr_client.names``):

* ``LRQ_Send_LogEntries``: every stored log entry; with the tag
  ``lrq_logentry_<dest>`` only those the destination has not acknowledged yet
  (after its cursor, and nothing of a dropped stream).
* ``LRQ_Send_SnapSync``: stored snapshot entries; with ``lrq_snapsync_<dest>``
  only those of the destination's snapshots.
* ``LRQ_Recv_<client>__<source>``: a sink's receive queue (entries not yet
  delivered to the listener); its tag is ``lrq_recv_<client>``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import and_, func, literal, or_, select
from sqlalchemy.dialects import postgresql

from lr_client.errors import InvalidInputError, InvalidNameError
from lr_client.names import (
    RECV_PREFIX,
    SEND_LOG_ENTRIES,
    SEND_SNAPSYNC,
    parse_recv_queue_name,
    recv_tag,
    validate_name,
)
from lr_client.records import ReplicationType
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store import schema as s

LOGENTRY_TAG = "lrq_logentry_"
SNAPSYNC_TAG = "lrq_snapsync_"
PREVIEW_CHARS = 32


@dataclass
class BrowsedEntry:
    """One entry as ``lr browse`` shows it."""

    position: int
    type: str
    client: str
    destinations: list[str]
    snapshot_id: str
    size: int
    preview: str
    created_at: float | None = None
    seq: int | None = None  # receive queues: the queue's own order

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QueueSummary:
    queue: str
    entries: int
    tags: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def preview(payload: bytes, limit: int = PREVIEW_CHARS) -> str:
    """A short printable rendering: text if the payload is printable UTF-8, else hex."""
    head = payload[: limit * 4]
    text: str | None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A character cut at the end of ``head`` is still text; anything else is binary.
        cut = len(head) < len(payload) and exc.start >= len(head) - 3
        text = head[: exc.start].decode("utf-8") if cut else None
    if text is not None and all(c.isprintable() or c in "\t\n\r" for c in text):
        flat = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        more = len(flat) > limit or len(head) < len(payload)
        return flat[:limit] + ("…" if more else "")
    shown = payload[: limit // 2]
    return "0x" + shown.hex() + ("…" if len(shown) < len(payload) else "")


def _type_name(value: int) -> str:
    try:
        return ReplicationType(value).name
    except ValueError:
        return str(value)


def _tag_site(tag: str, prefix: str, queue: str) -> str:
    if not tag.startswith(prefix):
        raise InvalidInputError(f"tag {tag!r} does not index {queue} (expected {prefix}<site id>)")
    return validate_name(tag[len(prefix) :], "site id in tag")


def _decode_dests(store: SQLAlchemyQueueStore, value: object) -> list[str]:
    if isinstance(value, str):  # SQLite: ",1,5,"
        nums = [int(x) for x in value.strip(",").split(",") if x]
    else:
        nums = [int(x) for x in value or []]  # type: ignore[attr-defined]
    return [store.site_name(n) for n in nums]


def _log_entries(
    store: SQLAlchemyQueueStore, tag: str | None, client: str | None, after: int, limit: int
) -> list[BrowsedEntry]:
    e = s.send_log_entries
    query = select(e.c.position, e.c.client_name, e.c.payload, e.c.dest_nums, e.c.created_at)
    if tag is not None:
        dest = _tag_site(tag, LOGENTRY_TAG, SEND_LOG_ENTRIES)
        num = store.site_numbers(refresh=True).get(dest)
        if num is None:
            return []
        if store.dialect == "postgresql":
            arr = postgresql.ARRAY(postgresql.SMALLINT)
            query = query.where(e.c.dest_nums.op("@>")(literal([num], arr)))
        else:
            t = s.send_tags
            query = query.join(t, and_(t.c.position == e.c.position, t.c.dest_num == num))
        # Outstanding for that destination: after its cursor, and not released by a drop.
        c, d = s.cursors, s.drops
        query = (
            query.outerjoin(c, and_(c.c.destination == dest, c.c.client_name == e.c.client_name))
            .outerjoin(d, and_(d.c.destination == dest, d.c.client_name == e.c.client_name))
            .where(or_(c.c.position.is_(None), e.c.position > c.c.position))
            .where(d.c.destination.is_(None))
        )
    if client is not None:
        query = query.where(e.c.client_name == client)
    query = query.where(e.c.position > after).order_by(e.c.position).limit(limit)
    with store.read() as conn:
        rows = conn.execute(query).all()
    return [
        BrowsedEntry(
            position=int(r.position),
            type=ReplicationType.LOG_ENTRY_SYNC.name,
            client=r.client_name,
            destinations=_decode_dests(store, r.dest_nums),
            snapshot_id="",
            size=len(r.payload),
            preview=preview(bytes(r.payload)),
            created_at=r.created_at,
        )
        for r in rows
    ]


def _snapsync_entries(
    store: SQLAlchemyQueueStore, tag: str | None, client: str | None, after: int, limit: int
) -> list[BrowsedEntry]:
    t, snap = s.send_snapsync, s.snapshots
    query = (
        select(
            t.c.position,
            t.c.type,
            t.c.payload,
            t.c.snapshot_id,
            snap.c.destination,
            snap.c.client_name,
        )
        .select_from(t.outerjoin(snap, snap.c.snapshot_id == t.c.snapshot_id))
        .where(t.c.position > after)
    )
    if tag is not None:
        query = query.where(snap.c.destination == _tag_site(tag, SNAPSYNC_TAG, SEND_SNAPSYNC))
    if client is not None:
        query = query.where(snap.c.client_name == client)
    with store.read() as conn:
        rows = conn.execute(query.order_by(t.c.position).limit(limit)).all()
    return [
        BrowsedEntry(
            position=int(r.position),
            type=_type_name(r.type),
            client=r.client_name or "",
            destinations=[r.destination] if r.destination else [],
            snapshot_id=r.snapshot_id,
            size=len(r.payload),
            preview=preview(bytes(r.payload)),
        )
        for r in rows
    ]


def _recv_entries(
    store: SQLAlchemyQueueStore, queue: str, tag: str | None, after: int, limit: int
) -> list[BrowsedEntry]:
    client, _source = parse_recv_queue_name(queue)
    if tag is not None and tag != recv_tag(client):
        raise InvalidInputError(f"tag {tag!r} does not index {queue} (expected {recv_tag(client)})")
    reg, t = s.queue_registry, s.recv_entries
    with store.read() as conn:
        qid = conn.execute(
            select(reg.c.queue_id).where(reg.c.queue_name == queue)
        ).scalar_one_or_none()
        if qid is None:
            raise InvalidInputError(f"no receive queue {queue} on this site")
        rows = conn.execute(
            select(t).where(t.c.queue_id == qid, t.c.seq > after).order_by(t.c.seq).limit(limit)
        ).all()
    return [
        BrowsedEntry(
            position=int(r.source_position),
            type=_type_name(r.type),
            client=client,
            destinations=[],
            snapshot_id=r.snapshot_id,
            size=len(r.payload),
            preview=preview(bytes(r.payload)),
            created_at=r.received_at,
            seq=int(r.seq),
        )
        for r in rows
    ]


def browse(
    store: SQLAlchemyQueueStore,
    queue: str,
    *,
    tag: str | None = None,
    client: str | None = None,
    after: int = 0,
    limit: int = 50,
) -> list[BrowsedEntry]:
    """The first ``limit`` outstanding entries of ``queue`` after ``after``.

    ``after`` is a position for send queues and a queue sequence number for
    receive queues. Raises :class:`~lr_client.errors.InvalidInputError` for an
    unknown queue or a tag that does not index it.
    """
    if limit <= 0:
        raise InvalidInputError("limit must be positive")
    if client is not None:
        validate_name(client, "client name")
    if queue == SEND_LOG_ENTRIES:
        return _log_entries(store, tag, client, after, limit)
    if queue == SEND_SNAPSYNC:
        return _snapsync_entries(store, tag, client, after, limit)
    if queue.startswith(RECV_PREFIX):
        try:
            return _recv_entries(store, queue, tag, after, limit)
        except InvalidNameError as exc:
            raise InvalidInputError(str(exc)) from exc
    raise InvalidInputError(
        f"unknown queue {queue!r}: expected {SEND_LOG_ENTRIES}, {SEND_SNAPSYNC} "
        f"or {RECV_PREFIX}<client>__<source>"
    )


def list_queues(store: SQLAlchemyQueueStore) -> list[QueueSummary]:
    """Every queue of the site with its stored entry count and the tags that index it."""
    sites = sorted(store.site_numbers(refresh=True))
    e, snap_t, reg, recv = s.send_log_entries, s.send_snapsync, s.queue_registry, s.recv_entries
    with store.read() as conn:
        n_log = conn.execute(select(func.count()).select_from(e)).scalar_one()
        n_snap = conn.execute(select(func.count()).select_from(snap_t)).scalar_one()
        recv_counts: dict[int, int] = {
            int(r[0]): int(r[1])
            for r in conn.execute(select(recv.c.queue_id, func.count()).group_by(recv.c.queue_id))
        }
        registry = conn.execute(
            select(reg.c.queue_id, reg.c.queue_name, reg.c.client_name).order_by(reg.c.queue_name)
        ).all()
    out = [
        QueueSummary(SEND_LOG_ENTRIES, int(n_log), [LOGENTRY_TAG + x for x in sites]),
        QueueSummary(SEND_SNAPSYNC, int(n_snap), [SNAPSYNC_TAG + x for x in sites]),
    ]
    out += [
        QueueSummary(r.queue_name, int(recv_counts.get(r.queue_id, 0)), [recv_tag(r.client_name)])
        for r in registry
    ]
    return out


__all__ = ["BrowsedEntry", "QueueSummary", "browse", "list_queues", "preview"]
