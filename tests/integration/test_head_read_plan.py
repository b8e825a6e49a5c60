"""PostgreSQL: a subscriber's head read walks the queue's index in order.

Without statistics (a receive-queue partition filled since its last ANALYZE, as
a large snapshot's is) the planner would read every undelivered entry with a
bitmap scan and sort them all to keep the first batch: each batch of a snapshot
then cost the rest of the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from tests.conftest import PgSchema

pytestmark = pytest.mark.postgres

ENTRIES = 20_000
BATCH = 4000  # the subscriber's snapshot batch
FETCHED = text(
    "SELECT COALESCE(SUM(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
    " WHERE relname LIKE 'lrq\\_recv\\_entries\\_s%'"
)


@pytest.fixture
def pg_store(pg_schema: PgSchema) -> Iterator[SQLAlchemyQueueStore]:
    st = open_store(create_engine(pg_schema.url))
    st.create_schema()
    yield st
    st.engine.dispose()


def test_a_head_read_fetches_its_batch_not_the_whole_queue(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    snap = ReplicationType.SNAPSHOT_SYNC
    for first in range(1, ENTRIES + 1, 5000):
        batch = [WireEntry(p, snap, b"x" * 100, "s1") for p in range(first, first + 5000)]
        pg_store.recv.apply_snapshot_batch("a", "policy", "s1", batch)
    (queue,) = pg_store.queues.list_queues("policy")
    with pg_store.write() as conn:
        before = int(conn.execute(FETCHED).scalar_one())
        head = pg_store.heads.read_head(conn, queue.queue_id, BATCH, 4 * 1024 * 1024)
        fetched = int(conn.execute(FETCHED).scalar_one()) - before
        sort = conn.execute(text("SHOW enable_sort")).scalar_one()
    assert [e.source_position for e in head] == list(range(1, BATCH + 1))
    assert fetched < BATCH + 100, f"{fetched} entries fetched for a read of {BATCH}"
    assert sort == "on"  # the listener's statements are planned as usual
