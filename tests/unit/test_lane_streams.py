"""LaneStreams: a batch goes on its lane's stream; acknowledgements come back with the
index of the stream they came on; a stream's error ends the wait; close ends them all."""

from __future__ import annotations

import queue
import threading

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_server.transport.base import BatchStream
from lr_server.transport.lanes import LaneStreams, stream_index

WAIT = 10.0  # seconds at most for an acknowledgement the test queued


class FakeStream(BatchStream):
    """Keeps what is sent; hands over what the test queues as acknowledgements."""

    def __init__(self) -> None:
        self.sent: list[pb.ReplicationBatch] = []
        self.acks: queue.Queue[pb.ReplicationAck | BaseException] = queue.Queue()
        self.closed = False

    def send(self, batch: pb.ReplicationBatch) -> None:
        self.sent.append(batch)

    def next_ack(self, timeout: float) -> pb.ReplicationAck | None:
        try:
            got = self.acks.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(got, BaseException):
            raise got
        return got

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fakes() -> list[FakeStream]:
    return [FakeStream(), FakeStream(), FakeStream()]


def test_lanes_zero_and_one_share_the_first_stream() -> None:
    assert [stream_index(lane) for lane in range(5)] == [0, 0, 1, 2, 3]


def test_a_batch_travels_on_its_lanes_stream(fakes: list[FakeStream]) -> None:
    lanes = LaneStreams(list(fakes))
    try:
        for lane, batch_id in [(0, 1), (1, 2), (2, 3), (3, 4), (2, 5)]:
            lanes.send(pb.ReplicationBatch(batch_id=batch_id, lane=lane))
        assert [[b.batch_id for b in f.sent] for f in fakes] == [[1, 2], [3, 5], [4]]
    finally:
        lanes.close()


def test_acknowledgements_come_with_the_index_of_their_stream(fakes: list[FakeStream]) -> None:
    lanes = LaneStreams(list(fakes))
    try:
        assert lanes.next_ack_from(0.0) is None  # nothing yet: no wait
        fakes[2].acks.put(pb.ReplicationAck(batch_id=7))
        assert lanes.next_ack_from(WAIT) == (2, pb.ReplicationAck(batch_id=7))
        fakes[0].acks.put(pb.ReplicationAck(batch_id=8))
        assert lanes.next_ack(WAIT) == pb.ReplicationAck(batch_id=8)  # the ack alone
        assert lanes.next_ack(0.05) is None
    finally:
        lanes.close()


def test_a_streams_error_is_raised_by_the_next_wait(fakes: list[FakeStream]) -> None:
    lanes = LaneStreams(list(fakes))
    try:
        fakes[1].acks.put(ConnectionError("lane 2 reset"))
        with pytest.raises(ConnectionError, match="lane 2 reset"):
            lanes.next_ack_from(WAIT)
    finally:
        lanes.close()


def test_an_interrupt_ends_the_wait_with_nothing(fakes: list[FakeStream]) -> None:
    lanes = LaneStreams(list(fakes))
    try:
        lanes.interrupt()
        assert lanes.next_ack_from(WAIT) is None
        lanes.interrupt()
        assert lanes.next_ack(WAIT) is None
        fakes[0].acks.put(pb.ReplicationAck(batch_id=1))
        assert lanes.next_ack_from(WAIT) == (0, pb.ReplicationAck(batch_id=1))
    finally:
        lanes.close()


def test_close_ends_every_stream_and_its_waiter(fakes: list[FakeStream]) -> None:
    before = set(threading.enumerate())
    lanes = LaneStreams(list(fakes))
    waiters = [t for t in threading.enumerate() if t not in before]
    assert sorted(t.name for t in waiters) == [f"lr-lane-acks-{i}" for i in range(3)]
    assert all(t.daemon for t in waiters)  # a waiter never holds the process up
    lanes.close()
    assert [f.closed for f in fakes] == [True, True, True]
    assert not any(t.is_alive() for t in waiters)
