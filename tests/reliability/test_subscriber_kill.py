"""Subscriber processes killed with SIGKILL mid-callback, and competing subscribers.

Invariant I3: whatever happens to the subscriber, the application table ends
up with every entry exactly once.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.recv import parked_views as pv
from tests.kit.wait import scaled, wait_for
from tests.reliability.subscriber_proc import app_applied, app_metadata

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("subscriber_proc.py")
CLIENT = "policy"


def runner(url: str, owner: str, *args: str) -> subprocess.Popen[str]:
    timeout = f"--timeout={scaled(120)}"  # the process gives up after this
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, str(RUNNER), f"--url={url}", f"--owner={owner}", *args, timeout],
        cwd=ROOT,
        env=env,  # this tree's packages, not an installed copy's
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 150.0) -> dict[str, object]:
    out, err = proc.communicate(timeout=scaled(timeout))
    assert proc.returncode == 0, err
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def fill(store: SQLAlchemyQueueStore, source: str, snapshot: int, log: int) -> None:
    """A snapshot of ``snapshot`` entries (if any), then log entries after it."""
    if snapshot:
        sid = f"snap-{source}"
        entries = [
            WireEntry(i, ReplicationType.SNAPSHOT_SYNC, b"s%d" % i, snapshot_id=sid)
            for i in range(1, snapshot + 1)
        ]
        marker = WireEntry(
            snapshot + 1,
            ReplicationType.LAST_FULL_SYNC_ENTRY,
            b"",
            snapshot_id=sid,
            snapshot_count=snapshot,
            base_position=snapshot,
        )
        store.recv.apply_snapshot_batch(source, CLIENT, sid, [*entries, marker])
    for first in range(snapshot + 1, snapshot + log + 1, 50):
        last = min(snapshot + log, first + 49)
        entries = [
            WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"l%d" % p) for p in range(first, last + 1)
        ]
        store.recv.apply_log_batch(source, CLIENT, entries)


def applied(store: SQLAlchemyQueueStore) -> list[tuple[str, str, str, int]]:
    a = app_applied.c
    with store.read() as conn:
        rows = conn.execute(select(a.source_id, a.kind, a.snapshot_id, a.position)).all()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def expected(
    source: str, snapshot: int, log: int
) -> collections.Counter[tuple[str, str, str, int]]:
    want: collections.Counter[tuple[str, str, str, int]] = collections.Counter()
    if snapshot:
        sid = f"snap-{source}"
        want[(source, "start", sid, 0)] = 1
        want[(source, "end", sid, 0)] = 1
        want.update((source, "full_sync", sid, i) for i in range(1, snapshot + 1))
    want.update((source, "log_entries", "", p) for p in range(snapshot + 1, snapshot + log + 1))
    return want


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    def there() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"runner exited early: {proc.communicate()[1]}")
        return path.exists()

    try:
        wait_for(there, timeout, 0.02, what="the runner in its blocking callback")
    except AssertionError:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise


@pytest.mark.parametrize(
    ("block_in", "block_at"),
    [
        ("process_log_entries", 2),
        ("process_full_sync", 1),  # the same transaction issued on_full_sync_start
        ("on_full_sync_end", 1),
    ],
)
@pytest.mark.parametrize("api", ["sync", "aio-psycopg", "aio-asyncpg"])
def test_sigkill_mid_callback_then_restart_applies_each_entry_once(
    store: SQLAlchemyQueueStore,
    db_url: str,
    tmp_path: Path,
    block_in: str,
    block_at: int,
    api: str,
) -> None:
    """``api``: the victim runs the sync subscriber or the async one (on SQLite both aio
    cases run aiosqlite), killed inside its listener's callback."""
    if api == "aio-asyncpg" and store.dialect == "sqlite":
        pytest.skip("on SQLite both async cases run aiosqlite: aio-psycopg runs it")
    app_metadata.create_all(store.engine)
    fill(store, "src-a", snapshot=10, log=20)
    marker = tmp_path / "blocked.json"
    how = [] if api == "sync" else ["--api=aio", f"--driver={api.split('-')[1]}"]

    victim = runner(
        db_url,
        "victim",
        *how,
        "--batch-size=4",
        "--lease-seconds=1",
        f"--block-in={block_in}",
        f"--block-at={block_at}",
        f"--marker={marker}",
    )
    wait_for_file(marker, victim)
    victim.kill()  # SIGKILL, inside the callback, its rows written but not committed
    victim.communicate(timeout=scaled(30))
    assert victim.returncode == -9

    blocked = json.loads(marker.read_text())
    before = collections.Counter(applied(store))
    assert max(before.values(), default=1) == 1
    kind = blocked["kind"]
    lost = {(blocked["source"], kind, sid, pos) for sid, pos in blocked["rows"]}
    assert lost and not lost & set(before)  # the killed transaction left nothing behind

    result = finish(runner(db_url, "survivor", *how, "--batch-size=4", "--exit-when-empty"))
    after = collections.Counter(applied(store))
    assert after == expected("src-a", snapshot=10, log=20)  # everything, exactly once
    assert result["delivered"] == 30 - sum(1 for r in before if r[1] not in ("start", "end"))


@pytest.mark.parametrize("apis", [("sync", "sync"), ("sync", "aio")], ids=["sync+sync", "sync+aio"])
def test_competing_subscriber_processes_never_deliver_twice(
    store: SQLAlchemyQueueStore, db_url: str, apis: tuple[str, str]
) -> None:
    """Two processes trading the queues at every poll: both sync, or a sync one and an
    async one (psycopg's async driver on PostgreSQL)."""
    app_metadata.create_all(store.engine)
    fill(store, "src-a", snapshot=0, log=150)
    fill(store, "src-b", snapshot=0, log=150)
    fill(store, "src-s", snapshot=40, log=60)

    procs = [
        runner(
            db_url,
            name,
            f"--api={api}",
            "--batch-size=7",
            "--exit-when-empty",
            "--release-every-poll",
        )
        for name, api in zip(("one", "two"), apis, strict=True)
    ]
    results = [finish(p) for p in procs]

    got = collections.Counter(applied(store))
    want = expected("src-a", 0, 150) + expected("src-b", 0, 150) + expected("src-s", 40, 60)
    assert max(got.values()) == 1  # no entry twice
    assert got == want  # and none missing
    assert sum(int(str(r["delivered"])) for r in results) == 400


def in_order(source: str, snapshot: int, log: int) -> list[tuple[str, str, int]]:
    """(kind, snapshot id, position) of one source's rows, in the order they must apply."""
    sid = f"snap-{source}"
    rows = [("start", sid, 0)] + [("full_sync", sid, i) for i in range(1, snapshot + 1)]
    rows = [*rows, ("end", sid, 0)] if snapshot else []
    return rows + [("log_entries", "", p) for p in range(snapshot + 1, snapshot + log + 1)]


def applied_in_order(store: SQLAlchemyQueueStore) -> dict[str, list[tuple[str, str, int]]]:
    a = app_applied.c
    with store.read() as conn:
        rows = conn.execute(select(a.source_id, a.kind, a.snapshot_id, a.position).order_by(a.id))
        out: dict[str, list[tuple[str, str, int]]] = {}
        for source, kind, sid, pos in rows:
            out.setdefault(source, []).append((kind, sid, pos))
    return out


def test_sigkill_mid_delivery_across_rotations_applies_each_entry_once_in_order(
    store: SQLAlchemyQueueStore, db_url: str, tmp_path: Path
) -> None:
    """A subscriber killed inside a delivery while the receive queues rotate around it.

    While it hangs (PostgreSQL: its transaction still reads every slot),
    rotation gives up at once and appliers go on; after the kill the slots
    come round, each truncated only once everything in it was delivered, while
    a second subscriber delivers. Each entry applies once, in queue order.
    """
    app_metadata.create_all(store.engine)
    postgres = store.dialect == "postgresql"
    fill(store, "src-a", snapshot=0, log=60)
    fill(store, "src-b", snapshot=5, log=20)
    marker = tmp_path / "blocked.json"
    victim = runner(
        db_url,
        "victim",
        "--batch-size=4",
        "--lease-seconds=1",
        "--block-in=process_log_entries",
        "--block-at=3",
        f"--marker={marker}",
    )
    wait_for_file(marker, victim)
    if postgres:  # SQLite: the victim holds the only write lock until it dies
        assert [store.queues.rotate_receive_queues(period=0.0) for _ in range(3)] == [None] * 3
        store.recv.apply_log_batch(
            "src-a", CLIENT, [WireEntry(61, ReplicationType.LOG_ENTRY_SYNC, b"l61")]
        )
    victim.kill()  # SIGKILL inside the callback: its rows written, not committed
    victim.communicate(timeout=scaled(30))
    assert victim.returncode == -9

    rotated = []
    for first in range(61 + postgres, 121, 10):  # the ring comes round between appends
        log = [
            WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"l%d" % p)
            for p in range(first, min(first + 10, 121))
        ]
        store.recv.apply_log_batch("src-a", CLIENT, log)
        rotated.append(store.queues.rotate_receive_queues(period=0.0))
    survivor = runner(db_url, "survivor", "--batch-size=4", "--exit-when-empty")
    while True:  # rotating while it delivers, as the server does
        try:
            survivor.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            rotated.append(store.queues.rotate_receive_queues(period=0.0))
    finish(survivor)
    rotated.append(store.queues.rotate_receive_queues(period=0.0))

    assert applied_in_order(store) == {
        "src-a": in_order("src-a", 0, 120),
        "src-b": in_order("src-b", 5, 20),
    }
    assert store.inspection.queue_depths() == {}
    if postgres:
        assert any(r is not None for r in rotated), rotated
    else:
        assert rotated == [None] * len(rotated)


def test_sigkill_mid_park_then_restart_parks_once_and_applies_the_others_once(
    store: SQLAlchemyQueueStore, db_url: str, tmp_path: Path
) -> None:
    """The ``park`` policy's bisection killed after it found the poison entry, inside the
    listener's call of the last good half: nothing of that transaction stays; the next
    process parks the entry once and applies every other entry once."""
    app_metadata.create_all(store.engine)
    fill(store, "src-a", snapshot=0, log=30)
    marker = tmp_path / "blocked.json"
    park = ["--batch-size=10", "--poison=15", "--park-after=1", "--lease-seconds=1"]
    # Batch 11..20: the whole and [11..15] fail; [11, 12], [13], [14] apply in savepoints,
    # 15 fails alone (parked), and the 4th good call, [16..20], hangs.
    block = ["--block-in=process_log_entries", "--block-at=5", f"--marker={marker}"]
    victim = runner(db_url, "victim", *park, *block)
    wait_for_file(marker, victim)
    assert [pos for _, pos in json.loads(marker.read_text())["rows"]] == [16, 17, 18, 19, 20]
    victim.kill()
    victim.communicate(timeout=scaled(30))
    assert victim.returncode == -9
    with store.read() as conn:
        assert pv.find(conn) == []  # the park was in the killed transaction
    assert sorted(pos for *_, pos in applied(store)) == list(range(1, 11))

    finish(runner(db_url, "survivor", *park, "--exit-when-empty"))
    got = collections.Counter(applied(store))
    want = expected("src-a", 0, 30)
    del want[("src-a", "log_entries", "", 15)]
    assert got == want  # every other entry, exactly once
    with store.read() as conn:
        parked = pv.find(conn)
    assert [(r.source_position, r.state, r.attempts) for r in parked] == [(15, "parked", 1)]
    assert "poisoned: [15]" in parked[0].error
