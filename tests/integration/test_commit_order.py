"""Invariant I1: no committed entry is ever skipped by a reader.

Two real connections: a long transaction transmits first (so it would get
the earlier position), a short one transmits and commits, the reader reads,
then the long one commits and the reader reads again.
"""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import open_store
from tests.conftest import PgSchema
from tests.kit.wait import join, wait_for


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
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        cursor = 0
        while True:
            done = stop.is_set()
            batch = store.read_log_entries("site-b", "policy", cursor, 1000)
            seen.extend(e.position for e in batch)
            if batch:
                cursor = batch[-1].position
            elif done:
                return

    def writer(k: int) -> None:
        for i in range(per_thread):
            with Session(store.engine) as session, session.begin():
                client.transmit_log_entry_message(session, b"%d-%d" % (k, i), ["site-b"])

    r = threading.Thread(target=reader)
    r.start()
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(n_threads)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    r.join()
    everything = store.read_log_entries("site-b", "policy", 0, 10_000)
    # The live reader saw every committed entry once, in position order.
    assert seen == [e.position for e in everything]
    payloads = [e.payload for e in everything]
    assert sorted(payloads) == sorted(
        b"%d-%d" % (k, i) for k in range(n_threads) for i in range(per_thread)
    )
    for k in range(n_threads):  # each writer's entries in the order it committed them
        mine = [p for p in payloads if p.startswith(b"%d-" % k)]
        assert mine == [b"%d-%d" % (k, i) for i in range(per_thread)]
