"""Shared snapshots end to end: one snapshot, written once, shipped to every destination.

Real gRPC between in-process sites, an in-process snapshot provider at the
source, subscribers applying to each sink's own table; on both backends.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from lr_client.records import OPEN_SNAPSHOT_STATUSES, SnapshotStatus
from lr_client.snapshot import SnapshotContext, SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from tests.integration.test_full_sync import running, sink_app, source_app
from tests.kit import kvapp
from tests.kit.sites import Sites
from tests.kit.wait import wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


DESTS = ["b", "c", "d", "e"]


def _counting_provider(src: SQLAlchemyQueueStore, calls: list[str]):  # type: ignore[no-untyped-def]
    inner = kvapp.provider(src.engine)

    def provide(ctx: SnapshotContext) -> None:
        calls.append(ctx.snapshot_id)
        inner(ctx)

    return provide


def _applied_snapshot_rows(sink: SQLAlchemyQueueStore) -> int:
    with sink.read() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(kvapp.applied)
                .where(kvapp.applied.c.kind == "snapshot")
            ).scalar_one()
        )


def _stored(src: SQLAlchemyQueueStore) -> int:
    with src.read() as conn:
        return int(conn.execute(select(func.count()).select_from(s.send_snapsync)).scalar_one())


def _one_open_snapshot_with(src: SQLAlchemyQueueStore, dests: list[str]) -> str | None:
    views = src.snapshots.list_snapshots(client_name="policy", statuses=OPEN_SNAPSHOT_STATUSES)
    ids = {v.snapshot_id for v in views}
    if len(ids) != 1 or sorted(v.destination for v in views) != sorted(dests):
        return None
    return ids.pop()


def test_destinations_syncing_together_share_one_snapshot_each_row_once(sites: Sites) -> None:
    src, client = source_app(sites, "a", DESTS)
    for i in range(60):
        kvapp.write(src.engine, client, {f"k{i}": i}, DESTS)
    sinks = {d: sink_app(sites, d) for d in DESTS}
    for d in DESTS:
        sites.start(d, sources=["a"])
    sites.start("a", dests=DESTS, snapshot="app")
    # Every destination asks on first contact; the provider starts once all joined.
    wait_for(lambda: _one_open_snapshot_with(src, DESTS) is not None, timeout=30)
    sid = _one_open_snapshot_with(src, DESTS)
    assert sid is not None
    calls: list[str] = []
    runner = SnapshotProviderRunner(src, "policy", _counting_provider(src, calls))
    with running(runner, *(sinks[d][1] for d in DESTS)):
        for d in DESTS:
            wait_for(
                lambda d=d: kvapp.table(sinks[d][0].engine) == kvapp.table(src.engine), timeout=60
            )
        wait_for(
            lambda: src.snapshots.get_snapshot(sid).status is SnapshotStatus.COMPLETED, timeout=30
        )  # type: ignore[union-attr]
        for i in range(10):
            kvapp.write(src.engine, client, {f"k{i}": 1000 + i}, DESTS)
        for d in DESTS:
            wait_for(
                lambda d=d: kvapp.table(sinks[d][0].engine) == kvapp.table(src.engine), timeout=60
            )
    assert calls == [sid]  # one provider run, one copy of the rows
    snap = src.snapshots.get_snapshot(sid)
    assert snap is not None and snap.entry_count == 60
    for d in DESTS:
        view = src.snapshots.get_snapshot(sid, d)
        assert view is not None and view.status is SnapshotStatus.COMPLETED
        assert _applied_snapshot_rows(sinks[d][0]) == 60  # every row exactly once
        assert sinks[d][2].full_syncs == [sid] and sinks[d][2].errors == []
    assert _stored(src) == 0  # released once the last destination had it


def test_one_destination_cancelled_the_others_complete_from_the_shared_copy(
    sites: Sites,
) -> None:
    src, client = source_app(sites, "a", DESTS)
    for i in range(40):
        kvapp.write(src.engine, client, {f"k{i}": i}, DESTS)
    sinks = {d: sink_app(sites, d) for d in DESTS}
    for d in DESTS:
        sites.start(d, sources=["a"])
    sites.start("a", dests=DESTS, snapshot="app")
    wait_for(lambda: _one_open_snapshot_with(src, DESTS) is not None, timeout=30)
    sid = _one_open_snapshot_with(src, DESTS)
    assert sid is not None
    assert src.snapshots.cancel_snapshot(sid, "operator", destination="c")
    calls: list[str] = []
    runner = SnapshotProviderRunner(src, "policy", _counting_provider(src, calls))
    others = ["b", "d", "e"]

    def status(snapshot_id: str, d: str) -> SnapshotStatus | None:
        view = src.snapshots.get_snapshot(snapshot_id, d)
        return None if view is None else view.status

    def c_completed() -> str | None:
        # c asks again and gets a snapshot of its own (how many tries it takes, a
        # stall reclaim under load included, is not the point: the last completes).
        done = [x for x in calls[1:] if status(x, "c") is SnapshotStatus.COMPLETED]
        return done[-1] if done else None

    with running(runner, *(sinks[d][1] for d in DESTS)):
        for d in others:  # each completes from the shared copy, acknowledged at the source
            wait_for(lambda d=d: status(sid, d) is SnapshotStatus.COMPLETED, timeout=60, what=d)
        c_sid = wait_for(c_completed, timeout=60, what="c's own snapshot completed")
        expected = {"b": sid, "c": c_sid, "d": sid, "e": sid}
        for d in DESTS:  # delivered and committed at the sink
            wait_for(
                lambda d=d: (
                    expected[d] in sinks[d][2].full_syncs
                    and _applied_snapshot_rows(sinks[d][0]) >= 40
                    and kvapp.table(sinks[d][0].engine) == kvapp.table(src.engine)
                ),
                timeout=60,
                what=f"{d} applied its snapshot",
            )
    assert calls[0] == sid and calls.count(sid) == 1  # the shared copy written once
    assert c_sid != sid
    assert [status(sid, d) for d in DESTS] == [
        SnapshotStatus.COMPLETED,
        SnapshotStatus.CANCELLED,
        SnapshotStatus.COMPLETED,
        SnapshotStatus.COMPLETED,
    ]
    # A delivery retried after a rollback (a busy database) calls the start again:
    # what counts is which snapshots reached each sink and its rows, applied once.
    for d in others:
        assert set(sinks[d][2].full_syncs) == {sid}
        assert _applied_snapshot_rows(sinks[d][0]) == 40
    assert sid not in sinks["c"][2].full_syncs and c_sid in sinks["c"][2].full_syncs
    assert _applied_snapshot_rows(sinks["c"][0]) == 40 * len(set(sinks["c"][2].full_syncs))
    wait_for(lambda: _stored(src) == 0, timeout=30)
