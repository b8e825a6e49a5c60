"""SQLite's stream tags: a destination's partial index, made when its reads need it.

A destination's read (:meth:`~lr_client.store.contract.Shipping.read_log_entries`)
walks the ``(client_name, position)`` index after its cursor and keeps the rows
naming it. Where its entries are dense (one destination, or entries addressed to
several at once) that walk reads its own rows. Where others' entries outnumber
its own (a destination that receives few of the client's entries, or one behind
the shared reader among others' traffic) it would read every entry of the
others: 5 entries among 100,000 of another destination. The partial index
``lrq_send_dest_<n>`` holds the entries addressed to site ``n`` only, so that read
walks its own entries whatever others hold; but every transmit then writes one
index entry per destination of the entry (a 1 KiB entry for 8 destinations cost
12-17 us instead of 4.9 us). So the index is made for a destination the first
time one of its reads walks at least :data:`SPARSE_WALK` entries of others, and at
least :data:`SPARSE_RATIO` of them per entry of its own: making it takes SQLite's
write lock for one pass over the send queue, once. An index, once made, stays
(as do those of earlier versions, made at registration).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

#: The entries of others a destination's read must walk before its index is made.
SPARSE_WALK = 2_000
#: ... and how many of them per entry of its own (a dense read never makes one).
SPARSE_RATIO = 4
#: How long making it waits for SQLite's write lock (ms): held, it is made later.
LOCK_WAIT_MS = 100

_PREFIX = "lrq_send_dest_"
_EXISTING = text(
    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'lrq_send_log_entries'"
)
_CLIENT_SPAN = text(
    "SELECT count(*) FROM lrq_send_log_entries"
    " WHERE client_name = :client AND position > :after AND position <= :end"
)


def site_number(num: int) -> int:
    """A site number, checked before it becomes part of a statement's text."""
    if isinstance(num, bool) or not isinstance(num, int) or num < 0:
        raise ValueError(f"not a site number: {num!r}")
    return num


def ddl(num: int) -> str:
    """The partial index of the entries addressed to site ``num`` (the seed's stream tag
    ``lrq_logentry_<dest>``). Its predicate is the read's own term, in literals, as
    SQLite uses a partial index only for a query whose terms are its own."""
    n = site_number(num)
    return (
        f"CREATE INDEX IF NOT EXISTS {_PREFIX}{n} ON lrq_send_log_entries"
        f" (client_name, position) WHERE instr(dest_nums, ',{n},') > 0"
    )


def existing(conn: Connection) -> set[int]:
    """The sites whose partial index exists."""
    names = conn.execute(_EXISTING).scalars()
    return {
        int(name[len(_PREFIX) :])
        for name in names
        if name.startswith(_PREFIX) and name[len(_PREFIX) :].isdigit()
    }


def walked_others(conn: Connection, client_name: str, after: int, end: int, own: int) -> bool:
    """Whether a read of one destination's entries of ``client_name`` in ``(after, end]``
    that found ``own`` of them walked enough entries of others to want its index."""
    if end - after - own < max(SPARSE_WALK, SPARSE_RATIO * own):
        return False  # positions count every client's entries: at most this many
    walked = conn.execute(_CLIENT_SPAN, {"client": client_name, "after": after, "end": end})
    others = int(walked.scalar_one()) - own
    return others >= max(SPARSE_WALK, SPARSE_RATIO * own)


__all__ = [
    "LOCK_WAIT_MS",
    "SPARSE_RATIO",
    "SPARSE_WALK",
    "ddl",
    "existing",
    "site_number",
    "walked_others",
]
