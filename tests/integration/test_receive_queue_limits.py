"""A sink's bounded receive queue: full, it refuses log batches (retryable); drained, it takes
them again, with nothing lost or applied twice. In-process sites over real gRPC on
loopback, each backend."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.errors import ConfigError, ReceiveQueueFullError
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server import metrics, parse_config
from lr_server.config import ClientConfig, RetryConfig
from lr_server.receiving.limits import ReceiveLimits
from lr_server.receiving.receiver import Receiver
from lr_server.sending.session import SenderSession
from lr_server.transport.inproc import InProcessTransport
from tests.kit.positions import new_slot
from tests.kit.sites import Sites, wait_for

LOG = ReplicationType.LOG_ENTRY_SYNC


class Positions(RoutingQueueListener):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.seen += [m.source_position for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        raise AssertionError("no full sync here")


def full() -> float | None:
    return REGISTRY.get_sample_value("lr_receive_queue_full", {"source": "a", "client": "policy"})


def test_a_full_receive_queue_refuses_batches_and_resumes_once_drained(sites: Sites) -> None:
    # The gauge is the process's: a test run before in this process may have left it at 1.
    metrics.RECEIVE_QUEUE_FULL.labels("a", "policy").set(0)
    sites.start("b", sources=["a"], client_options="receive_queue_max_entries = 3")
    src = sites.store("a")
    src.sites.register_sites(["b"])
    sender = RoutingQueueClient(src, source_id="a", client_name="policy")
    for i in range(10):
        new_slot(src)
        with src.engine.begin() as conn:
            sender.transmit_log_entry_message(conn, b"%d" % i, ["b"])
    sites.start("a", dests=["b"], replication="batch_max_entries = 2")
    wait_for(lambda: full() == 1, timeout=30)
    sink = sites.store("b")
    (queue,) = sink.queues.list_queues("policy")
    assert 3 <= sink.queues.queue_depth(queue.queue_id) <= 4  # the limit, plus at most one batch
    wait_for(
        lambda: any(
            "receive queue is full" in s["last_error"] for s in src.inspection.list_session_status()
        ),
        timeout=30,
    )  # what lr status shows at the source
    assert src.shipping.get_cursor("b", "policy").position < 10  # the source holds the rest back
    listener = Positions()
    with RoutingQueueSubscriber(sink, "policy", listener) as sub:

        def all_delivered() -> bool:
            sub.poll_once()
            return len(listener.seen) >= 10

        wait_for(all_delivered, timeout=60)
    assert listener.seen == list(range(1, 11))  # in order, nothing lost or twice
    wait_for(lambda: src.shipping.get_cursor("b", "policy").position == 10, timeout=30)
    assert full() == 0


def test_limits_are_per_client_validated_and_checked_on_entries_and_bytes(
    store: SQLAlchemyQueueStore,
) -> None:
    raw = {
        "site": {"id": "b", "database_url": "sqlite://"},
        "security": {"transport": "plaintext"},
        "clients": [
            {"name": "policy", "receive_queue_max_bytes": 10},
            {"name": "other"},
        ],
    }
    limits = ReceiveLimits.from_config(store.heads, parse_config(raw))
    assert limits.limits == {"policy": (0, 10)}
    limits.check("a", "policy")  # empty: takes batches
    limits.check("a", "other")  # no limit
    store.recv.apply_log_batch(
        "a", "policy", [WireEntry(1, ReplicationType.LOG_ENTRY_SYNC, b"x" * 10)]
    )
    with pytest.raises(ReceiveQueueFullError, match="receive queue is full"):
        limits.check("a", "policy")
    bad = {**raw, "clients": [{"name": "policy", "receive_queue_max_entries": -1}]}
    with pytest.raises(ConfigError, match="receive_queue_max_entries"):
        parse_config(bad)


class Waits(threading.Event):
    """A stop event that records the session's waits and sets itself after ``n``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.waits = n, list[float]()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        if len(self.waits) >= self.n:
            self.set()
        return self.is_set()


def test_a_source_waits_longer_each_time_a_full_queue_refuses_it(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> None:
    sink = open_store(db_url_factory("sink"))
    try:
        sink.recv.apply_log_batch("a", "policy", [WireEntry(p, LOG, b"x") for p in (1, 2, 3)])
        receiver = Receiver(sink, "b", ["a"], limits=ReceiveLimits(sink.heads, {"policy": (3, 0)}))
        transport = InProcessTransport(receiver, "a")
        store.sites.register_sites(["b"])
        sender = RoutingQueueClient(store, source_id="a", client_name="policy")
        for _ in range(4):
            new_slot(store)
            with store.engine.begin() as conn:
                sender.transmit_log_entry_message(conn, b"x", ["b"])
        session = SenderSession(
            store,
            "a",
            "b",
            [ClientConfig("policy")],
            lambda: transport,
            retry=RetryConfig(initial_backoff=0.1, max_backoff=0.5, jitter=0.0),
        )
        stop = Waits(4)
        session.run(stop)
        assert stop.waits == [0.1, 0.2, 0.4, 0.5]  # doubling up to max_backoff
        assert "receive queue is full" in session.last_error
        assert sink.recv.sink_progress("a", "policy").last_position == 3  # nothing stored
    finally:
        sink.engine.dispose()
