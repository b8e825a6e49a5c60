"""The in-flight window: limits, ack matching, cursor coalescing (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_server.config import ClientConfig
from lr_server.sending.streams import ClientStream, Mode, SessionState, summary
from lr_server.sending.window import FLUSH_INTERVAL, InFlight, Window

LOG, SNAP, NOTICE = pb.BATCH_LOG_ENTRY, pb.BATCH_SNAPSHOT, pb.BATCH_DROP_NOTICE


def batch(
    w: Window, client: str, kind: int, last: int, nbytes: int = 10, end: bool = False
) -> InFlight:
    f = InFlight(w.next_batch_id(), client, kind, last, 1, nbytes, 0.0, "s1", end)
    w.add(f)
    return f


# case id, batches in flight, batches / bytes about to be added -> full
LIMITS = [
    ("empty", 0, 0, 0, False),
    ("one short of the batch limit", 2, 0, 0, False),
    ("at the batch limit", 3, 0, 0, True),
    ("the reads would reach the batch limit", 2, 1, 0, True),
    ("at the byte limit", 1, 0, 90, True),
    ("one byte short of the byte limit", 1, 0, 89, False),
]


@pytest.mark.parametrize(
    ("inflight", "batches", "nbytes", "full"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS]
)
def test_full(inflight: int, batches: int, nbytes: int, full: bool) -> None:
    w = Window(max_batches=3, max_bytes=100)
    for i in range(inflight):
        batch(w, "c", LOG, i + 1)
    assert w.full(batches, nbytes) is full


def test_full_without_arguments_counts_only_what_is_in_flight() -> None:
    w = Window(max_batches=2, max_bytes=100)
    w.add(InFlight(w.next_batch_id(), "c", LOG, 1, 1, 99, 0.0))
    assert w.full() is False  # one batch of two, 99 bytes of 100
    w.add(InFlight(w.next_batch_id(), "c", LOG, 2, 1, 0, 0.0))
    assert w.full() is True


def test_the_oldest_batch_gives_the_time_waited() -> None:
    w = Window(10, 10_000)
    for position, sent_at in ((1, 5.0), (2, 7.0)):
        w.add(InFlight(w.next_batch_id(), "c", LOG, position, 1, 10, sent_at))
    assert w.oldest_sent_at() == 5.0
    w.acknowledge(1)
    assert w.oldest_sent_at() == 7.0


def test_an_ack_settles_every_batch_up_to_it() -> None:
    w = Window(10, 10_000)
    a, b, c = (batch(w, "c", LOG, p) for p in (1, 2, 3))
    assert (len(w), w.nbytes, w.oldest_sent_at()) == (3, 30, 0.0)
    assert w.holds(a.batch_id) and w.holds(c.batch_id)
    assert w.acknowledge(b.batch_id) == [a, b]
    assert not w.holds(b.batch_id) and w.holds(c.batch_id)
    assert w.acknowledge(b.batch_id) == []  # a duplicate ack settles nothing
    assert w.acknowledge(c.batch_id + 5) == [c]
    assert (len(w), w.oldest_sent_at()) == (0, None)


def test_batch_ids_grow_across_connections() -> None:
    w = Window(10, 10_000)
    first = batch(w, "c", LOG, 1).batch_id
    w.cursors["c"] = 1
    w.clear()
    assert (len(w), w.cursors) == (0, {})
    assert w.next_batch_id() == first + 1


# case id, settled batches (client, kind, last position, is end), cursors before -> after
COALESCE = [
    (
        "log acks: the last one per client",
        [("c", LOG, 3), ("c", LOG, 5), ("d", LOG, 2)],
        {},
        {"c": 5, "d": 2},
    ),
    ("a newer log ack replaces a pending one", [("c", LOG, 7)], {"c": 5}, {"c": 7}),
    ("snapshot batches move no cursor", [("c", SNAP, 3)], {}, {}),
    ("drop notices move no cursor", [("c", NOTICE, 3)], {"c": 2}, {"c": 2}),
    ("a snapshot's end discards earlier log acks", [("c", LOG, 5), ("c", SNAP, 9, True)], {}, {}),
    ("... and pending ones of the client", [("c", SNAP, 9, True)], {"c": 5, "d": 1}, {"d": 1}),
    ("log acks after the end count", [("c", SNAP, 9, True), ("c", LOG, 12)], {"c": 5}, {"c": 12}),
]


@pytest.mark.parametrize(
    ("done", "before", "after"), [c[1:] for c in COALESCE], ids=[c[0] for c in COALESCE]
)
def test_coalesce(
    done: list[tuple[Any, ...]], before: dict[str, int], after: dict[str, int]
) -> None:
    w = Window(10, 10_000)
    w.cursors.update(before)
    settled = [
        InFlight(i, d[0], d[1], d[2], 1, 1, 0.0, "s1", is_end=len(d) > 3 and d[3])
        for i, d in enumerate(done)
    ]
    w.coalesce(settled)
    assert w.cursors == after


def test_cursor_writes_are_coalesced() -> None:
    w = Window(10, 10_000)
    assert not w.flush_due(100.0) and w.flush_in(100.0) is None  # nothing pending
    f = batch(w, "c", LOG, 1)
    batch(w, "c", LOG, 2)
    w.coalesce(w.acknowledge(f.batch_id))
    assert w.flush_due(100.0)  # never flushed yet
    w.flushed(100.0)
    assert (w.cursors, w.flushed_at) == ({}, 100.0)
    w.cursors["c"] = 2
    assert not w.flush_due(100.0 + FLUSH_INTERVAL)  # batches in flight, too soon
    assert w.flush_due(100.0 + FLUSH_INTERVAL + 0.01)
    w.acknowledge(99)
    assert not w.flush_due(100.0 + FLUSH_INTERVAL)  # the window is empty: not sooner
    assert w.flush_in(100.0) == pytest.approx(FLUSH_INTERVAL + 0.001)
    assert w.flush_in(100.0 + 2 * FLUSH_INTERVAL) == 0.0
    batch(w, "c", LOG, 3)
    w.flushed(0.0)
    w.cursors["c"] = 3
    assert not w.flush_due(FLUSH_INTERVAL)  # exactly the interval: not yet
    assert w.flush_due(FLUSH_INTERVAL * 1.01)


# case id, modes of the streams -> session state
SUMMARIES = [
    ("all in log entry sync", [Mode.LOG, Mode.LOG], SessionState.LOG_ENTRY_SYNC),
    ("no streams", [], SessionState.LOG_ENTRY_SYNC),
    ("one stopped", [Mode.LOG, Mode.STOPPED], SessionState.STREAM_STOPPED),
    ("a snapshot wins over a stop", [Mode.STOPPED, Mode.SNAPSHOT], SessionState.SNAPSHOT_SYNC),
]


@pytest.mark.parametrize(
    ("modes", "state"), [c[1:] for c in SUMMARIES], ids=[c[0] for c in SUMMARIES]
)
def test_summary(modes: list[Mode], state: SessionState) -> None:
    streams = [
        ClientStream(
            ClientConfig(f"c{i}"), mode=m, stop_reason=f"c{i}: lost" if m is Mode.STOPPED else ""
        )
        for i, m in enumerate(modes)
    ]
    got, stopped = summary(streams)
    assert got is state
    assert stopped == "; ".join(cs.stop_reason for cs in streams if cs.mode is Mode.STOPPED)
    assert got == state.value  # written to lrq_session_status as the plain string


# -- lanes: several streams, each with its own window and cumulative acks ---------------
def lane_batch(
    w: Window, client: str, lane: int, entries: int, low_water: int = 0, nbytes: int = 10
) -> InFlight:
    f = InFlight(
        w.next_batch_id(), client, LOG, 0, entries, nbytes, 0.0, lane=lane, low_water=low_water
    )
    w.add(f)
    return f


def test_an_ack_settles_the_batches_of_its_own_stream_only() -> None:
    w = Window(max_batches=4, max_bytes=1000, streams=2, batch_entries=10)
    a1, b1, a2, snap = (
        lane_batch(w, "c", 1, 10),
        lane_batch(w, "c", 2, 10),
        lane_batch(w, "c", 1, 10),
        batch(w, "c", SNAP, 1),  # lane 0: the first stream, as lane 1
    )
    assert [f.stream for f in (a1, b1, a2, snap)] == [0, 1, 0, 0]
    assert w.acknowledge(a2.batch_id, 0) == [a1, a2]  # not b1, though its id is lower
    assert list(w.batches) == [b1, snap]
    assert w.acknowledge(snap.batch_id, 1) == [b1]
    assert w.acknowledge(snap.batch_id, 0) == [snap]


def test_a_lanes_window_counts_full_batches_worth_of_entries() -> None:
    w = Window(max_batches=2, max_bytes=1000, streams=2, batch_entries=10)
    lane_batch(w, "c", 1, 10)
    for _ in range(3):
        lane_batch(w, "c", 2, 3)  # short batches: 9 entries, under 2 x 10
    assert not w.stream_full(1)
    lane_batch(w, "c", 1, 10)
    assert w.stream_full(0) and not w.stream_full(1)
    assert not w.full()  # 5 batches, but 29 entries of the 40 both streams allow
    assert w.full(batches=2)  # with 2 more (full) batches about to be sent: 49


def test_each_streams_window_and_the_whole_one_are_full_at_their_limits_exactly() -> None:
    w = Window(max_batches=2, max_bytes=100, streams=2, batch_entries=10)
    lane_batch(w, "c", 1, 1, nbytes=99)
    assert not w.stream_full(0) and not w.full()
    lane_batch(w, "c", 1, 1, nbytes=1)  # stream 0 at its 100 bytes
    assert w.stream_full(0) and not w.stream_full(1)
    assert not w.full(nbytes=99) and w.full(nbytes=100)  # both streams' 200 bytes
    w = Window(max_batches=2, max_bytes=1000, streams=2, batch_entries=10)
    lane_batch(w, "c", 2, 19)
    assert not w.stream_full(1)
    lane_batch(w, "c", 2, 1)  # 20 entries: two full batches' worth
    assert w.stream_full(1) and not w.stream_full(0)
    assert not w.full(batches=1) and w.full(batches=2)  # 20 + 10 of 40, 20 + 20 of 40
    plain = Window(max_batches=2, max_bytes=1000, streams=3)  # counted in batches
    for lane in (1, 2, 3, 3):
        lane_batch(plain, "c", lane, 1)
    assert plain.stream_full(2) and not plain.stream_full(1)
    assert not plain.full(batches=1) and plain.full(batches=2)  # 4 + 2 of 2 x 3


def test_busy_tells_a_clients_batches_and_lane_batches_apart() -> None:
    w = Window(max_batches=4, max_bytes=1000, streams=2)
    batch(w, "c", SNAP, 1)
    assert w.busy("c") and not w.busy("c", lanes_only=True) and not w.busy("d")
    lane_batch(w, "c", 2, 1)
    assert w.busy("c", lanes_only=True)


def test_lane_batches_leave_the_cursor_to_the_session() -> None:
    w = Window(max_batches=4, max_bytes=1000, streams=2)
    f = lane_batch(w, "c", 1, 1, low_water=7)
    w.coalesce(w.acknowledge(f.batch_id, 0))
    assert w.cursors == {}


def test_lanes_move_acked_only_once_every_batch_of_the_oldest_ranges_is_acknowledged() -> None:
    from lr_server.sending.streams import Lanes

    ls = Lanes.at(2, 5)
    ls.chunks.extend([(10, {1, 2}), (20, {3}), (30, {4, 5})])
    assert not ls.settled(2, 5) and ls.acked == 5
    assert not ls.settled(3, 5) and ls.acked == 5  # range (5, 10] still waits for batch 1
    assert ls.settled(1, 8) and (ls.acked, ls.cursor) == (20, 8)
    assert not ls.settled(4, 8) and ls.acked == 20
    ls.barrier = 5
    ls.settled(5, 20)
    assert (ls.acked, ls.cursor, ls.barrier) == (30, 20, 0)
