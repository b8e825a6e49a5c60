"""The sink's metrics read from its database (``lr_client.sink_metrics``), on both backends:
the collector an embedded subscriber's application mounts, and ``lr server``'s endpoint."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.errors import StoreUnavailableError
from lr_client.partitioners import HashPartitioner, partition_of
from lr_client.records import ReplicationType, WireEntry
from lr_client.sink_metrics import SinkCollector, sink_registry
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.ops.inspection import SinkBacklog, SinkFailures
from lr_client.store.ops.partition_lags import PartitionLag
from lr_server.ops.metrics_http import serve_metrics
from tests.contract.calls import pass_entries
from tests.kit.ports import reserve_port
from tests.kit.wait import wait_for


def samples(collector: SinkCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def entries(*positions: int) -> list[WireEntry]:
    return [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p) for p in positions]


def test_depth_and_oldest_age_per_client_and_source(store: SQLAlchemyQueueStore) -> None:
    store.recv.apply_log_batch("site-a", "policy", entries(1, 2, 3))
    store.recv.apply_log_batch("site-b", "policy", entries(7))
    store.recv.apply_log_batch("site-a", "orders", entries(4))
    (arrived,) = [b.oldest_received_at for b in store.inspection.sink_backlogs("orders")]
    first = min(
        b.oldest_received_at or arrived or 0.0 for b in store.inspection.sink_backlogs("policy")
    )
    assert arrived is not None and first <= arrived
    now = first + 5.0
    collector = SinkCollector(store, "policy", clock=lambda: now)
    got = samples(collector)
    a = (("client", "policy"), ("source", "site-a"))
    b = (("client", "policy"), ("source", "site-b"))
    assert got[("lr_sink_metrics_up", ())] == 1
    assert got[("lr_sink_queue_depth", a)] == 3 and got[("lr_sink_queue_depth", b)] == 1
    assert got[("lr_sink_oldest_undelivered_seconds", a)] == pytest.approx(5.0, abs=1e-3)
    assert not any(dict(labels).get("client") == "orders" for _, labels in got)

    (queue,) = [q for q in store.queues.list_queues("policy") if q.source_id == "site-a"]
    pass_entries(store, queue.queue_id, 3)  # delivered
    got = samples(collector)
    assert got[("lr_sink_queue_depth", a)] == 0
    assert got[("lr_sink_oldest_undelivered_seconds", a)] == 0.0
    every = samples(SinkCollector(store, clock=lambda: now))
    assert every[("lr_sink_queue_depth", (("client", "orders"), ("source", "site-a")))] == 1


class Unreachable:
    @property
    def inspection(self) -> Unreachable:  # the store's inspection role: this fake plays it
        return self

    def sink_backlogs(self, client_name: str | None = None) -> list[SinkBacklog]:
        raise StoreUnavailableError("the database could not be reached")

    def sink_failures(self, client_name: str | None = None) -> SinkFailures:
        raise StoreUnavailableError("the database could not be reached")

    def sink_partition_lags(self, client_name: str | None = None) -> list[PartitionLag]:
        raise StoreUnavailableError("the database could not be reached")


def test_a_failed_read_is_up_0_not_a_failed_scrape() -> None:
    assert samples(SinkCollector(Unreachable())) == {("lr_sink_metrics_up", ()): 0}


def test_an_application_serves_the_registry_over_http(store: SQLAlchemyQueueStore) -> None:
    store.recv.apply_log_batch("site-a", "policy", entries(1, 2))
    port = reserve_port()
    endpoint = serve_metrics("127.0.0.1", port, registry=sink_registry(store, "policy"))
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10.0) as reply:
            text = reply.read().decode()
    finally:
        endpoint.close()
    found = {
        (s.name, s.labels.get("source", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("lr_sink_queue_depth", "site-a")] == 2
    assert found[("lr_sink_metrics_up", "")] == 1
    assert "lr_entries_shipped" not in text  # only what the application registered


class FailsOnKey(RoutingQueueListener):
    """Applies every entry but those of key ``stuck``, on which it raises."""

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        if any(m.key == b"stuck" for m in messages):
            raise RuntimeError("cannot apply stuck")
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def test_a_stuck_partition_stands_behind_the_others(store: SQLAlchemyQueueStore) -> None:
    keys = [b"stuck", b"k1", b"k2", b"k3", b"k4", b"k5"]
    stuck_part = partition_of(HashPartitioner(), b"stuck", 2)
    others = [k for k in keys if partition_of(HashPartitioner(), k, 2) != stuck_part]
    assert others  # some key lands in the other partition
    batch = [
        WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p, key=keys[p % len(keys)])
        for p in range(1, 31)
    ]
    store.recv.apply_log_batch("site-a", "policy", batch)
    collector = SinkCollector(store, "policy")
    sub = RoutingQueueSubscriber(store, "policy", FailsOnKey(), partitions=2, retry_initial=0.0)
    with sub:

        def behind() -> dict[str, float]:
            sub.poll_once()
            got = samples(collector)
            return {
                dict(labels)["partition"]: value
                for (name, labels), value in got.items()
                if name == "lr_sink_partition_behind_entries"
            }

        wait_for(lambda: behind().get(str(1 - stuck_part)) == 0, 30.0, 0.0)
    lags = behind()
    own = sum(1 for e in batch if e.key not in others)  # the stuck partition's entries
    # Stuck at its first entry: its own entries are above its mark, and those of the other
    # partition not retired yet (SQLite retires delivered entries at once, PostgreSQL later).
    assert own <= lags[str(stuck_part)] <= len(batch)
    assert set(lags) == {"0", "1"}
