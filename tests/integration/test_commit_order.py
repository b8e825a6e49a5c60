"""Invariants I1 and I2: no committed entry is ever skipped, and readers see commit order.

Real connections: a long transaction that transmits first and commits last;
many writers with rollbacks and work between their transmits under a live
reader; a transaction left open beside them.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.orm import Session

from lr_client import EntryRef, LRMessageWithDestinations, RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from tests.conftest import PgSchema
from tests.kit.apps import App, Tx, every_flavour
from tests.kit.pglocks import waiting_for_a_lock
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
            batch = store.shipping.read_log_entries("site-b", "policy", cursor, 1000)
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


def pg_source(pg_schema: PgSchema) -> tuple[SQLAlchemyQueueStore, RoutingQueueClient]:
    """A PostgreSQL store with its schema, and client ``policy`` of site-a sending to site-b."""
    store = open_store(pg_schema.engine())
    assert isinstance(store, SQLAlchemyQueueStore)
    store.create_schema()
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])
    return store, client


@every_flavour(["postgresql"])
def test_out_of_order_commits_are_never_skipped(
    store: SQLAlchemyQueueStore, db_url: str, make_app: Callable[..., App]
) -> None:
    """A transaction that transmits first and commits last comes after a later, shorter one.

    The short writer commits while the long one is open (it does not wait for
    it), a reader passes the short one's entry, and the long one's entry,
    committed afterwards, is still read: above the reader's cursor.
    """
    store.sites.register_sites(["site-b"])
    long_txn = make_app(store).open()
    long_txn.transmit(b"long", ["site-b"])

    short_store = open_store(create_engine(db_url))
    assert isinstance(short_store, SQLAlchemyQueueStore)
    try:
        with make_app(short_store).transaction() as tx:  # never waits for "long"
            tx.transmit(b"short", ["site-b"])

        first = store.shipping.read_log_entries("site-b", "policy", 0, 100)
        assert [e.payload for e in first] == [b"short"]
        cursor = first[-1].position

        long_txn.commit()
        long_txn.close()

        rest = store.shipping.read_log_entries("site-b", "policy", cursor, 100)
        assert [e.payload for e in rest] == [b"long"]  # not skipped: above the cursor
        everything = store.shipping.read_log_entries("site-b", "policy", 0, 100)
        assert [e.payload for e in everything] == [b"short", b"long"]  # commit order
        assert everything[0].position == cursor < everything[1].position
    finally:
        short_store.engine.dispose()


@every_flavour(["postgresql"])
def test_many_concurrent_writers_never_skip(
    store: SQLAlchemyQueueStore, make_app: Callable[..., App]
) -> None:
    store.sites.register_sites(["site-b"])
    app = make_app(store)
    n_threads, per_thread = 6, 40

    def writer(k: int) -> None:
        for i in range(per_thread):
            with app.transaction() as tx:
                tx.transmit(b"%d-%d" % (k, i), ["site-b"])

    seen = read_while_writing(store, [functools.partial(writer, k) for k in range(n_threads)])
    everything = store.shipping.read_log_entries("site-b", "policy", 0, 10_000)
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


@every_flavour()
def test_writers_with_rollbacks_and_think_times_are_read_once_in_commit_order(
    store: SQLAlchemyQueueStore, make_app: Callable[..., App]
) -> None:
    """Concurrent application transactions, some rolled back, with work between transmits.

    A live reader must see every committed entry once and nothing rolled back, and
    a transaction whose COMMIT returned before another's began comes first.
    """
    app_meta.create_all(store.engine)
    store.sites.register_sites(["site-b"])
    app = make_app(store)
    n_writers, per_writer = 5, 24
    txns: list[Txn] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        rng = random.Random(k)
        for i in range(per_writer):
            txn = Txn([b"%d-%d-%d" % (k, i, j) for j in range(rng.randint(1, 3))])
            tx = app.open()
            try:
                tx.execute(insert(app_rows).values(note=f"{k}-{i}"))
                for payload in txn.payloads:
                    tx.transmit(payload, ["site-b"])
                    time.sleep(rng.uniform(0, 0.003))  # the application's own work
                if rng.random() < 0.25:
                    tx.rollback()
                else:
                    txn.commit_started = time.monotonic()
                    tx.commit()
                    txn.commit_returned = time.monotonic()
                    txn.committed = True
            finally:
                tx.close()
            with lock:
                txns.append(txn)

    seen = read_while_writing(store, [functools.partial(writer, k) for k in range(n_writers)])
    committed = [t for t in txns if t.committed]
    assert 0 < len(committed) < len(txns)  # both outcomes happened
    everything = [
        (e.position, e.payload)
        for e in store.shipping.read_log_entries("site-b", "policy", 0, 10_000)
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
            lambda: (
                [e.payload for e in store.shipping.read_log_entries("site-b", "policy", 0, 100)]
                == sent
            ),
            30,
            what="every entry readable while a transaction stays open",
        )
        assert got
    finally:
        idle.rollback()
        idle.close()


def test_transactions_that_conflict_on_a_row_are_delivered_in_commit_order(
    pg_schema: PgSchema,
) -> None:
    """B transmits first; A then updates a row and transmits; B waits for A's row lock.

    Without the product B just waits for A. Transmitting adds no lock, so no
    deadlock, and B's entry, committed after A's, is delivered after it,
    although B transmitted (and got its transaction id) first.
    """
    store = open_store(pg_schema.engine())
    store.create_schema()
    app_meta.create_all(store.engine)
    with store.engine.begin() as conn:
        conn.execute(insert(app_rows).values(id=1, note="start"))
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])
    tag = "txn-b-" + uuid.uuid4().hex[:8]
    b_store = open_store(pg_schema.engine(connect_args={"application_name": tag}))
    b_client = RoutingQueueClient(b_store, source_id="site-a", client_name="policy")

    b_transmitted, a_holds_row = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def txn_b() -> None:
        try:
            with Session(b_store.engine) as b, b.begin():
                b_client.transmit_log_entry_message(b, b"b", ["site-b"])  # B's xid comes first
                b_transmitted.set()
                wait_for(a_holds_row.is_set, 60, what="A's row lock")
                b.execute(update(app_rows).where(app_rows.c.id == 1).values(note="b"))
        except BaseException as exc:  # reported below
            errors.append(exc)
            b_transmitted.set()

    t = threading.Thread(target=txn_b)
    t.start()
    wait_for(b_transmitted.is_set, 60, what="B's transmit")
    a = Session(store.engine)
    a.begin()
    a.execute(update(app_rows).where(app_rows.c.id == 1).values(note="a"))
    client.transmit_log_entry_message(a, b"a", ["site-b"])  # does not wait for B
    a_holds_row.set()
    wait_for(
        lambda: waiting_for_a_lock(pg_schema.admin, tag), 60, what="B waiting for A's row lock"
    )
    a.commit()
    a.close()
    join(t, 60)
    assert errors == []
    read = store.shipping.read_log_entries("site-b", "policy", 0, 10)
    assert [e.payload for e in read] == [b"a", b"b"]
    with store.engine.connect() as conn:
        assert conn.execute(select(app_rows.c.note)).scalar_one() == "b"
    b_store.engine.dispose()


@every_flavour()
@pytest.mark.parametrize("n", [1, 3], ids=["single", "batch"])
def test_savepoints_keep_a_transactions_entries_dense_and_in_order(
    store: SQLAlchemyQueueStore, make_app: Callable[..., App], n: int
) -> None:
    """Entries rolled back to a savepoint leave no gap and no stamp of their own."""
    store.sites.register_sites(["site-b"])
    app = make_app(store)

    def send(tx: Tx, name: str) -> list[EntryRef]:
        payloads = [f"{name}.{i}".encode() for i in range(n)]
        if n == 1:
            return [tx.transmit(payloads[0], ["site-b"])]
        return tx.transmit_many([LRMessageWithDestinations(p, ["site-b"]) for p in payloads])

    with app.transaction() as tx:
        with tx.undone():  # the first entries of the transaction, undone
            send(tx, "undone-1")
        kept = send(tx, "k1")
        with tx.undone():
            send(tx, "undone-2")
        kept += send(tx, "k2")
    got = app.positions_of(kept)
    read = store.shipping.read_log_entries("site-b", "policy", 0, 10)
    expected = [f"{k}.{i}".encode() for k in ("k1", "k2") for i in range(n)]
    assert [(e.position, e.payload) for e in read] == list(zip(got, expected, strict=True))
    assert got == list(range(got[0] or 0, (got[0] or 0) + 2 * n))  # dense: nothing between
    assert store.send.head_position() == got[-1]


# -- a property: random interleavings of transactions on several connections ----------------
@pytest.fixture
def shared_pg_store(pg_schema: PgSchema) -> Iterator[SQLAlchemyQueueStore]:
    """One PostgreSQL store for every generated example (each uses a client of its own)."""
    store = open_store(pg_schema.engine())
    store.create_schema()
    store.sites.register_sites(["site-b"])
    assert isinstance(store, SQLAlchemyQueueStore)
    yield store


CONNS = 3
EXAMPLES = int(os.environ.get("LR_COMMIT_ORDER_EXAMPLES", "40"))

steps = st.lists(
    st.one_of(
        st.tuples(st.just("transmit"), st.integers(0, CONNS - 1), st.integers(1, 3)),
        st.tuples(st.just("commit"), st.integers(0, CONNS - 1)),
        st.tuples(st.just("rollback"), st.integers(0, CONNS - 1)),
        st.tuples(st.just("undone"), st.integers(0, CONNS - 1)),  # transmit, roll a savepoint back
        st.tuples(st.just("read"), st.integers(1, 4)),
    ),
    max_size=40,
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=steps)
def test_any_interleaving_reads_each_committed_entry_once_in_commit_order(
    shared_pg_store: SQLAlchemyQueueStore, program: list[tuple[object, ...]]
) -> None:
    """Begin / transmit / commit / rollback / read on three connections, in any order.

    After every read the reader, following a cursor with small batches, has
    seen exactly the entries committed so far, each once, in commit order.
    """
    store = shared_pg_store
    client_name = "c" + uuid.uuid4().hex[:10]
    client = RoutingQueueClient(store, source_id="site-a", client_name=client_name)
    conns = [store.engine.connect() for _ in range(CONNS)]
    pending: list[list[bytes]] = [[] for _ in range(CONNS)]
    committed: list[bytes] = []
    seen: list[bytes] = []
    cursor, n = 0, 0
    try:
        for step in program:
            kind = step[0]
            if kind in ("transmit", "undone"):
                i = int(step[1])  # type: ignore[call-overload]
                conn = conns[i]
                if not conn.in_transaction():
                    conn.begin()
                if kind == "undone":
                    sp = conn.begin_nested()
                    client.transmit_log_entry_message(conn, b"undone", ["site-b"])
                    sp.rollback()
                    continue
                count = int(step[2])  # type: ignore[call-overload]
                payloads = [b"%d" % (n + k + 1) for k in range(count)]
                n += count
                if count == 1:  # one entry, or a batch (its ordinals reserved at once)
                    client.transmit_log_entry_message(conn, payloads[0], ["site-b"])
                else:
                    client.transmit_log_entry_messages(
                        conn, [LRMessageWithDestinations(p, ["site-b"]) for p in payloads]
                    )
                pending[i].extend(payloads)
            elif kind in ("commit", "rollback"):
                i = int(step[1])  # type: ignore[call-overload]
                if conns[i].in_transaction():
                    if kind == "commit":
                        conns[i].commit()
                        committed.extend(pending[i])
                    else:
                        conns[i].rollback()
                pending[i] = []
            else:
                while True:
                    batch = store.shipping.read_log_entries(
                        "site-b", client_name, cursor, int(step[1])
                    )  # type: ignore[call-overload]
                    if not batch:
                        break
                    seen.extend(e.payload for e in batch)
                    cursor = batch[-1].position
                assert seen == committed
        for i, c in enumerate(conns):  # the open ones commit, in turn
            if c.in_transaction():
                c.commit()
                committed.extend(pending[i])
        seen.extend(
            e.payload for e in store.shipping.read_log_entries("site-b", client_name, cursor, 1000)
        )
        assert seen == committed
        assert (
            store.shipping.read_log_entries("site-b", client_name, 0, 1000) != [] or committed == []
        )
    finally:
        for c in conns:
            c.close()


def test_transaction_ids_that_went_back_do_not_stop_sequencing(pg_schema: PgSchema) -> None:
    """A database restored from a logical dump: its last tick saw higher transaction ids.

    Without a guard every new commit stamp would be taken for one already
    sequenced, and nothing would be delivered again.
    """
    store, client = pg_source(pg_schema)
    with store.engine.begin() as conn:
        before = client.transmit_log_entry_message(conn, b"before", ["site-b"])
    (first,) = client.positions_of([before])
    with store.engine.begin() as conn:  # as the dump recorded it, from a busier cluster
        conn.execute(text("UPDATE lrq_send_ticks SET snap = '900000000:900000000:'"))
    with store.engine.begin() as conn:
        after = client.transmit_log_entry_message(conn, b"after", ["site-b"])
    assert client.positions_of([after]) == [(first or 0) + 1]
    read = store.shipping.read_log_entries("site-b", "policy", 0, 10)
    assert [e.payload for e in read] == [b"before", b"after"]
    with store.engine.begin() as conn:  # and the next ticks follow the new snapshot
        later = client.transmit_log_entry_message(conn, b"later", ["site-b"])
    assert client.positions_of([later]) == [(first or 0) + 2]


def test_a_search_path_changed_before_commit_still_stamps_the_queue(pg_schema: PgSchema) -> None:
    """The commit stamp is written at COMMIT, into the queue's own schema, whatever the path."""
    store, client = pg_source(pg_schema)
    with store.engine.begin() as conn:
        ref = client.transmit_log_entry_message(conn, b"x", ["site-b"])
        conn.execute(text("SET LOCAL search_path = pg_catalog"))  # the application's own business
    assert client.positions_of([ref]) == [1]
    assert [e.payload for e in store.shipping.read_log_entries("site-b", "policy", 0, 10)] == [b"x"]
