"""Trimming never deletes an entry some destination still needs (random interleavings)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete

from lr_client.store import SQLAlchemyQueueStore
from lr_client.store import schema as s

DESTS = ["b", "c", "d"]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("transmit"),
            st.lists(st.sampled_from(DESTS), min_size=1, max_size=3, unique=True),
        ),
        st.tuples(st.just("ack"), st.sampled_from(DESTS), st.integers(0, 6)),
        st.tuples(st.just("trim"), st.integers(1, 4)),
        st.tuples(st.just("drop"), st.sampled_from(DESTS)),
    ),
    max_size=40,
)


def _reset(store: SQLAlchemyQueueStore) -> None:
    with store.write() as conn:
        for table in (s.send_log_entries, s.send_tags, s.cursors, s.drops):
            if table.info.get("only") in (None, store.dialect):
                conn.execute(delete(table))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops)
def test_trim_keeps_every_needed_entry(store: SQLAlchemyQueueStore, program: list[tuple]) -> None:  # type: ignore[type-arg]
    _reset(store)
    nums = store.register_sites(DESTS)
    tagged: dict[str, list[int]] = {d: [] for d in DESTS}  # the model: what each dest was sent
    acked = {d: 0 for d in DESTS}
    dropped: set[str] = set()
    for op in program:
        if op[0] == "transmit":
            with store.write() as conn:
                (pos,) = store.append_log_entries(
                    conn, "policy", [(b"x", [nums[d] for d in op[1]])]
                )
            for d in op[1]:
                tagged[d].append(pos)
        elif op[0] == "ack":
            d = op[1]
            # a destination acknowledges some prefix of what it was sent
            pending = [p for p in tagged[d] if p > acked[d]]
            if pending and d not in dropped:
                acked[d] = pending[min(op[2], len(pending) - 1)]
                store.set_cursor(d, "policy", acked[d])
        elif op[0] == "trim":
            store.trim(batch_size=op[1], max_batches=3)
        else:
            store.drop_stream(op[1], "policy", "test")
            dropped.add(op[1])
        for d in DESTS:
            if d in dropped:
                continue
            needed = [p for p in tagged[d] if p > acked[d]]
            got = [e.position for e in store.read_log_entries(d, "policy", acked[d], 1000)]
            assert got == needed, (d, op)
