"""PostgreSQL's stream tags: a partial index per destination over the send queue.

A destination's read (:meth:`~lr_client.store.contract.SendLog.read_log_entries`)
asks for its entries after its cursor in position order, ``LIMIT`` a batch. The
GIN index over ``dest_nums`` finds them but not in order, so where the planner
misjudges how many there are (a destination with few entries among many of
others) it walks the position index and filters out every entry of the others:
reading 5 entries among 100,000 of another destination took 24 ms of the
database's time. The partial index ``lrq_send_positions_dest_<n>`` holds the
entries addressed to site ``n`` only, in ``(client_name, position)`` order: the
read walks its own entries, whatever others hold (as SQLite's
``lrq_send_dest_<n>``). Its predicate is the read's own term, in literals, as
the planner uses a partial index only for a query whose terms imply it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

log = logging.getLogger(__name__)

#: How long making a missing index waits for the send queue's lock (ms): it must not
#: queue every transmit behind an application's long transaction that holds the table.
LOCK_TIMEOUT_MS = 2000

_EXISTING = text(
    "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    " AND tablename = 'lrq_send_positions'"
)
_PREFIX = "lrq_send_positions_dest_"


def _site_number(num: int) -> int:
    """A site number, checked before it becomes part of a statement's text."""
    if isinstance(num, bool) or not isinstance(num, int) or not 0 <= num < 2**15:
        raise ValueError(f"not a site number: {num!r}")
    return num


def ddl(num: int) -> str:
    """The partial index of the entries addressed to site ``num`` (on every slot of
    the partitioned send queue: PostgreSQL builds it on each partition)."""
    n = _site_number(num)
    return (
        f"CREATE INDEX IF NOT EXISTS lrq_send_positions_dest_{n} ON lrq_send_positions"
        f" (client_name, position) WHERE dest_nums @> '{{{n}}}'::smallint[]"
    )


def ensure(conn: Connection, numbers: Iterable[int]) -> set[int]:
    """Make the missing indexes of sites ``numbers``; the sites whose index exists.

    The catalog is read first, so an index that exists costs no lock. One that is
    missing is made under a ``lock_timeout``: a long transaction holding the send
    queue defers it (the read falls back to the GIN index over the destinations)
    to the next registration, instead of queueing every transmit behind it.
    """
    names = conn.execute(_EXISTING).scalars()
    found = {
        int(name[len(_PREFIX) :])
        for name in names
        if name.startswith(_PREFIX) and name[len(_PREFIX) :].isdigit()
    }
    missing = sorted(set(numbers) - found)
    if not missing:
        return found
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT_MS)}")
    for n in missing:
        conn.exec_driver_sql("SAVEPOINT lrq_dest_index")
        try:
            conn.exec_driver_sql(ddl(n))
        except IntegrityError:  # another process made it meanwhile (IF NOT EXISTS races)
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT lrq_dest_index")
        except OperationalError as exc:  # the lock timed out: next time
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT lrq_dest_index")
            log.warning("index of destination %d deferred: %s", n, exc.orig)
            continue
        else:
            conn.exec_driver_sql("RELEASE SAVEPOINT lrq_dest_index")
        found.add(n)
    return found


__all__ = ["LOCK_TIMEOUT_MS", "ddl", "ensure"]
