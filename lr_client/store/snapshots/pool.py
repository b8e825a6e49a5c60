"""Where snapshot entries are stored: a pool of slots, one per snapshot that holds entries.

A snapshot takes a free slot when it starts (:meth:`SnapshotPoolStore._take_slot`,
REQUESTED -> RUNNING) and keeps it in ``lrq_snapshots.snap_slot`` until its
entries are released, after it ended (COMPLETED, CANCELLED, FAILED,
superseded); then the slot is free again (``snap_slot`` NULL). A slot is free
when no snapshot row names it, and a unique index keeps two rows from naming
one. The pool grows to the largest number of snapshots holding entries at
once: the lowest free slot is taken, so slots are reused. The slot is taken
at the start, not at the first write: writers (a Spark job's executors, in
parallel) hold share locks of the snapshot's row, so one of them updating
the row to take a slot would wait for the others, and two would deadlock;
the start updates that row anyway.

**PostgreSQL.** ``lrq_send_snapsync`` is partitioned by ``LIST (snap_slot)``,
one partition per slot (``lrq_send_snapsync_p<slot>``, named from the
integer alone; a missing one is made when a start takes the slot). A
snapshot's entries are released by truncating its slot's partition: a
snapshot of millions of entries leaves no dead tuple behind, however long a
transaction holds back vacuum, and its pages go back to the file system at
commit. Why this is safe:

* Slots are taken one start at a time (a transaction-scoped advisory lock,
  one per schema), each start reading the slots that committed starts and
  releases left named, so two snapshots never get the same slot (and the
  unique index would refuse it). A new partition is made under that lock,
  apart and then attached (:func:`pg_make_partition`).
* Every writer of entries reads the snapshot's status and slot under a
  share lock of its row and writes only while it is RUNNING, into that slot
  (:meth:`~lr_client.store.snapshots.entries.SnapshotsStore._require_writable`).
  The end of a snapshot updates that row, so it waits for writers in flight,
  and later writers see it ended and write nothing. The truncate and the
  freeing of the slot commit together, after the end, so a slot is free
  again only once it is empty, and no writer of the ended snapshot can reach
  it when another snapshot takes it.
* TRUNCATE takes the partition's ACCESS EXCLUSIVE lock. It is asked for with
  a short ``lock_timeout`` (:data:`RELEASE_LOCK_TIMEOUT`), in a savepoint: a
  reader holding the partition (a sender session reading the snapshot)
  neither stalls the release nor is stalled behind it for long. If the lock
  is not granted, the snapshot keeps its slot (its status is already final)
  and the next trim sweeps it (:meth:`SnapshotPoolStore._sweep_finished_snapshots`).
  Reads and writes by snapshot name its slot, so they lock its partition
  only and never hold up the release of another snapshot.
* A snapshot superseded in the application's transaction
  (``request_snapshot(conn, ...)``) only ends there; its entries are
  released by the next trim, so the application's transaction takes no
  lock of theirs.

Retries of a part (``_delete_part``, ``drop_unwritten_parts``) still delete
rows: they are rare, and the partition's truncate reclaims what they leave.

**SQLite.** The same slots and the same contract, but entries are stored as
before, in one table, and released by ``DELETE``: SQLite has no MVCC
versions to vacuum and reuses the pages a delete frees, and it serialises
writers, so no lock is needed to take a slot.
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import delete, select, text, update
from sqlalchemy.engine import Connection

from lr_client.records import SnapshotStatus
from lr_client.store.role import Role
from lr_client.store.schema import tables as s
from lr_client.store.slot_ring import Partitions

#: The statuses of a snapshot that ended: its entries are released.
FINISHED_STATUSES = (SnapshotStatus.COMPLETED, SnapshotStatus.CANCELLED, SnapshotStatus.FAILED)
#: How long a release waits for the lock of its partition (PostgreSQL) before
#: leaving it to the next trim.
RELEASE_LOCK_TIMEOUT = "50ms"

#: PostgreSQL: taking a slot, one transaction at a time (per schema).
POOL_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtextextended('lrq_snap_pool:' || current_schema(), 0))"
)
#: PostgreSQL: joining or asking for a snapshot of a client, one transaction at a
#: time (per schema and client), so destinations asking at once share one.
REQUEST_LOCK = text(
    "SELECT pg_advisory_xact_lock("
    "hashtextextended('lrq_snap_request:' || current_schema() || ':' || :client, 0))"
)
_EXISTS = text("SELECT to_regclass(:name) IS NOT NULL")
#: PostgreSQL's partitions of ``lrq_send_snapsync``, one per slot of the pool.
_PARTITIONS = Partitions(s.send_snapsync.name, s.SNAPSYNC_PARTITION_PREFIX)


def partition_name(slot: int) -> str:
    """The name of PostgreSQL's partition of ``slot``: made of the integer alone."""
    return _PARTITIONS.name(slot)


def pg_make_partition(conn: Connection, slot: int) -> None:
    """Make slot ``slot``'s partition if it is missing (under the pool's lock), apart and
    then attached (:meth:`~lr_client.store.slot_ring.Partitions.add`)."""
    if not conn.execute(_EXISTS, {"name": partition_name(slot)}).scalar_one():
        _PARTITIONS.add(conn, slot)


def pg_truncate(conn: Connection, slot: int, count: bool) -> int | None:
    """Empty slot ``slot``'s partition: how many entries it held (0 unless ``count``).

    None if its lock was not granted within :data:`RELEASE_LOCK_TIMEOUT`
    (nothing changed). The caller's ``lock_timeout`` is restored.
    """
    savepoint = _PARTITIONS.lock(conn, slot, RELEASE_LOCK_TIMEOUT)
    if savepoint is None:
        return None
    n = 0
    if count:
        n = int(conn.exec_driver_sql(f"SELECT count(*) FROM {partition_name(slot)}").scalar_one())
    _PARTITIONS.truncate(conn, slot)
    savepoint.commit()
    return n


class SnapshotPoolStore(Role):
    """Slots of snapshot entries: taken at a start, freed once the entries are released."""

    # -- the entries table as this backend has it -------------------------------------
    @property
    def _snapsync(self) -> Any:
        """``lrq_send_snapsync``, with ``snap_slot`` where the backend has it."""
        return s.send_snapsync_slotted if self.core.snapsync_slotted else s.send_snapsync

    def _in_slot(self, slot: int | None) -> list[Any]:
        """Conditions keeping a query on ``_snapsync`` to the slot's partition (if any)."""
        if not self.core.snapsync_slotted or slot is None:
            return []
        return [s.send_snapsync_slotted.c.snap_slot == slot]

    def _slot_values(self, slot: int) -> dict[str, int]:
        """The slot as a column value of a new entry (where the backend stores it)."""
        return {"snap_slot": slot} if self.core.snapsync_slotted else {}

    def _slot_of(self, conn: Connection, snapshot_id: str) -> int | None:
        return conn.execute(
            select(s.snapshots.c.snap_slot).where(s.snapshots.c.snapshot_id == snapshot_id)
        ).scalar()

    def _take_slot(self, conn: Connection, snapshot_id: str) -> int:
        """Give the snapshot the lowest free slot (in the caller's transaction)."""
        self.core.lock_pool(conn)
        c = s.snapshots.c
        used = set(conn.execute(select(c.snap_slot).where(c.snap_slot.is_not(None))).scalars())
        slot = next(n for n in itertools.count() if n not in used)
        self.core.slot_storage(conn, slot)
        conn.execute(update(s.snapshots).where(c.snapshot_id == snapshot_id).values(snap_slot=slot))
        return slot

    def _release_entries(
        self, conn: Connection, snapshot_id: str, *, count: bool = False
    ) -> int | None:
        """Release a finished snapshot's entries and free its slot, in ``conn``'s transaction.

        Locks the snapshot's row first (a writer in flight is waited for).
        Returns how many entries went (0 unless ``count``), or None if they
        could not go now: the snapshot keeps its slot until a trim sweeps it.
        A snapshot that is not finished keeps everything.
        """
        c = s.snapshots.c
        row = conn.execute(
            select(c.status, c.snap_slot).where(c.snapshot_id == snapshot_id).with_for_update()
        ).first()
        if row is None or row.status not in [x.value for x in FINISHED_STATUSES]:
            return 0
        n = self.core.drop_slot_entries(conn, snapshot_id, row.snap_slot, count)
        if n is not None and row.snap_slot is not None:
            conn.execute(
                update(s.snapshots).where(c.snapshot_id == snapshot_id).values(snap_slot=None)
            )
        return n

    def _sweep_finished_snapshots(self) -> int:
        """Release the entries of every finished snapshot that still has them; how many.

        What trim sweeps: snapshots whose release found its partition locked,
        that were superseded in an application's transaction, or that were
        ended by :meth:`update_snapshot` alone. Each in a transaction of its
        own; one still locked waits for the next sweep.
        """
        c = s.snapshots.c
        finished = [x.value for x in FINISHED_STATUSES]
        with self.core.read() as conn:
            held = list(
                conn.execute(
                    select(c.snapshot_id).where(c.status.in_(finished), c.snap_slot.is_not(None))
                ).scalars()
            )
        total = 0
        for snapshot_id in held:
            with self.core.write() as conn:
                total += self._release_entries(conn, snapshot_id, count=True) or 0
        if not self.core.snapsync_slotted:  # entries stored before slots existed (revision 0007)
            t = s.send_snapsync
            done = select(c.snapshot_id).where(c.status.in_(finished))
            with self.core.write() as conn:
                total += conn.execute(delete(t).where(t.c.snapshot_id.in_(done))).rowcount or 0
        return total


__all__ = [
    "FINISHED_STATUSES",
    "RELEASE_LOCK_TIMEOUT",
    "REQUEST_LOCK",
    "SnapshotPoolStore",
    "partition_name",
    "pg_make_partition",
    "pg_truncate",
]
