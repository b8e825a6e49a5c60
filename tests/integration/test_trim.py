"""Trim and retention on SQLite and PostgreSQL: the exact shapes where data is lost.

Each test names its positions and checks which entries remain, by position, after
an unbounded trim: what a destination still needs stays, the rest goes.
"""

from __future__ import annotations

from lr_client.store import SQLAlchemyQueueStore

CLIENT = "policy"


def send(store: SQLAlchemyQueueStore, *destinations: list[str]) -> list[int]:
    """Transmit one entry per list of destinations; their positions."""
    nums = store.register_sites(sorted({d for ds in destinations for d in ds}))
    with store.write() as conn:
        return store.append_log_entries(
            conn, CLIENT, [(b"%d" % i, [nums[d] for d in ds]) for i, ds in enumerate(destinations)]
        )


def left(store: SQLAlchemyQueueStore) -> list[int]:
    return [e.position for e in store.read_client_log(CLIENT, 0, 1000)]


def reads(store: SQLAlchemyQueueStore, destination: str, after: int) -> list[int]:
    return [e.position for e in store.read_log_entries(destination, CLIENT, after, 1000)]


def test_the_first_unacknowledged_entry_survives_the_trim(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b"], ["b"], ["b"])
    store.set_cursor("b", CLIENT, p[0])  # b has the first; the next one is b's too
    store.trim()
    assert left(store) == p[1:]
    assert reads(store, "b", p[0]) == p[1:]
    store.set_cursor("b", CLIENT, p[1])
    store.trim(batch_size=1)
    assert left(store) == p[2:]


def test_an_entry_is_trimmed_only_once_every_destination_acknowledged_it(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b", "c"], ["b", "c"], ["c"], ["b"])
    store.set_cursor("b", CLIENT, p[0])
    store.set_cursor("c", CLIENT, p[1])
    store.trim()
    assert left(store) == p[1:]  # p1 waits for b, p2 for c, p3 for b
    assert reads(store, "b", p[0]) == [p[1], p[3]]
    assert reads(store, "c", p[1]) == [p[2]]
    store.set_cursor("b", CLIENT, p[3])
    store.trim()
    assert left(store) == [p[2]]
    store.set_cursor("c", CLIENT, p[2])
    store.trim()
    assert left(store) == []


def test_a_destination_without_a_cursor_keeps_everything_it_was_sent(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b"], ["b", "c"], ["c"])
    store.set_cursor("b", CLIENT, p[1])
    store.trim()
    assert left(store) == p[1:]
    assert reads(store, "c", 0) == p[1:]


def test_trim_keeps_what_an_open_snapshots_base_needs(store: SQLAlchemyQueueStore) -> None:
    before = send(store, ["b"], ["b"])
    sid = store.request_snapshot(None, "b", CLIENT, "test")
    store.set_cursor("b", CLIENT, before[-1])
    store.trim()
    assert left(store) == []  # a request without a base pins nothing
    started = store.start_snapshot(sid)
    assert started is not None and started.base_position == before[-1]
    after = send(store, ["b"], ["b"], ["b"])
    store.set_cursor("b", CLIENT, after[-1])  # the sink acknowledges them meanwhile
    store.trim()
    # After the snapshot, log entries resume from its base: they must still be there.
    assert left(store) == after
    assert reads(store, "b", before[-1]) == after
    store.finish_snapshot(sid)  # READY: still open
    store.trim()
    assert left(store) == after
    store.complete_snapshot(sid)  # done: the cursor alone counts again
    store.trim()
    assert left(store) == []


def test_an_open_snapshots_base_pins_only_its_own_stream(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b", "c"], ["b", "c"])
    sid = store.request_snapshot(None, "b", CLIENT, "test")
    started = store.start_snapshot(sid)
    assert started is not None and started.base_position == p[1]
    q = send(store, ["b", "c"], ["c"])
    store.set_cursor("b", CLIENT, q[0])
    store.set_cursor("c", CLIENT, q[1])
    store.trim()
    assert left(store) == [q[0]]  # b needs what follows its base; c needs nothing more


def test_a_dropped_stream_releases_its_retention(store: SQLAlchemyQueueStore) -> None:
    p = send(store, ["b", "c"], ["c"], ["c"])
    store.set_cursor("b", CLIENT, p[0])
    assert store.drop_stream("c", CLIENT, "too far behind") is not None
    store.trim()
    assert left(store) == []  # only c needed them
    # What is sent to the dropped stream afterwards waits for nobody either,
    q = send(store, ["c"], ["b", "c"])
    store.set_cursor("b", CLIENT, q[1])
    store.trim()
    assert left(store) == []
    # until its full sync fixes a base: from there the stream needs its entries again.
    sid = store.request_snapshot(None, "c", CLIENT, "dropped")
    started = store.start_snapshot(sid)
    assert started is not None and started.base_position == q[1]
    r = send(store, ["c"], ["b"])
    store.set_cursor("b", CLIENT, r[1])
    store.trim()
    assert left(store) == [r[0]]
    assert reads(store, "c", q[1]) == [r[0]]


def test_a_drop_during_an_open_snapshot_keeps_what_follows_its_base(
    store: SQLAlchemyQueueStore,
) -> None:
    p = send(store, ["b"])
    sid = store.request_snapshot(None, "b", CLIENT, "test")
    started = store.start_snapshot(sid)
    assert started is not None and started.base_position == p[0]
    q = send(store, ["b"], ["b", "c"])
    assert store.drop_stream("b", CLIENT, "over retention") is not None
    store.set_cursor("c", CLIENT, q[1])
    store.trim()
    # The snapshot still resumes log entries after its base: nothing after it is lost.
    assert reads(store, "b", p[0]) == q
    assert left(store) == q
