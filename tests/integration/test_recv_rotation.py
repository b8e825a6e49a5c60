"""Receive queues retired without DELETE: ``delivered_seq`` and the PostgreSQL slot ring.

Delivery only raises the queue's ``delivered_seq``; on PostgreSQL it deletes
no row (the partitions' ``n_tup_del`` stays 0) and rotation truncates a slot
whose every entry was delivered, never one holding an undelivered entry. A
subscriber that lost its lease while another delivered rolls back, the
listener's writes with it. A generated interleaving of appends, deliveries,
failed deliveries and rotations delivers every entry once, in order, on both
backends; and a sink's ``lr server`` rotates on its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from lr_client import (
    RoutingQueueClient,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
)
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.postgres import PostgresCore
from lr_client.store.recv import rotation as recv_rotation
from tests.conftest import PgSchema
from tests.kit.sites import Sites
from tests.kit.wait import wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC

app_metadata = MetaData()
applied = Table(
    "rotation_applied",
    app_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("client", String(63), nullable=False),
    Column("source_id", String(63), nullable=False),
    Column("event", String(80), nullable=False),
)


class Recorder(RoutingQueueListener):
    """Writes one row per callback and message in the delivery's transaction."""

    def __init__(self, client: str = CLIENT) -> None:
        self.client = client
        self.fail_next = False

    def _write(self, session: Session, source_id: str, events: list[str]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("killed mid-delivery")
        session.execute(
            insert(applied),
            [{"client": self.client, "source_id": source_id, "event": e} for e in events],
        )

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._write(session, source_id, [f"start:{snapshot_id}"])

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self._write(session, source_id, [f"end:{snapshot_id}"])

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._write(session, source_id, [m.payload.decode() for m in messages])
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._write(session, source_id, [m.payload.decode().split(":")[0] for m in messages])
        return True

    def on_error(self, error: BaseException) -> None:
        pass


def events(engine: Engine, client: str = CLIENT) -> dict[str, list[str]]:
    """What the listener committed, per source, in commit order."""
    a = applied.c
    with engine.connect() as conn:
        rows = conn.execute(
            select(a.source_id, a.event).where(a.client == client).order_by(a.id)
        ).all()
    out: dict[str, list[str]] = {}
    for source, event in rows:
        out.setdefault(source, []).append(event)
    return out


def log(first: int, last: int, size: int = 0) -> list[WireEntry]:
    """Log entries ``l<position>``, padded with ``size`` incompressible bytes after a colon."""
    return [
        WireEntry(p, LOG, (f"l{p}:" + os.urandom(size // 2).hex()).encode())
        for p in range(first, last + 1)
    ]


@pytest.fixture
def pg() -> Iterator[SQLAlchemyQueueStore]:
    schema = PgSchema()
    try:
        store = open_store(schema.engine())
        assert isinstance(store.core, PostgresCore)
        store.create_schema()
        app_metadata.create_all(store.engine)
        yield store
    finally:
        schema.drop()


def _stats(conn: Connection) -> dict[str, tuple[int, int]]:
    """(inserted, deleted) rows per receive queue partition, as the statistics count them."""
    conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    rows = conn.execute(
        text(
            "SELECT relname, n_tup_ins, n_tup_del FROM pg_stat_user_tables"
            " WHERE schemaname = current_schema() AND relname LIKE 'lrq\\_recv\\_entries\\_s%'"
        )
    ).all()
    return {r[0]: (int(r[1]), int(r[2])) for r in rows}


def _sizes(conn: Connection) -> dict[int, int]:
    """Bytes on disk of each slot's partition (heap and indexes)."""
    return {
        slot: int(
            conn.execute(
                text("SELECT pg_total_relation_size(CAST(:t AS regclass))"),
                {"t": recv_rotation.partition(slot)},
            ).scalar_one()
        )
        for slot in recv_rotation.slots(conn)
    }


def _rows(conn: Connection) -> dict[int, int]:
    """Rows (delivered or not) in each slot."""
    rows = conn.execute(text("SELECT slot, count(*) FROM lrq_recv_entries GROUP BY slot")).all()
    return {int(s): int(n) for s, n in rows}


def _drain(sub: RoutingQueueSubscriber) -> int:
    total = 0
    while n := sub.poll_once():
        total += n
    return total


@pytest.mark.postgres
def test_delivery_deletes_no_row_on_postgresql(pg: SQLAlchemyQueueStore) -> None:
    for i in range(5):
        pg.recv.apply_log_batch("a", CLIENT, log(20 * i + 1, 20 * i + 20))
        pg.recv.apply_log_batch("b", CLIENT, log(10 * i + 1, 10 * i + 10))
    with RoutingQueueSubscriber(pg, CLIENT, Recorder(), batch_size=7) as sub:
        assert _drain(sub) == 150
    got = events(pg.engine)
    assert got == {"a": [f"l{p}" for p in range(1, 101)], "b": [f"l{p}" for p in range(1, 51)]}
    assert pg.inspection.queue_depths() == {}
    pg.engine.dispose()  # the backends exit: their statistics are flushed
    with pg.engine.connect() as conn:
        stats = wait_for(
            lambda: (s := _stats(conn)) and sum(i for i, _ in s.values()) == 150 and s,
            what="the partitions' statistics",
        )
    assert {name: deleted for name, (_, deleted) in stats.items()} == {
        recv_rotation.partition(n): 0 for n in range(4)
    }


@pytest.mark.postgres
def test_rotation_truncates_delivered_slots_never_an_undelivered_entry(
    pg: SQLAlchemyQueueStore,
) -> None:
    sub = RoutingQueueSubscriber(pg, CLIENT, Recorder(), batch_size=50)
    pg.recv.apply_log_batch("a", CLIENT, log(1, 200, size=2000))
    pg.recv.apply_log_batch("b", CLIENT, log(1, 1))  # stays undelivered until the end
    qb = pg.queues.list_queues(CLIENT)[1].queue_id
    with pg.write() as conn:  # b's lease is another subscriber's: only a is delivered
        assert pg.queues.acquire_lease(conn, qb, "elsewhere", 0.0, 1e12) is not None
    assert _drain(sub) == 200
    with pg.engine.connect() as conn:
        assert _rows(conn) == {0: 201}
        before = _sizes(conn)
    assert pg.queues.rotate_receive_queues(period=3600.0) is None  # slot 0 is not due yet
    assert pg.queues.rotate_receive_queues(period=0.0) == 1  # an empty slot was free
    assert pg.queues.rotate_receive_queues(period=0.0) is None  # slot 1 holds nothing yet

    seen = [1]
    for i in range(6):  # around the ring and back: slot 0 is pinned by b's entry
        pg.recv.apply_log_batch("a", CLIENT, log(201 + 10 * i, 210 + 10 * i, size=2000))
        assert _drain(sub) == 10
        seen.append(pg.queues.rotate_receive_queues(period=0.0))
    assert 0 not in seen and None not in seen
    with pg.engine.connect() as conn:
        assert _rows(conn)[0] == 201  # never truncated: b's entry is there
    with pg.read() as conn:
        assert [e.source_position for e in pg.queues.read_queue(conn, qb, 10)] == [1]
    assert events(pg.engine)["a"] == [f"l{p}" for p in range(1, 261)]

    with pg.write() as conn:
        pg.queues.release_leases(conn, "elsewhere")
    assert _drain(sub) == 1  # b's entry: now slot 0 is passed too
    last = 260
    for _ in range(4):  # the ring comes round to slot 0, and retires it
        last += 1
        pg.recv.apply_log_batch("a", CLIENT, log(last, last))
        if pg.queues.rotate_receive_queues(period=0.0) == 0:
            break
    with pg.engine.connect() as conn:
        assert _rows(conn).get(0, 0) == 0
        assert _sizes(conn)[0] < before[0] // 10  # the delivered entries' space is gone
    assert _drain(sub) == last - 260
    assert events(pg.engine) == {"a": [f"l{p}" for p in range(1, last + 1)], "b": ["l1"]}
    sub.close()


@pytest.mark.postgres
def test_storage_stays_bounded_while_a_transaction_pins_vacuum(pg: SQLAlchemyQueueStore) -> None:
    """30 rounds of 100 entries of 1 KiB received, delivered and rotated, with an open
    transaction holding a transaction id all along: no dead row is ever reclaimable,
    yet the receive queue's size stays that of a slot or two."""
    sub = RoutingQueueSubscriber(pg, CLIENT, Recorder(), batch_size=100)
    sizes = []
    with pg.engine.connect() as pin:
        pin.begin()
        pin.execute(text("SELECT pg_current_xact_id()"))
        for i in range(30):
            pg.recv.apply_log_batch("a", CLIENT, log(100 * i + 1, 100 * i + 100, size=1000))
            assert _drain(sub) == 100
            pg.queues.rotate_receive_queues(period=0.0)
            with pg.engine.connect() as conn:
                sizes.append(sum(_sizes(conn).values()))
        pin.rollback()
    sub.close()
    written = 30 * 100 * 1000
    assert max(sizes[10:]) <= max(sizes[:10]) * 1.1  # no upward trend
    assert sizes[-1] < written / 4


@pytest.mark.postgres
def test_a_slot_is_added_when_every_other_is_pinned(pg: SQLAlchemyQueueStore) -> None:
    pg.recv.apply_log_batch("a", CLIENT, log(1, 1))
    for i in range(4):  # one undelivered entry in every slot, then a fifth slot
        assert pg.queues.rotate_receive_queues(period=0.0) == i + 1
        pg.recv.apply_log_batch("a", CLIENT, log(i + 2, i + 2))
    with pg.engine.connect() as conn:
        assert recv_rotation.slots(conn) == [0, 1, 2, 3, 4]
        assert sorted(_rows(conn)) == [0, 1, 2, 3, 4]
    with RoutingQueueSubscriber(pg, CLIENT, Recorder()) as sub:
        assert _drain(sub) == 5
    assert pg.queues.rotate_receive_queues(period=0.0) in (0, 1, 2, 3)  # free again: no new slot


@pytest.mark.postgres
def test_a_busy_slot_is_left_for_later_and_stalls_nobody(pg: SQLAlchemyQueueStore) -> None:
    pg.recv.apply_log_batch("a", CLIENT, log(1, 3))
    with RoutingQueueSubscriber(pg, CLIENT, Recorder()) as sub:
        assert _drain(sub) == 3
    with pg.engine.connect() as reader, reader.begin():
        # A long reader of the queues (a delivery, a dump) holds every partition.
        reader.execute(text("SELECT count(*) FROM lrq_recv_entries"))
        assert pg.queues.rotate_receive_queues(period=0.0) is None  # waited 50 ms, no more
        pg.recv.apply_log_batch("a", CLIENT, log(4, 4))  # appliers are not held up
        with pg.engine.connect() as conn:
            assert recv_rotation.slots(conn) == [0, 1, 2, 3]  # and no slot was added for it
    assert pg.queues.rotate_receive_queues(period=0.0) == 1
    assert pg.inspection.queue_depths() == {pg.queues.list_queues(CLIENT)[0].queue_id: 1}


@pytest.mark.postgres
def test_a_subscriber_that_lost_its_lease_rolls_back_after_another_delivered(
    pg: SQLAlchemyQueueStore,
) -> None:
    """Two owners: the stale one's state update matches nothing, its writes roll back."""
    pg.recv.apply_log_batch("a", CLIENT, log(1, 3))
    other = RoutingQueueSubscriber(pg, CLIENT, Recorder(), owner="fresh", retry_initial=0.0)

    class Stale(Recorder):
        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            ok = super().process_log_entries(session, source_id, messages)
            if not getattr(self, "overtaken", False):
                self.overtaken = True
                # Its lease expires meanwhile; the other takes it and delivers.
                assert wait_for(other.poll_once, what="the other subscriber") == 3
            return ok

    stale = RoutingQueueSubscriber(
        pg, CLIENT, Stale(), owner="stale", lease_seconds=0.001, retry_initial=0.0
    )
    assert stale.poll_once() == 0  # rolled back
    assert events(pg.engine) == {"a": ["l1", "l2", "l3"]}  # once: the other's delivery
    with pg.read() as conn:
        state = pg.queues.load_state(conn, pg.queues.list_queues(CLIENT)[0].queue_id)
    assert (state.lease_owner, state.delivered) == ("fresh", 3)
    pg.recv.apply_log_batch("a", CLIENT, log(4, 4))
    assert other.poll_once() == 1
    assert events(pg.engine) == {"a": ["l1", "l2", "l3", "l4"]}
    other.close()
    stale.close()


# -- generated interleavings, both backends ------------------------------------------------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("log"), st.sampled_from("ab"), st.integers(1, 6)),
        st.tuples(st.just("snapshot"), st.sampled_from("ab"), st.integers(0, 4)),
        st.tuples(st.just("deliver"), st.integers(1, 5)),
        st.tuples(st.just("fail"), st.integers(1, 5)),  # a delivery that dies midway
        st.tuples(st.just("rotate")),
        st.tuples(st.just("rotate")),  # often: slots come round while entries wait
        st.tuples(st.just("rotate")),
    ),
    max_size=40,
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example([("log", "a", 2), ("rotate",)] * 4 + [("deliver", 5)])  # the ring comes round
@example([("snapshot", "a", 3), ("deliver", 2), ("rotate",), ("log", "b", 2)] * 3)
@given(ops)
def test_every_entry_is_delivered_once_in_order_whatever_the_interleaving(
    store: SQLAlchemyQueueStore, program: list[tuple[object, ...]]
) -> None:
    client = "c" + uuid.uuid4().hex[:10]  # queues of its own for each example
    app_metadata.create_all(store.engine)
    listener = Recorder(client)
    want: dict[str, list[str]] = {}
    last = {"a": 0, "b": 0}
    snaps = 0

    def subscriber(batch: int) -> RoutingQueueSubscriber:
        return RoutingQueueSubscriber(
            store, client, listener, batch_size=batch, max_batches=1, retry_initial=0.0
        )

    for op in program:
        if op[0] == "log":
            source, n = str(op[1]), int(str(op[2]))
            entries = log(last[source] + 1, last[source] + n)
            store.recv.apply_log_batch(source, client, entries)
            want.setdefault(source, []).extend(f"l{e.position}" for e in entries)
            last[source] += n
        elif op[0] == "snapshot":
            source, n = str(op[1]), int(str(op[2]))
            snaps += 1
            sid = f"s{snaps}"
            rows = [
                WireEntry(i, ReplicationType.SNAPSHOT_SYNC, b"%s-%d" % (sid.encode(), i), sid)
                for i in range(1, n + 1)
            ]
            end = WireEntry(n + 1, ReplicationType.LAST_FULL_SYNC_ENTRY, b"", sid, n, last[source])
            store.recv.apply_snapshot_batch(source, client, sid, [*rows, end])
            want.setdefault(source, []).extend(
                [f"start:{sid}", *(r.payload.decode() for r in rows), f"end:{sid}"]
            )
        elif op[0] in ("deliver", "fail"):
            listener.fail_next = op[0] == "fail"
            with subscriber(int(str(op[1]))) as sub:
                sub.poll_once()
            listener.fail_next = False
        else:
            store.queues.rotate_receive_queues(period=0.0)

    def undelivered() -> int:
        return sum(store.queues.queue_depth(q.queue_id) for q in store.queues.list_queues(client))

    with subscriber(3) as sub:
        for _ in range(100):  # a batch may hold no message (an empty snapshot's markers)
            if not undelivered():
                break
            sub.poll_once()
            store.queues.rotate_receive_queues(period=0.0)
    assert events(store.engine, client) == want
    assert undelivered() == 0


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_sink_server_rotates_its_receive_queues(sites: Sites) -> None:
    """``lr server`` retires delivered entries on its own ([receiver] rotation_period)."""
    fast = "[receiver]\nrotation_period = 0.0\n[retention]\ntrim_interval = 0.05"
    sites.start("b", sources=["a"], extra=fast)
    sites.start("a", dests=["b"])
    source, sink = sites.store("a"), sites.store("b")
    app_metadata.create_all(sink.engine)
    client = RoutingQueueClient(source, "a", CLIENT)
    sent: list[str] = []

    def slot() -> int:
        with sink.read() as conn:
            return int(conn.execute(text("SELECT cur_slot FROM lrq_recv_state")).scalar_one())

    seen = {slot()}
    with RoutingQueueSubscriber(sink, CLIENT, Recorder(), poll_interval=0) as sub:

        def delivered() -> bool:
            sub.poll_once()
            return events(sink.engine).get("a") == sent

        def one_more() -> bool:
            """Transmit and deliver one entry; whether the server has rotated twice by now."""
            n = len(sent) + 1
            with Session(source.engine) as session, session.begin():
                client.transmit_log_entry_message(session, b"l%d" % n, ["b"])
            sent.append(f"l{n}")
            wait_for(delivered, what=f"entry {n} delivered")
            seen.add(slot())
            return len(seen) >= 3

        wait_for(one_more, what="two rotations by the sink's server")
    assert events(sink.engine) == {"a": sent}


@pytest.mark.postgres
def test_rotation_keeps_a_relayed_queue_above_its_relay_floor(pg: SQLAlchemyQueueStore) -> None:
    """A branch relays ``(CLIENT, a)``: its delivered entries stay until its child has
    them; then rotation truncates their slot, still without deleting a row."""
    pg.cascade.apply_cascade_config(CLIENT, "a", "branch", "a", ["child"])
    pg.recv.apply_log_batch("a", CLIENT, log(1, 50))  # slot 0
    sub = RoutingQueueSubscriber(pg, CLIENT, Recorder(), batch_size=20)
    assert _drain(sub) == 50
    written = 0

    def churn(rounds: int) -> list[int | None]:
        """Rounds of a delivered entry of another queue (b) and a rotation."""
        nonlocal written
        out = []
        for _ in range(rounds):
            written += 1
            pg.recv.apply_log_batch("b", CLIENT, log(written, written))
            _drain(sub)
            out.append(pg.queues.rotate_receive_queues(period=0.0))
        return out

    pg.shipping.set_cursor("child", CLIENT, 30)
    pg.cascade.trim_relay(CLIENT, "a")
    assert pg.cascade.relay_resume_floor(CLIENT, "a") == 30
    churn(12)  # the ring went round several times: slot 0 holds 31..50, kept
    with pg.engine.connect() as conn:
        assert _rows(conn)[0] >= 50  # with the first entry of b
    assert [e.position for e in pg.cascade.read_relay(CLIENT, "a", 30, 100)] == list(range(31, 51))
    pg.shipping.set_cursor("child", CLIENT, 50)
    pg.cascade.trim_relay(CLIENT, "a")
    churn(8)
    with pg.engine.connect() as conn:
        assert _rows(conn).get(0, 0) <= 1  # truncated (one entry of b may have come since)
        assert sum(d for _, d in _stats(conn).values()) == 0
    assert pg.cascade.read_relay(CLIENT, "a", 0, 100) == []
    sub.close()
