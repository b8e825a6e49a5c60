"""Snapshot entries in a pool of slots (:mod:`lr_client.store.snapshots.pool`).

On both backends: a snapshot takes a slot of its own at its start and frees it
once its entries are released, and no writer of an ended snapshot reaches a
slot another snapshot took since. On PostgreSQL: the release truncates the
slot's partition (no row deleted), does not wait for a reader holding it,
and trim releases it later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy
from sqlalchemy import text

from lr_client.errors import SnapshotError
from lr_client.records import SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store.snapshots.pool import partition_name
from tests.conftest import PgSchema
from tests.kit.pglocks import waiting_for_a_lock
from tests.kit.wait import wait_for


def _open(engine: sqlalchemy.Engine) -> SQLAlchemyQueueStore:
    store = open_store(engine)
    assert isinstance(store, SQLAlchemyQueueStore)
    return store


def _slots(store: SQLAlchemyQueueStore) -> dict[str, int | None]:
    with store.read() as conn:
        rows = conn.execute(text("SELECT snapshot_id, snap_slot FROM lrq_snapshots")).all()
    return {r[0]: r[1] for r in rows}


def _slot_entries(store: SQLAlchemyQueueStore, slot: int) -> list[tuple[str, bytes]]:
    """(snapshot id, payload) of the entries stored in a slot (PostgreSQL: its partition)."""
    if store.dialect == "postgresql":
        query = text(f"SELECT snapshot_id, payload FROM {partition_name(slot)} ORDER BY position")
    else:  # one table: the slot's entries are its holder's
        query = text(
            "SELECT e.snapshot_id, e.payload FROM lrq_send_snapsync e "
            "JOIN lrq_snapshots r ON r.snapshot_id = e.snapshot_id "
            "WHERE r.snap_slot = :slot ORDER BY e.position"
        )
    with store.read() as conn:
        return [(r[0], bytes(r[1])) for r in conn.execute(query, {"slot": slot}).all()]


def _running(store: SQLAlchemyQueueStore, destination: str, payloads: list[bytes]) -> str:
    sid = store.snapshots.request_snapshot(None, destination, "policy")
    assert store.snapshots.start_snapshot(sid) is not None
    if payloads:
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(conn, sid, 0, payloads)
    return sid


def test_a_snapshot_holds_a_slot_from_its_start_until_its_entries_are_released(
    store: SQLAlchemyQueueStore,
) -> None:
    sid = store.snapshots.request_snapshot(None, "b", "policy")
    assert _slots(store) == {sid: None}  # requested: nothing to store yet
    store.snapshots.start_snapshot(sid)
    assert _slots(store) == {sid: 0}
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"a", b"b"])
    store.snapshot_entries.finish_snapshot(sid)
    assert _slot_entries(store, 0) == [(sid, b"a"), (sid, b"b"), (sid, b"2")]
    assert store.snapshots.complete_snapshot(sid)
    assert _slots(store) == {sid: None}
    assert _slot_entries(store, 0) == []


def test_a_slot_is_reused_once_released(store: SQLAlchemyQueueStore) -> None:
    first = _running(store, "b", [b"a"])
    second = _running(store, "c", [b"b"])
    assert _slots(store) == {first: 0, second: 1}
    store.snapshots.cancel_snapshot(first)
    third = _running(store, "d", [b"c"])
    assert _slots(store) == {first: None, second: 1, third: 0}
    assert _slot_entries(store, 0) == [(third, b"c")]
    assert _slot_entries(store, 1) == [(second, b"b")]
    if store.dialect == "postgresql":  # the pool did not grow
        with store.read() as conn:
            n = conn.execute(
                text(
                    "SELECT count(*) FROM pg_inherits "
                    "WHERE inhparent = CAST('lrq_send_snapsync' AS regclass)"
                )
            ).scalar_one()
        assert n == 2


def test_snapshots_started_at_once_get_distinct_slots(store: SQLAlchemyQueueStore) -> None:
    n = 6
    # Snapshots of distinct clients (destinations asking for one client share one).
    sids = [store.snapshots.request_snapshot(None, f"s{i}", f"policy{i}") for i in range(n)]
    stores = [_open(create_engine(str(store.engine.url))) for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def start(st: SQLAlchemyQueueStore, sid: str) -> None:
        barrier.wait()
        try:
            assert st.snapshots.start_snapshot(sid) is not None
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [
        threading.Thread(target=start, args=(st, sid)) for st, sid in zip(stores, sids, strict=True)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert sorted(v for v in _slots(store).values() if v is not None) == list(range(n))
    finally:
        for st in stores:
            st.close()


def test_cancelling_one_snapshot_never_disturbs_anothers_entries(
    store: SQLAlchemyQueueStore,
) -> None:
    kept = _running(store, "b", [b"k1", b"k2"])
    gone = _running(store, "c", [b"g1"])
    store.snapshots.cancel_snapshot(gone)
    assert store.snapshot_entries.count_snapshot_entries(gone) == 0
    assert store.snapshot_entries.count_snapshot_entries(kept) == 2
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, kept, 1, [b"k3"])
    assert store.snapshot_entries.finish_snapshot(kept) == 3
    assert [e.payload for e in store.snapshot_entries.read_snapshot_entries(kept, 0, 10)] == [
        b"k1",
        b"k2",
        b"k3",
        b"3",
    ]


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "rows"])
def test_a_writer_of_a_cancelled_snapshot_writes_nothing_into_its_reused_slot(
    store: SQLAlchemyQueueStore, bulk: bool
) -> None:
    old = _running(store, "b", [b"old"])
    store.snapshots.cancel_snapshot(old)
    new = _running(store, "b", [b"new"])
    assert _slots(store)[new] == 0  # the cancelled snapshot's slot
    with pytest.raises(SnapshotError, match="cancelled, not running"):
        store.snapshot_entries.write_snapshot_part(
            old, 0, iter([b"late1", b"late2"]), 10, bulk=bulk
        )
    with pytest.raises(SnapshotError, match="cancelled, not running"):
        store.snapshot_entries.drop_unwritten_parts(old, {})
    assert _slot_entries(store, 0) == [(new, b"new")]


def test_a_write_in_flight_when_its_snapshot_is_cancelled_goes_with_it(
    db_url: str,
) -> None:
    """The cancel waits for the write, then releases what it wrote, before the slot is free."""
    pg = db_url.startswith("postgresql")
    name = "lr-pool-cancel"
    store = _open(create_engine(db_url))
    canceller = _open(
        create_engine(db_url, **({"connect_args": {"application_name": name}} if pg else {}))
    )
    admin = create_engine(db_url, poolclass=sqlalchemy.pool.NullPool)
    try:
        store.create_schema()
        old = _running(store, "b", [])
        done = threading.Event()

        def cancel() -> None:
            canceller.snapshots.cancel_snapshot(old)
            done.set()

        thread = threading.Thread(target=cancel)
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(conn, old, 0, [b"in flight"])
            thread.start()
            if pg:  # the cancel waits for this write's share lock
                wait_for(
                    lambda: waiting_for_a_lock(admin, name), timeout=10, what="the cancel waiting"
                )
            assert not done.is_set()
        thread.join(timeout=30)
        assert done.is_set()
        assert store.snapshot_entries.count_snapshot_entries(old) == 0
        new = _running(store, "c", [b"new"])
        assert _slots(store) == {old: None, new: 0}
        assert _slot_entries(store, 0) == [(new, b"new")]
    finally:
        store.close()
        canceller.close()
        admin.dispose()


@pytest.mark.postgres
def test_progress_and_heartbeats_go_through_while_a_chunk_is_being_written(
    pg_schema: PgSchema,
) -> None:
    """A writer's lock of the snapshot's row lets the driver's updates of it through."""
    store = _open(pg_schema.engine())
    driver = _open(pg_schema.engine())
    try:
        store.create_schema()
        sid = _running(store, "b", [])
        done = threading.Event()

        def progress() -> None:
            if driver.snapshots.heartbeat_snapshot(sid) and driver.snapshots.update_snapshot(
                sid, rows_written=1
            ):
                done.set()

        thread = threading.Thread(target=progress, daemon=True)
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(conn, sid, 0, [b"open chunk"])
            thread.start()
            wait_for(done.is_set, timeout=30, what="the driver's updates, the chunk still open")
        thread.join(timeout=30)
        req = store.snapshots.get_snapshot(sid)
        assert req is not None and req.rows_written == 1
    finally:
        store.close()
        driver.close()


# -- PostgreSQL: the release is a TRUNCATE ---------------------------------------------------
@pytest.fixture
def pg_store(pg_schema: PgSchema) -> Iterator[SQLAlchemyQueueStore]:
    store = _open(pg_schema.engine())
    store.create_schema()
    yield store
    store.close()


def _stats(store: SQLAlchemyQueueStore) -> dict[str, tuple[int, int, int]]:
    """{partition: (n_tup_ins, n_tup_del, n_live_tup)} of the snapshot queue's partitions."""
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT relname, n_tup_ins, n_tup_del, n_live_tup FROM pg_stat_user_tables "
                "WHERE schemaname = current_schema() AND relname LIKE 'lrq_send_snapsync_p%'"
            )
        ).all()
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}


def _size(store: SQLAlchemyQueueStore, slot: int) -> int:
    with store.read() as conn:
        return int(
            conn.execute(
                text("SELECT pg_relation_size(CAST(:name AS regclass))"),
                {"name": partition_name(slot)},
            ).scalar_one()
        )


@pytest.mark.postgres
def test_releasing_snapshots_deletes_no_row_and_gives_their_space_back(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    store = pg_store
    n = 2000
    done = _running(store, "b", [])
    store.snapshot_entries.write_snapshot_part(done, 0, (b"x" * 100 for _ in range(n)), 500)
    store.snapshot_entries.finish_snapshot(done)
    gone = _running(store, "c", [b"y" * 100] * n)
    failed = _running(store, "d", [b"z" * 100] * n)
    assert _slots(store) == {done: 0, gone: 1, failed: 2}
    assert min(_size(store, slot) for slot in (0, 1, 2)) > 100 * n
    store.snapshots.complete_snapshot(done)
    store.snapshots.cancel_snapshot(gone)
    req = store.snapshots.get_snapshot(failed)
    assert req is not None
    assert store.snapshots.fail_stalled_snapshot(failed, req.updated_at + 1, "silent")
    assert [_size(store, slot) for slot in (0, 1, 2)] == [0, 0, 0]
    # Every backend's counts flushed (its connection closed): the rows went, none deleted.
    store.engine.dispose()
    want = {partition_name(slot): n + (slot == 0) for slot in (0, 1, 2)}

    def flushed() -> bool:
        stats = _stats(store)
        store.engine.dispose()
        return all(stats.get(p, (0, 0, 1))[0] == k and stats[p][2] == 0 for p, k in want.items())

    wait_for(flushed, timeout=30, what="the statistics of every partition")
    assert {p: st[1] for p, st in _stats(store).items()} == dict.fromkeys(want, 0)


@pytest.mark.postgres
def test_a_release_blocked_by_a_reader_does_not_wait_and_trim_finishes_it(
    pg_store: SQLAlchemyQueueStore, pg_schema: PgSchema
) -> None:
    store = pg_store
    sid = _running(store, "b", [b"a", b"b"])
    store.snapshot_entries.finish_snapshot(sid)
    reader = pg_schema.engine(poolclass=sqlalchemy.pool.NullPool)
    with reader.connect() as conn, conn.begin():
        conn.execute(text(f"LOCK TABLE {partition_name(0)} IN ACCESS SHARE MODE"))
        started = time.monotonic()
        assert store.snapshots.complete_snapshot(sid)
        assert time.monotonic() - started < 5
        assert store.snapshots.get_snapshot(sid).status is SnapshotStatus.COMPLETED  # type: ignore[union-attr]
        assert _slots(store) == {sid: 0}  # kept until the entries go
        assert store.retention.trim() == 0  # still held
        assert _slots(store) == {sid: 0}
        other = _running(store, "c", [b"c"])
        assert _slots(store)[other] == 1  # the held slot is not taken
    assert store.retention.trim() == 3  # the reader is gone: two entries and the end marker
    assert _slots(store)[sid] is None
    assert _slot_entries(store, 0) == []
    assert _slot_entries(store, 1) == [(other, b"c")]


@pytest.mark.postgres
def test_a_request_in_the_applications_transaction_leaves_the_release_to_trim(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    store = pg_store
    old = _running(store, "b", [b"a"])
    with store.engine.begin() as conn:
        new = store.snapshots.request_snapshot(conn, "b", "policy")
        # The application's transaction holds no lock of the old snapshot's partition.
        locks = conn.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                "AND relation = CAST(:name AS regclass)"
            ),
            {"name": partition_name(0)},
        ).scalar_one()
        assert locks == 0
    assert store.snapshots.get_snapshot(old).status is SnapshotStatus.CANCELLED  # type: ignore[union-attr]
    assert _slots(store) == {old: 0, new: None}
    assert store.retention.trim() == 1
    assert _slots(store) == {old: None, new: None}
    assert _slot_entries(store, 0) == []


@pytest.mark.parametrize("slot", ["0", "0; DROP TABLE lrq_snapshots", -1, True, 1.0])
def test_a_partition_name_is_made_of_a_slot_number_only(slot: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        partition_name(slot)  # type: ignore[arg-type]
    assert partition_name(12) == "lrq_send_snapsync_p12"
