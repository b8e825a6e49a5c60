"""Trimming keeps exactly what some destination still needs (generated interleavings).

A model tracks, per destination, what it was sent, what it acknowledged, whether it
was dropped and the base of its open snapshot. After every step each destination
still reads exactly the entries it needs; after an unbounded trim nothing else is
left. The run is derandomized (the same examples on every run), and the explicit
examples are the shapes that lose data when the watermark is off by one: an
acknowledgement up to an entry whose next position is tagged for the same
destination.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, text

from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from tests.kit.positions import new_slot, positions

DESTS = ["b", "c", "d"]
CLIENT = "policy"
EXAMPLES = int(os.environ.get("LR_TRIM_EXAMPLES", "120"))

Op = tuple  # type: ignore[type-arg]

ops = st.lists(
    st.one_of(
        # Mostly one or two destinations per entry: runs of entries tagged for one
        # destination are the shape an off-by-one watermark cuts into.
        st.tuples(
            st.just("transmit"),
            st.lists(st.sampled_from(DESTS), min_size=1, max_size=2, unique=True),
        ),
        st.tuples(st.just("transmit"), st.just(DESTS)),
        # Acknowledge up to the n-th pending entry: often not the last one sent.
        st.tuples(st.just("ack"), st.sampled_from(DESTS), st.integers(0, 3)),
        st.tuples(st.just("trim"), st.integers(1, 4), st.sampled_from([1, 3, None])),
        st.tuples(st.just("drop"), st.sampled_from(DESTS)),
        st.tuples(st.just("snapshot"), st.sampled_from(DESTS)),
        # PostgreSQL: what follows goes to another slot (a no-op on SQLite).
        st.tuples(st.just("rotate")),
    ),
    max_size=30,
)


def _reset(store: SQLAlchemyQueueStore) -> None:
    if store.dialect == "postgresql":
        store.retention.rotation_period = 0.0  # a trim closes the current slot
    with store.write() as conn:
        if store.dialect == "postgresql":  # the send log is a view of the sequencer's tables
            for name in ("lrq_send_positions", "lrq_send_entries", "lrq_send_blocks"):
                conn.execute(text(f"DELETE FROM {name}"))
        else:
            conn.execute(delete(s.send_log_entries))
        for table in (s.cursors, s.drops, s.snapshots):
            conn.execute(delete(table))


def run_program(store: SQLAlchemyQueueStore, program: list[Op]) -> None:
    """Run ``program`` against the store and the model, checking after every step."""
    _reset(store)
    nums = store.sites.register_sites(DESTS)
    tagged: dict[str, list[int]] = {d: [] for d in DESTS}  # what each destination was sent
    acked = {d: 0 for d in DESTS}
    dropped: set[str] = set()
    base: dict[str, int] = {}  # the base position of a destination's open snapshot

    def floor(d: str) -> int | None:
        """The position after which ``d`` needs every entry; None: it needs nothing."""
        if d in base:
            return base[d] if d in dropped else min(acked[d], base[d])
        return None if d in dropped else acked[d]

    for op in program:
        if op[0] == "transmit":
            with store.write() as conn:
                (ref,) = store.send.append_log_entries(
                    conn, CLIENT, [(b"x", [nums[d] for d in op[1]])]
                )
            (pos,) = positions(store, [ref])
            for d in op[1]:
                tagged[d].append(pos)
        elif op[0] == "ack":
            d = op[1]
            # a destination acknowledges some prefix of what it was sent
            pending = [p for p in tagged[d] if p > acked[d]]
            if pending and d not in dropped:
                acked[d] = pending[min(op[2], len(pending) - 1)]
                store.shipping.set_cursor(d, CLIENT, acked[d])
        elif op[0] == "trim":
            store.retention.trim(batch_size=op[1], max_batches=op[2])
        elif op[0] == "rotate":
            new_slot(store)
        elif op[0] == "drop":
            store.retention.drop_stream(op[1], CLIENT, "test")
            dropped.add(op[1])
        else:  # a full sync for the destination: requested, then its base fixed
            sid = store.snapshots.request_snapshot(None, op[1], CLIENT, "test")
            started = store.snapshots.start_snapshot(sid)
            if started is None:  # it joined another's full sync, running: that one's base
                started = store.snapshots.get_snapshot(sid, op[1])
            assert started is not None and started.base_position is not None
            base[op[1]] = started.base_position
        for d in DESTS:
            after = floor(d)
            if after is None:
                continue
            needed = [p for p in tagged[d] if p > after]
            got = [e.position for e in store.shipping.read_log_entries(d, CLIENT, after, 1000)]
            assert got == needed, (d, op)
        whole_slots = store.dialect == "postgresql"  # no batch bounds there
        if op[0] == "trim" and (op[2] is None or whole_slots):
            # An unbounded trim leaves exactly the entries someone still needs:
            # on PostgreSQL, and those that share a slot with one.
            needed = {p for d in DESTS if (f := floor(d)) is not None for p in tagged[d] if p > f}
            kept = sorted(_slot_mates(store, needed) if whole_slots else needed)
            assert [e.position for e in store.shipping.read_client_log(CLIENT, 0, 1000)] == kept, op


def _slot_mates(store: SQLAlchemyQueueStore, positions: set[int]) -> set[int]:
    """The stored positions that share a send queue slot with one of ``positions``."""
    with store.read() as conn:
        rows = conn.execute(text("SELECT position, slot FROM lrq_send_positions")).all()
    slots = {slot for position, slot in rows if position in positions}
    return {position for position, slot in rows if slot in slots}


# The dangerous shapes, always run: the first unacknowledged entry of a destination
# directly follows its acknowledged one.
@example(  # a full sync asked while another destination's runs joins it, and its base
    [("transmit", DESTS), ("snapshot", "b"), ("ack", "c", 0), ("snapshot", "c")]
)
@example([("transmit", ["b"]), ("transmit", ["b"]), ("ack", "b", 0), ("trim", 4, None)])
@example(
    [
        ("transmit", ["b", "c"]),
        ("transmit", ["b"]),
        ("transmit", ["c"]),
        ("ack", "b", 0),
        ("ack", "c", 0),
        ("trim", 1, None),
    ]
)
@example(
    [
        ("transmit", ["b"]),
        ("transmit", ["c"]),
        ("transmit", ["b"]),
        ("ack", "c", 0),
        ("ack", "b", 0),
        ("trim", 2, 1),
        ("trim", 2, None),
    ]
)
@example(  # an open snapshot's base pins the entries after it, acknowledged or not
    [
        ("transmit", ["b"]),
        ("snapshot", "b"),
        ("transmit", ["b"]),
        ("transmit", ["b"]),
        ("ack", "b", 1),
        ("trim", 4, None),
    ]
)
@example(  # a dropped destination needs nothing, also what was sent after the drop
    [
        ("transmit", DESTS),
        ("drop", "c"),
        ("transmit", ["c"]),
        ("transmit", ["b", "c"]),
        ("ack", "b", 3),
        ("ack", "d", 0),
        ("trim", 1, None),
    ]
)
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops)
def test_trim_keeps_exactly_the_needed_entries(
    store: SQLAlchemyQueueStore, program: list[Op]
) -> None:
    run_program(store, program)
