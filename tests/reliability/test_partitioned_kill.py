"""A subscriber delivering by partition (8 worker threads, or 8 tasks of the async
subscriber) killed with SIGKILL mid-run.

Whatever it had in flight rolls back; a restarted subscriber delivers the
rest: every entry exactly once, each key in source order, the entries
without a key in order relative to every other, the full sync first.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from sqlalchemy import func, select

from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.verifier import (
    END,
    LOG,
    SNAPSHOT,
    START,
    AppliedEntry,
    SentEntry,
    SnapshotInfo,
    verify,
)
from tests.kit.wait import scaled, wait_for
from tests.reliability.subscriber_proc import app_applied, app_metadata
from tests.reliability.test_subscriber_kill import finish, runner

CLIENT = "policy"
SOURCE = "src-a"
SNAP = 10
LOGS = 400
KEYS = 23
SID = "snap-k"


def unkeyed(position: int) -> bool:
    return position % 97 == 0


def fill(store: SQLAlchemyQueueStore) -> None:
    snapshot = [
        WireEntry(i, ReplicationType.SNAPSHOT_SYNC, b"s%d" % i, snapshot_id=SID, key=b"k%d" % i)
        for i in range(1, SNAP + 1)
    ]
    marker = WireEntry(
        SNAP + 1,
        ReplicationType.LAST_FULL_SYNC_ENTRY,
        b"",
        snapshot_id=SID,
        snapshot_count=SNAP,
        base_position=SNAP,
    )
    store.recv.apply_snapshot_batch(SOURCE, CLIENT, SID, [*snapshot, marker])
    for first in range(SNAP + 1, SNAP + LOGS + 1, 50):
        entries = [
            WireEntry(
                p,
                ReplicationType.LOG_ENTRY_SYNC,
                b"l%d" % p,
                key=None if unkeyed(p) else b"k%d" % (p % KEYS),
            )
            for p in range(first, min(first + 50, SNAP + LOGS + 1))
        ]
        store.recv.apply_log_batch(SOURCE, CLIENT, entries)


def log_rows(store: SQLAlchemyQueueStore) -> int:
    with store.read() as conn:
        query = select(func.count()).where(app_applied.c.kind == "log_entries")
        return int(conn.execute(query).scalar_one())


def applied(store: SQLAlchemyQueueStore) -> list[AppliedEntry]:
    kinds = {"start": START, "end": END, "full_sync": SNAPSHOT, "log_entries": LOG}
    a = app_applied.c
    with store.read() as conn:
        rows = conn.execute(
            select(a.id, a.kind, a.snapshot_id, a.position, a.pkey).order_by(a.id)
        ).all()
    return [
        AppliedEntry(
            "sink",
            SOURCE,
            CLIENT,
            position,
            f"l{position}" if kind == "log_entries" else "",
            kinds[kind],
            sid,
            order,
            pkey or "",
        )
        for order, kind, sid, position, pkey in rows
    ]


@pytest.mark.parametrize("api", ["sync", "aio"])
def test_sigkill_of_a_partitioned_subscriber_keeps_key_order_and_exactly_once(
    store: SQLAlchemyQueueStore, db_url: str, tmp_path: Path, api: str
) -> None:
    app_metadata.create_all(store.engine)
    fill(store)
    args = ("--partitions=8", "--batch-size=5", "--lease-seconds=1", f"--api={api}")
    victim = runner(db_url, "victim", *args, "--sleep=0.02")
    try:
        wait_for(lambda: log_rows(store) >= 60, scaled(90), 0.02, what="the victim delivering")
    finally:
        victim.kill()  # SIGKILL: its workers' transactions in flight roll back
        victim.communicate(timeout=scaled(30))
    assert victim.returncode == -9
    before = applied(store)
    assert 60 <= sum(1 for a in before if a.kind == LOG) < LOGS  # killed mid-run
    assert max(collections.Counter(a.position for a in before if a.kind == LOG).values()) == 1

    finish(runner(db_url, "survivor", *args, "--exit-when-empty"))

    rows = applied(store)
    sent = [
        SentEntry(SOURCE, CLIENT, p, f"l{p}", ("sink",)) for p in range(SNAP + 1, SNAP + LOGS + 1)
    ]
    info = SnapshotInfo(SID, SOURCE, "sink", CLIENT, SNAP, SNAP)
    report = verify(sent, rows, snapshots=[info])
    report.assert_clean()  # none lost or twice; per key in order; barriers in place
    assert report.applied == LOGS
    keyed = {a.key for a in rows if a.kind == LOG}
    assert len(keyed - {""}) == KEYS and "" in keyed  # keys reached the listener
    # The full sync came first and whole, before every log entry.
    assert [a.kind for a in rows[: SNAP + 2]] == [START, *[SNAPSHOT] * SNAP, END]
    assert store.inspection.queue_depths() == {}
