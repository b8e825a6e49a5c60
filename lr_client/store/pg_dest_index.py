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


__all__ = ["ddl"]
