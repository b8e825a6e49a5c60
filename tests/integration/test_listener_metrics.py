"""The sink's delivery metrics around the application's listener (``lr_client.listener_metrics``):
a real subscriber delivering from a real store, on both backends."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.listener_metrics import ListenerMetrics, MeteredListener
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore


class Scripted(RoutingQueueListener):
    """Answers each batch as ``next`` says: "accept", "refuse" or "raise"."""

    def __init__(self) -> None:
        self.next = "accept"
        self.got: list[int] = []
        self.starts: list[tuple[str, str]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        if self.next == "raise":
            raise RuntimeError("the application's table is locked")
        if self.next == "refuse":
            return False
        self.got += [m.source_position for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.starts.append((source_id, snapshot_id))  # the older signature: no base_position

    def on_error(self, error: BaseException) -> None:
        pass


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_batches_by_outcome_entries_and_apply_time(store: SQLAlchemyQueueStore) -> None:
    store.recv.apply_log_batch(
        "site-a", "policy", [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"x") for p in (1, 2, 3)]
    )
    registry = CollectorRegistry()
    app = Scripted()
    subscriber = RoutingQueueSubscriber(
        store,
        "policy",
        ListenerMetrics(registry).wrap(app),
        retry_initial=0.0,
        retry_max=0.0,
        retry_jitter=0.0,
        wake_on_arrival=False,
    )
    labels = {"client": "policy", "source": "site-a", "kind": "log"}
    batches = "lr_sink_listener_batches_total"
    for outcome in ("raise", "refuse"):
        app.next = outcome
        assert subscriber.poll_once() == 0 and app.got == []
    app.next = "accept"
    assert subscriber.poll_once() == 3 and app.got == [1, 2, 3]
    assert value(registry, batches, **labels, outcome="failed") == 1
    assert value(registry, batches, **labels, outcome="refused") == 1
    assert value(registry, batches, **labels, outcome="accepted") == 1
    assert value(registry, "lr_sink_listener_entries_total", **labels) == 3
    assert value(registry, "lr_sink_apply_seconds_count", **labels) == 3
    assert value(registry, "lr_sink_apply_seconds_sum", **labels) > 0.0


def test_the_other_callbacks_reach_the_inner_listener_as_it_takes_them() -> None:
    app = Scripted()
    metered = MeteredListener(app, ListenerMetrics(CollectorRegistry()))
    metered.on_full_sync_start(None, "site-a", "snap-1", base_position=7)  # type: ignore[arg-type]
    assert app.starts == [("site-a", "snap-1")]
    with pytest.raises(RuntimeError):
        app.next = "raise"
        metered.process_log_entries(None, "site-a", [])  # type: ignore[arg-type]
