"""How far each partition of a receive queue delivered by partition stands behind.

A partition's ``delivered_seq`` (``lrq_subscriber_partitions``) says every
keyed entry of it up to that ``seq`` was delivered; the entries of the queue
above it are what the partition has not passed yet (its own and, as it cannot
tell them apart without the partitioner, the other partitions' too). A
partition that is stuck (a listener failing on one key, a worker gone) shows
a number that grows while the others stay near the head.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from lr_client.store.schema import tables as s


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """Entries of a (client, source) queue above one partition's delivered mark."""

    client_name: str
    source_id: str
    partition: int
    behind: int


def partition_lags(conn: Connection, client_name: str | None = None) -> list[PartitionLag]:
    """Every partition row's lag (of one client's queues), in one query."""
    reg, part, recv = s.queue_registry, s.subscriber_partitions, s.recv_entries
    behind = (
        select(func.count())
        .where(and_(recv.c.queue_id == part.c.queue_id, recv.c.seq > part.c.delivered_seq))
        .scalar_subquery()
    )
    query = (
        select(reg.c.client_name, reg.c.source_id, part.c.partition, behind)
        .join(part, part.c.queue_id == reg.c.queue_id)
        .order_by(reg.c.client_name, reg.c.source_id, part.c.partition)
    )
    if client_name is not None:
        query = query.where(reg.c.client_name == client_name)
    return [
        PartitionLag(str(r[0]), str(r[1]), int(r[2]), int(r[3] or 0)) for r in conn.execute(query)
    ]


__all__ = ["PartitionLag", "partition_lags"]
