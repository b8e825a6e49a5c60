"""The async snapshot provider (``async def provide(ctx)``) in an event loop, on SQLite
(aiosqlite) and PostgreSQL (psycopg, asyncpg): the sync runner's rules, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from lr_client.aio import AsyncSnapshotContext, AsyncSnapshotProviderRunner
from lr_client.aio.snapshot import AsyncProvider
from lr_client.errors import SnapshotError
from lr_client.records import ReplicationType, SnapshotStatus
from tests.kit.aio import DRIVER_PARAMS, Site, aio_site

SNAP, END = ReplicationType.SNAPSHOT_SYNC, ReplicationType.LAST_FULL_SYNC_ENTRY


@pytest.fixture(params=DRIVER_PARAMS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    with aio_site(str(request.param), tmp_path) as made:
        yield made


def entries(site: Site, snapshot_id: str) -> list[tuple[ReplicationType, bytes]]:
    return [
        (e.type, e.payload)
        for e in site.store.snapshot_entries.read_snapshot_entries(snapshot_id, 0, 1000)
    ]


def status(site: Site, snapshot_id: str) -> SnapshotStatus:
    req = site.store.snapshots.get_snapshot(snapshot_id)
    assert req is not None
    return req.status


def poll(site: Site, provider: AsyncProvider, **kwargs: object) -> int:
    """One ``poll_once`` of an async runner on the site's async engine."""

    async def main() -> int:
        engine = site.engine()
        try:
            runner = AsyncSnapshotProviderRunner(engine, "policy", provider, **kwargs)  # type: ignore[arg-type]
            return await runner.poll_once()
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_an_async_provider_writes_its_entries_and_the_runner_completes_them(site: Site) -> None:
    seen: list[AsyncSnapshotContext] = []

    async def provide(ctx: AsyncSnapshotContext) -> None:
        seen.append(ctx)
        assert await ctx.transmit([b"a", b"b"]) == 2
        await asyncio.sleep(0)  # the provider's awaits yield to the loop
        assert await ctx.transmit(iter([b"c", (b"d", "key-d")])) == 2
        assert ctx.progress == 4 and not await ctx.is_cancelled()

    sid = site.store.snapshots.request_snapshot(None, "b", "policy", "test")
    assert poll(site, provide, chunk_size=3) == 1
    assert poll(site, provide) == 0  # nothing left to do
    (ctx,) = seen
    assert (ctx.snapshot_id, ctx.destination, ctx.client_name) == (sid, "b", "policy")
    assert status(site, sid) == SnapshotStatus.READY
    assert entries(site, sid) == [
        (SNAP, b"a"),
        (SNAP, b"b"),
        (SNAP, b"c"),
        (SNAP, b"d"),
        (END, b"4"),
    ]


def test_a_failing_async_provider_fails_its_snapshot_and_releases_its_entries(site: Site) -> None:
    async def provide(ctx: AsyncSnapshotContext) -> None:
        await ctx.transmit([b"a", b"b"])
        raise RuntimeError("source went away")

    sid = site.store.snapshots.request_snapshot(None, "b", "policy")
    with pytest.raises(RuntimeError, match="went away"):
        poll(site, provide)
    assert status(site, sid) == SnapshotStatus.FAILED
    assert site.store.snapshot_entries.count_snapshot_entries(sid) == 0


def test_a_snapshot_superseded_while_its_provider_awaits_is_cancelled_not_failed(
    site: Site,
) -> None:
    stopped: list[bool] = []

    async def provide(ctx: AsyncSnapshotContext) -> None:
        await ctx.transmit([b"old"])
        await asyncio.to_thread(
            site.store.snapshots.request_snapshot, None, "b", "policy", "operator"
        )
        stopped.append(await ctx.is_cancelled())
        with pytest.raises(SnapshotError):
            await ctx.transmit([b"old-2"])
        raise SnapshotError("gave up")  # the runner releases it, not a failure

    old = site.store.snapshots.request_snapshot(None, "b", "policy")
    assert poll(site, provide) == 1
    assert stopped == [True]
    assert status(site, old) == SnapshotStatus.CANCELLED
    assert site.store.snapshot_entries.count_snapshot_entries(old) == 0


def test_heartbeats_go_on_while_the_provider_awaits(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    beats: list[str] = []

    async def provide(ctx: AsyncSnapshotContext) -> None:
        await ctx.transmit([b"a"])
        deadline = asyncio.get_running_loop().time() + 30.0
        while len(beats) < 3:  # the loop's heartbeat task runs while this awaits
            assert asyncio.get_running_loop().time() < deadline, "no heartbeats"
            await asyncio.sleep(0.01)

    store_cls = type(site.store.snapshots)
    real = store_cls.heartbeat_snapshot

    def counting(self: object, snapshot_id: str) -> bool:
        beats.append(snapshot_id)
        return real(self, snapshot_id)  # type: ignore[arg-type]

    monkeypatch.setattr(store_cls, "heartbeat_snapshot", counting)
    sid = site.store.snapshots.request_snapshot(None, "b", "policy")
    assert poll(site, provide, heartbeat_interval=0.02) == 1
    assert set(beats) == {sid} and status(site, sid) == SnapshotStatus.READY
