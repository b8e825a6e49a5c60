"""Invariants I1 and I2: no committed entry is ever skipped, and readers see commit order.

Real connections: a long transaction that transmits first and commits last;
many writers with rollbacks and work between their transmits under a live
reader; a transaction left open beside them.
"""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore, open_store
from tests.conftest import PgSchema
from tests.kit.wait import join, wait_for

app_meta = MetaData()
app_rows = Table(
    "app_rows",
    app_meta,
    Column("id", Integer, primary_key=True),
    Column("note", String(40), nullable=False),
)


def read_while_writing(
    store: SQLAlchemyQueueStore, writers: Sequence[Callable[[], None]]
) -> list[tuple[int, bytes]]:
    """Run ``writers`` on threads while a reader follows site-b's stream with a cursor.

    The reader stops at the first empty read after every writer ended; it
    returns ``(position, payload)`` of each entry it read, in reading order.
    """
    stop = threading.Event()
    seen: list[tuple[int, bytes]] = []

    def reader() -> None:
        cursor = 0
        while True:
            done = stop.is_set()
            batch = store.read_log_entries("site-b", "policy", cursor, 1000)
            seen.extend((e.position, e.payload) for e in batch)
            if batch:
                cursor = batch[-1].position
            elif done:
                return

    r = threading.Thread(target=reader)
    r.start()
    threads = [threading.Thread(target=w) for w in writers]
    for w in threads:
        w.start()
    for w in threads:
        join(w, 120)
    stop.set()
    join(r, 60)
    return seen


def test_out_of_order_commits_are_never_skipped(pg_schema: PgSchema) -> None:
    store = open_store(pg_schema.engine())
    store.create_schema()
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])

    long_session = Session(store.engine)
    long_session.begin()
    client.transmit_log_entry_message(long_session, b"long", ["site-b"])

    # The short writer must not be able to commit a position the reader could pass.
    short_done = threading.Event()
    tag = "short-" + uuid.uuid4().hex[:8]
    short_store = open_store(pg_schema.engine(connect_args={"application_name": tag}))

    def short_writer() -> None:
        short_client = RoutingQueueClient(short_store, source_id="site-a", client_name="policy")
        with Session(short_store.engine) as session, session.begin():
            short_client.transmit_log_entry_message(session, b"short", ["site-b"])
        short_done.set()

    def short_blocked() -> bool:
        with pg_schema.admin.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = :tag AND wait_event_type = 'Lock'"
                ),
                {"tag": tag},
            ).scalar_one()
        return bool(waiting)

    t = threading.Thread(target=short_writer)
    t.start()
    # Read once the short writer has committed, or waits for the long one's lock.
    wait_for(lambda: short_done.is_set() or short_blocked(), 60, what="the short writer's turn")

    cursor = 0
    seen: list[bytes] = []
    first = store.read_log_entries("site-b", "policy", cursor, 100)
    seen += [e.payload for e in first]
    if first:
        cursor = first[-1].position

    long_session.commit()
    long_session.close()
    join(t, 30)
    assert short_done.is_set()

    rest = store.read_log_entries("site-b", "policy", cursor, 100)
    seen += [e.payload for e in rest]
    # Each once, in commit order: the long transaction committed first.
    assert seen == [b"long", b"short"], seen
    everything = store.read_log_entries("site-b", "policy", 0, 100)
    assert [e.payload for e in everything] == [b"long", b"short"]
    assert cursor in (0, everything[0].position)  # the first read saw nothing or "long" only


def test_many_concurrent_writers_never_skip(pg_schema: PgSchema) -> None:
    store = open_store(pg_schema.engine(pool_size=10))
    store.create_schema()
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])
    n_threads, per_thread = 6, 40

    def writer(k: int) -> None:
        for i in range(per_thread):
            with Session(store.engine) as session, session.begin():
                client.transmit_log_entry_message(session, b"%d-%d" % (k, i), ["site-b"])

    seen = read_while_writing(store, [functools.partial(writer, k) for k in range(n_threads)])
    everything = store.read_log_entries("site-b", "policy", 0, 10_000)
    # The live reader saw every committed entry once, in position order.
    assert seen == [(e.position, e.payload) for e in everything]
    payloads = [e.payload for e in everything]
    assert sorted(payloads) == sorted(
        b"%d-%d" % (k, i) for k in range(n_threads) for i in range(per_thread)
    )
    for k in range(n_threads):  # each writer's entries in the order it committed them
        mine = [p for p in payloads if p.startswith(b"%d-" % k)]
        assert mine == [b"%d-%d" % (k, i) for i in range(per_thread)]


@dataclass
class Txn:
    """One application transaction of a writer: what it sent and when it committed."""

    payloads: list[bytes]
    committed: bool = False
    commit_started: float = 0.0
    commit_returned: float = 0.0


def test_writers_with_rollbacks_and_think_times_are_read_once_in_commit_order(
    store: SQLAlchemyQueueStore,
) -> None:
    """Concurrent application transactions, some rolled back, with work between transmits.

    A live reader must see every committed entry once and nothing rolled back, and
    a transaction whose COMMIT returned before another's began comes first.
    """
    app_meta.create_all(store.engine)
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])
    n_writers, per_writer = 5, 24
    txns: list[Txn] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        rng = random.Random(k)
        for i in range(per_writer):
            txn = Txn([b"%d-%d-%d" % (k, i, j) for j in range(rng.randint(1, 3))])
            session = Session(store.engine)
            try:
                session.begin()
                session.execute(insert(app_rows).values(note=f"{k}-{i}"))
                for payload in txn.payloads:
                    client.transmit_log_entry_message(session, payload, ["site-b"])
                    time.sleep(rng.uniform(0, 0.003))  # the application's own work
                if rng.random() < 0.25:
                    session.rollback()
                else:
                    txn.commit_started = time.monotonic()
                    session.commit()
                    txn.commit_returned = time.monotonic()
                    txn.committed = True
            finally:
                session.close()
            with lock:
                txns.append(txn)

    seen = read_while_writing(store, [functools.partial(writer, k) for k in range(n_writers)])
    committed = [t for t in txns if t.committed]
    assert 0 < len(committed) < len(txns)  # both outcomes happened
    everything = [
        (e.position, e.payload) for e in store.read_log_entries("site-b", "policy", 0, 10_000)
    ]
    assert seen == everything  # the live reader skipped nothing and saw nothing twice
    position = {payload: pos for pos, payload in everything}
    assert sorted(position) == sorted(p for t in committed for p in t.payloads)
    for t in committed:  # a transaction's entries in the order it transmitted them
        assert [position[p] for p in t.payloads] == sorted(position[p] for p in t.payloads)
    for a in committed:
        for b in committed:
            if a.commit_returned < b.commit_started:
                assert max(position[p] for p in a.payloads) < min(
                    position[p] for p in b.payloads
                ), (a.payloads, b.payloads)


def test_an_idle_transaction_does_not_hold_back_delivery(store: SQLAlchemyQueueStore) -> None:
    """A session left open (it wrote an application row, PostgreSQL gave it a transaction id)."""
    app_meta.create_all(store.engine)
    with store.engine.begin() as conn:
        conn.execute(insert(app_rows).values(note="before"))
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])
    idle = Session(store.engine)
    idle.begin()
    if store.dialect == "postgresql":
        idle.execute(update(app_rows).values(note="held"))  # an xid, a row lock, then nothing
    else:  # SQLite has one writer: an idle reader is what can stay open beside writers
        idle.execute(select(app_rows)).all()
    try:
        sent = []
        for i in range(20):
            with Session(store.engine) as session, session.begin():
                client.transmit_log_entry_message(session, b"%d" % i, ["site-b"])
            sent.append(b"%d" % i)
        got = wait_for(
            lambda: [e.payload for e in store.read_log_entries("site-b", "policy", 0, 100)] == sent,
            30,
            what="every entry readable while a transaction stays open",
        )
        assert got
    finally:
        idle.rollback()
        idle.close()
