"""Receive queues delivered by partition: per-partition progress in ``lrq_subscriber_partitions``.

A queue delivered with ``N`` partitions has one row per partition: every
keyed log entry of that partition with ``seq <= delivered_seq`` was
delivered, and every entry without a key below it. A partition's delivery
raises its row from the value it read (a compare-and-set in the delivering
transaction), so two deliveries of one partition can never both commit, and
a crash anywhere applies each entry once. The queue's own
``lrq_subscriber_state.delivered_seq`` is kept at the minimum over its
partitions (never above it), so receive queue retirement on PostgreSQL and
every reader of the queue see only what every partition has passed. A
partition's delivery does not write that row (every partition would queue on
its lock): it only holds a share lock on it as the lease's fence, and
:meth:`SubscriberPartitionsStore.raise_queue_mark` raises the queue's mark to
the minimum in a transaction of its own, from time to time and when the
partitions stand still.

Entries every partition waits for (no key, snapshot entries, drop notices)
are passed by :meth:`SubscriberPartitionsStore.save_barrier`, once every
partition stands just below them. The partition count is stored in
``lrq_subscriber_state.partitions`` (0: not delivered by partition).
"""

from __future__ import annotations

from sqlalchemy import (
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    null,
    select,
    update,
)
from sqlalchemy.engine import Connection

from lr_client.errors import PartitionCountError
from lr_client.records import TYPES_BY_VALUE, HeadEntry
from lr_client.store.cascade.relays import is_relayed, relayed_as_leased
from lr_client.store.recv.queues import check_forward, save_fenced
from lr_client.store.role import Role
from lr_client.store.schema import tables as s

_T = s.subscriber_state
_P = s.subscriber_partitions
_R = s.recv_entries


#: A partition's compare-and-set, built once (a batch's statement: not built and keyed
#: again per call). The fence: a share lock on the queue's state row while ``owner``
#: holds the lease (PostgreSQL; SQLite has one writer), so a takeover waits for this
#: commit, while the other partitions' deliveries take it too: none writes it.
_SAVE_PARTITION = (
    update(_P)
    .where(
        _P.c.queue_id == bindparam("qid"),
        _P.c.partition == bindparam("part"),
        _P.c.delivered_seq == bindparam("previous"),
        exists(
            select(_T.c.queue_id)
            .where(_T.c.queue_id == bindparam("qid"), _T.c.lease_owner == bindparam("owner"))
            .with_for_update(read=True)
        ),
    )
    .values(delivered_seq=bindparam("upto"), delivered=_P.c.delivered + bindparam("count"))
)

#: SQLite: the entries a partition delivered, deleted in its transaction.
_FORGET_ENTRIES = delete(_R).where(
    _R.c.queue_id == bindparam("qid"), _R.c.seq.in_(bindparam("seqs", expanding=True))
)


class SubscriberPartitionsStore(Role):
    """Per-partition delivery state of receive queues."""

    def claim_partitions(self, conn: Connection, queue_id: int, count: int) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        target = count if count > 1 else 0
        row = conn.execute(
            select(_T.c.partitions, _T.c.delivered_seq).where(_T.c.queue_id == queue_id)
        ).first()
        stored = int(row.partitions) if row is not None else 0
        floor = int(row.delivered_seq) if row is not None else 0
        marks = self.load_partitions(conn, queue_id)
        if stored == target and (target == 0 or len(marks) == target):
            return
        start = floor
        if stored:
            # Drained: every partition delivered up to the same entry, so what is
            # above it was delivered by none and is delivered once after the switch.
            levels = set(marks.values())
            if len(marks) != stored or len(levels) != 1:
                raise PartitionCountError(
                    f"receive queue {queue_id} is delivered with {stored} partitions and is "
                    f"not drained (its partitions stand at seq {min(levels, default=floor)} to "
                    f"{max(levels, default=floor)}): deliver it with {stored} partitions until "
                    f"they stand together before changing to {count}"
                )
            start = max(floor, *levels)
        conn.execute(delete(_P).where(_P.c.queue_id == queue_id))
        if target:
            conn.execute(
                insert(_P),
                [
                    {"queue_id": queue_id, "partition": p, "delivered_seq": start, "delivered": 0}
                    for p in range(target)
                ],
            )
        conn.execute(
            update(_T)
            .where(_T.c.queue_id == queue_id)
            .values(partitions=target, delivered_seq=start)
        )
        if not self.core.keeps_delivered and start > floor and not is_relayed(conn, queue_id):
            conn.execute(delete(_R).where(_R.c.queue_id == queue_id, _R.c.seq <= start))

    def load_partitions(self, conn: Connection, queue_id: int) -> dict[int, int]:
        rows = conn.execute(
            select(_P.c.partition, _P.c.delivered_seq).where(_P.c.queue_id == queue_id)
        ).all()
        return {int(p): int(seq) for p, seq in rows}

    def scan_entries(
        self, conn: Connection, queue_id: int, after: int, limit: int, inline_bytes: int = 0
    ) -> list[HeadEntry]:
        small = inline_bytes // max(1, limit)
        inline = (
            case((func.length(_R.c.payload) <= small, _R.c.payload), else_=null())
            if small > 0
            else null()
        )
        rows = conn.execute(
            select(
                _R.c.seq,
                _R.c.type,
                _R.c.source_position,
                _R.c.snapshot_id,
                _R.c.base_position,
                _R.c.partition_key,
                _R.c.headers,
                inline.label("inline"),
            )
            .where(_R.c.queue_id == queue_id, _R.c.seq > after)
            .order_by(_R.c.seq)
            .limit(limit)
        ).all()
        return [
            HeadEntry(
                r[0],
                TYPES_BY_VALUE[r[1]],
                r[2],
                r[3],
                b"" if r[7] is None else bytes(r[7]),
                r[4],
                None if r[5] is None else bytes(r[5]),
                None if r[6] is None else bytes(r[6]),
            )
            for r in rows
        ]

    def read_payloads(self, conn: Connection, queue_id: int, seqs: list[int]) -> dict[int, bytes]:
        if not seqs:
            return {}
        rows = conn.execute(
            select(_R.c.seq, _R.c.payload).where(_R.c.queue_id == queue_id, _R.c.seq.in_(seqs))
        ).all()
        return {int(seq): bytes(payload) for seq, payload in rows}

    def save_partition(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        partition: int,
        *,
        previous_seq: int,
        delivered_seq: int,
        delivered_seqs: list[int],
    ) -> bool:
        check_forward(previous_seq, delivered_seq)
        moved = conn.execute(
            _SAVE_PARTITION,
            {
                "qid": queue_id,
                "part": partition,
                "previous": previous_seq,
                "owner": owner,
                "upto": delivered_seq,
                "count": len(delivered_seqs),
            },
        )
        if moved.rowcount != 1:
            return False
        if self.core.keeps_delivered or not delivered_seqs:
            return True
        if not relayed_as_leased(self.core.relayed_queues, conn, queue_id):
            conn.execute(_FORGET_ENTRIES, {"qid": queue_id, "seqs": delivered_seqs})
        return True

    def raise_queue_mark(self, conn: Connection, queue_id: int, owner: str) -> bool:
        lowest = (
            select(func.min(_P.c.delivered_seq)).where(_P.c.queue_id == queue_id).scalar_subquery()
        )
        moved = conn.execute(
            update(_T)
            .where(_T.c.queue_id == queue_id, _T.c.lease_owner == owner, _T.c.partitions > 0)
            .where(lowest > _T.c.delivered_seq)
            .values(
                delivered_seq=case((lowest > _T.c.delivered_seq, lowest), else_=_T.c.delivered_seq)
            )
        )
        return bool(moved.rowcount)

    def save_barrier(
        self,
        conn: Connection,
        queue_id: int,
        owner: str,
        *,
        count: int,
        previous_seq: int,
        delivered_seq: int,
        snapshot_id: str,
        in_snapshot: bool,
        delivered: int,
        lease_expires: float,
    ) -> bool:
        check_forward(previous_seq, delivered_seq)  # before the partitions move
        moved = conn.execute(
            update(_P)
            .where(_P.c.queue_id == queue_id, _P.c.delivered_seq == previous_seq)
            .values(delivered_seq=delivered_seq)
        )
        if moved.rowcount != count:
            return False
        return save_fenced(
            conn,
            queue_id,
            owner,
            _T.c.partitions == count,
            relayed=None if self.core.keeps_delivered else self.core.relayed_queues,
            snapshot_id=snapshot_id,
            in_snapshot=in_snapshot,
            delivered=delivered,
            lease_expires=lease_expires,
            previous_seq=previous_seq,
            delivered_seq=delivered_seq,
        )


__all__ = ["SubscriberPartitionsStore"]
