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

from lr_client.errors import InvalidInputError, InvalidNameError
from lr_client.names import (
    LOGENTRY_TAG,
    RECV_PREFIX,
    SEND_LOG_ENTRIES,
    SEND_SNAPSYNC,
    SNAPSYNC_TAG,
    logentry_tag,
    parse_recv_queue_name,
    recv_tag,
    snapsync_tag,
    validate_name,
)
from lr_client.records import ReplicationType, StoredEntry
from lr_client.store import Inspection, Sites
from lr_server.stores import BrowseStore

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
        """The JSON object ``lr browse QUEUE --json`` prints for it."""
        return asdict(self)


@dataclass
class QueueSummary:
    """One queue of the site, its stored entries and the tags that index it."""

    queue: str
    entries: int
    tags: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``lr browse --json`` prints for it."""
        return asdict(self)


def preview(payload: bytes, limit: int = PREVIEW_CHARS, size: int | None = None) -> str:
    """A short printable rendering: text if the payload is printable UTF-8, else hex.

    ``payload`` may be only the payload's head (at least ``limit * 4`` bytes of it) when
    ``size`` gives the whole payload's size.
    """
    total = len(payload) if size is None else size
    head = payload[: limit * 4]
    text: str | None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A character cut at the end of ``head`` is still text; anything else is binary.
        cut = len(head) < total and exc.start >= len(head) - 3
        text = head[: exc.start].decode("utf-8") if cut else None
    if text is not None and all(c.isprintable() or c in "\t\n\r" for c in text):
        flat = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        more = len(flat) > limit or len(head) < total
        return flat[:limit] + ("…" if more else "")
    shown = payload[: limit // 2]
    return "0x" + shown.hex() + ("…" if len(shown) < total else "")


def _type_name(value: int) -> str:
    try:
        return ReplicationType(value).name
    except ValueError:
        return str(value)


def _tag_site(store: Sites, tag: str, prefix: str, queue: str) -> str:
    """The destination a send-queue tag names: a valid, registered site id."""
    if not tag.startswith(prefix):
        raise InvalidInputError(f"tag {tag!r} does not index {queue} (expected {prefix}<site id>)")
    dest = validate_name(tag[len(prefix) :], "site id in tag")
    known = sorted(store.site_numbers(refresh=True))
    if dest not in known:
        raise InvalidInputError(
            f"tag {tag!r}: {dest!r} is not a destination of this site's database "
            f"(known: {', '.join(known) or 'none'})"
        )
    return dest


def _browsed(entry: StoredEntry) -> BrowsedEntry:
    return BrowsedEntry(
        position=entry.position,
        type=_type_name(entry.type),
        client=entry.client_name,
        destinations=list(entry.destinations),
        snapshot_id=entry.snapshot_id,
        size=entry.size,
        preview=preview(entry.payload, size=entry.size),
        created_at=entry.created_at,
        seq=entry.seq,
    )


def _log_entries(
    store: BrowseStore, tag: str | None, client: str | None, after: int, limit: int
) -> list[StoredEntry]:
    dest = None if tag is None else _tag_site(store.sites, tag, LOGENTRY_TAG, SEND_LOG_ENTRIES)
    return store.inspection.browse_log_entries(dest, client, after, limit)


def _snapsync_entries(
    store: BrowseStore, tag: str | None, client: str | None, after: int, limit: int
) -> list[StoredEntry]:
    dest = None if tag is None else _tag_site(store.sites, tag, SNAPSYNC_TAG, SEND_SNAPSYNC)
    return store.inspection.browse_snapshot_entries(dest, client, after, limit)


def _recv_entries(
    store: Inspection, queue: str, tag: str | None, after: int, limit: int
) -> list[StoredEntry]:
    client, _source = parse_recv_queue_name(queue)
    if tag is not None and tag != recv_tag(client):
        raise InvalidInputError(f"tag {tag!r} does not index {queue} (expected {recv_tag(client)})")
    found = store.browse_queue(queue, after, limit)
    if found is None:
        raise InvalidInputError(f"no receive queue {queue} on this site")
    return found


def browse(
    store: BrowseStore,
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
    unknown queue, a tag that does not index it or a destination that is not registered.
    """
    if limit <= 0:
        raise InvalidInputError("limit must be positive")
    if client is not None:
        validate_name(client, "client name")
    if queue == SEND_LOG_ENTRIES:
        return [_browsed(e) for e in _log_entries(store, tag, client, after, limit)]
    if queue == SEND_SNAPSYNC:
        return [_browsed(e) for e in _snapsync_entries(store, tag, client, after, limit)]
    if queue.startswith(RECV_PREFIX):
        try:
            return [_browsed(e) for e in _recv_entries(store.inspection, queue, tag, after, limit)]
        except InvalidNameError as exc:
            raise InvalidInputError(str(exc)) from exc
    raise InvalidInputError(
        f"unknown queue {queue!r}: expected {SEND_LOG_ENTRIES}, {SEND_SNAPSYNC} "
        f"or {RECV_PREFIX}<client>__<source>"
    )


def list_queues(store: BrowseStore) -> list[QueueSummary]:
    """Every queue of the site with its stored entry count and the tags that index it."""
    sites = sorted(store.sites.site_numbers(refresh=True))
    n_log, n_snap, queues = store.inspection.queue_sizes()
    out = [
        QueueSummary(SEND_LOG_ENTRIES, n_log, [logentry_tag(x) for x in sites]),
        QueueSummary(SEND_SNAPSYNC, n_snap, [snapsync_tag(x) for x in sites]),
    ]
    out += [QueueSummary(q.queue_name, depth, [recv_tag(q.client_name)]) for q, depth in queues]
    return out


__all__ = ["BrowsedEntry", "QueueSummary", "browse", "list_queues", "preview"]
