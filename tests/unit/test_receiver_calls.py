"""The receiver's call limits: the tracker's rules, and their config keys."""

from __future__ import annotations

from typing import Any

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import ConfigError
from lr_server.config import ReceiverConfig, parse_config
from lr_server.transport.calls import CallLimitError, CallTracker
from lr_server.transport.grpc_server import LogReplicationService, method_handlers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Cancels:
    """Records which calls were cancelled, in order."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def of(self, name: str) -> Any:
        return lambda: self.cancelled.append(name)


def test_a_sources_newest_call_cancels_its_oldest_beyond_the_cap() -> None:
    cancels = Cancels()
    tracker = CallTracker(max_calls=10, per_source=2, idle_timeout=5.0)
    a1 = tracker.admit("a", "Replicate", cancels.of("a1"))
    tracker.admit("b", "Replicate", cancels.of("b1"))
    a2 = tracker.admit("a", "Negotiate", cancels.of("a2"))
    assert cancels.cancelled == []
    a3 = tracker.admit("a", "Replicate", cancels.of("a3"))
    assert cancels.cancelled == ["a1"]
    assert tracker.open_calls("a") == [a2, a3]
    tracker.release(a1)  # the cancelled call's own end changes nothing
    tracker.release(a2)
    tracker.admit("a", "Replicate", cancels.of("a4"))
    assert cancels.cancelled == ["a1"]  # a2 had ended: room without cancelling a3
    assert [c.source for c in tracker.open_calls()] == ["b", "a", "a"]


def test_the_bound_refuses_one_more_call_and_frees_on_release() -> None:
    cancels = Cancels()
    tracker = CallTracker(max_calls=2, per_source=4, idle_timeout=5.0)
    a = tracker.admit("a", "Replicate", cancels.of("a"))
    tracker.admit("b", "Replicate", cancels.of("b"))
    with pytest.raises(CallLimitError, match="max_concurrent_calls"):
        tracker.admit("c", "Replicate", cancels.of("c"))
    tracker.release(a)
    assert tracker.admit("c", "Replicate", cancels.of("c")).source == "c"
    assert cancels.cancelled == []


def test_at_the_bound_a_source_at_its_cap_still_replaces_its_oldest() -> None:
    cancels = Cancels()
    tracker = CallTracker(max_calls=2, per_source=1, idle_timeout=5.0)
    tracker.admit("a", "Replicate", cancels.of("a1"))
    tracker.admit("b", "Replicate", cancels.of("b1"))
    tracker.admit("a", "Negotiate", cancels.of("a2"))  # a restart of a: not refused
    assert cancels.cancelled == ["a1"]
    assert [c.source for c in tracker.open_calls()] == ["b", "a"]


def test_only_calls_waiting_past_the_idle_timeout_are_cancelled() -> None:
    clock = Clock()
    cancels = Cancels()
    tracker = CallTracker(max_calls=10, per_source=4, idle_timeout=5.0, clock=clock)
    stream = tracker.admit("a", "Replicate", cancels.of("stream"))  # never "waiting"
    slow = tracker.admit("a", "Negotiate", cancels.of("slow"))
    quick = tracker.admit("b", "Negotiate", cancels.of("quick"))
    with tracker.waiting(quick):
        clock.now += 4.9
    with tracker.waiting(slow):
        clock.now += 4.9
        assert tracker.expire_idle() == []
        clock.now += 0.1
        assert tracker.expire_idle() == [slow]
    assert cancels.cancelled == ["slow"]
    assert tracker.open_calls() == [stream, quick]
    clock.now += 3600
    assert tracker.expire_idle() == []


def test_receiver_defaults_and_errors_naming_the_key() -> None:
    base: dict[str, Any] = {"site": {"id": "a", "database_url": "sqlite://"}}
    base["security"] = {"transport": "plaintext", "client_auth": "token"}
    assert parse_config(base).receiver == ReceiverConfig(256, 4, 10.0)
    tuned = parse_config(
        {
            **base,
            "receiver": {
                "max_concurrent_calls": 1000,
                "max_calls_per_source": 2,
                "idle_call_timeout": 2,
            },
        }
    )
    assert tuned.receiver == ReceiverConfig(1000, 2, 2.0)
    for key, value in [
        ("max_concurrent_calls", 0),
        ("max_concurrent_calls", "many"),
        ("max_calls_per_source", -1),
        ("idle_call_timeout", 0),
        ("idle_call_timeout", -1.0),
        ("idle_calls", 3),
    ]:
        with pytest.raises(ConfigError, match=rf"^receiver\.{key}:"):
            parse_config({**base, "receiver": {key: value}})


def test_every_method_is_served_as_a_client_stream() -> None:
    """So that each handler runs, and authenticates, before the caller's first message."""
    service = LogReplicationService(None, None, CallTracker(1, 1, 1.0))  # type: ignore[arg-type]
    handlers = method_handlers(service)
    declared = [m.name for m in pb.DESCRIPTOR.services_by_name["LogReplication"].methods]
    assert sorted(handlers) == sorted(declared) == ["Cascade", "Negotiate", "Replicate"]
    assert all(h.request_streaming for h in handlers.values())
    assert [n for n, h in sorted(handlers.items()) if h.response_streaming] == ["Replicate"]


def test_a_drain_waits_for_the_handlers_still_serving_then_refuses_new_work() -> None:
    """A cancelled call's handler may still be applying a batch when gRPC has stopped:
    the server closes its store only after the drain, and nothing enters after it."""
    import threading

    from lr_client.errors import StoreUnavailableError

    tracker = CallTracker(max_calls=10, per_source=2, idle_timeout=5.0)
    inside, leave = threading.Event(), threading.Event()

    def handler() -> None:
        with tracker.working():
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=handler)
    t.start()
    assert inside.wait(30)
    assert tracker.drain(0.05) is False  # still inside
    # Closed for new work meanwhile.
    with pytest.raises(StoreUnavailableError), tracker.working():
        pass
    leave.set()
    assert tracker.drain(30) is True
    t.join(30)
