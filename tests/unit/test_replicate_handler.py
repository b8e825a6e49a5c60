"""The sink's Replicate handler: what it holds while its acknowledgement is out."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

from lr_client._proto import replication_pb2 as pb
from lr_server.transport.calls import CallTracker
from lr_server.transport.grpc_server import LogReplicationService


class Batch:
    """Stands for a received ``ReplicationBatch`` (a protobuf message allows no weak reference)."""


class Receiver:
    """Applies nothing; remembers each batch by a weak reference only."""

    def __init__(self) -> None:
        self.seen: list[weakref.ref[Batch]] = []

    def apply(self, source_id: str, batch: Batch) -> pb.ReplicationAck:
        self.seen.append(weakref.ref(batch))
        return pb.ReplicationAck(batch_id=len(self.seen))


class Auth:
    def identify(self, context: Any) -> str:
        return "a"


class Context:
    def cancel(self) -> None:
        raise AssertionError("not cancelled here")

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return True

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {details}")


def test_a_batch_is_released_before_its_acknowledgement_goes_out() -> None:
    """Regression: the handler kept the last batch until the next one had arrived, so a
    sink held one batch more than its memory bound counts while the source sent more."""
    receiver = Receiver()
    calls = CallTracker(max_calls=4, per_source=2, idle_timeout=5.0)
    service = LogReplicationService(receiver, Auth(), calls)

    def requests() -> Iterator[Batch]:  # only the handler holds what it yields
        yield Batch()
        yield Batch()

    acks = service.Replicate(requests(), Context())
    assert next(acks).batch_id == 1  # the handler waits at its first acknowledgement
    assert receiver.seen[0]() is None
    assert next(acks).batch_id == 2
    assert receiver.seen[1]() is None
    assert next(acks, None) is None
    assert calls.open_calls() == []  # the call ended with its stream
