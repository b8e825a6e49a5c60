"""The sink's metrics, read from its database at each scrape: a Prometheus collector.

An application that embeds a :class:`~lr_client.RoutingQueueSubscriber` mounts
them on its own registry (``lr server`` exports the same names for every client
of the site)::

    from prometheus_client import make_wsgi_app
    from lr_client.sink_metrics import sink_registry

    app = make_wsgi_app(sink_registry(subscriber.store, "policy"))  # mount at /metrics

Per client and source (receive queue ``LRQ_Recv_<client>__<source>``):

* ``lr_sink_queue_depth``: entries received and not delivered to the listener yet;
* ``lr_sink_oldest_undelivered_seconds``: how long ago the oldest of them arrived
  (0 when the queue is empty);
* ``lr_parked_entries``: entries its listener failed on that wait for an operator
  (parked, held behind them, or asked for again; :mod:`lr_client.failure_policy`);
* ``lr_blocked_queues``: 1 (or the number of its partitions) while its delivery has
  failed ``max_attempts`` times in a row, else 0;
* ``lr_sink_partition_behind_entries`` (also by ``partition``, for queues delivered
  by partition): the queue's entries above the partition's delivered mark;

and ``lr_sink_metrics_up``: 1 if the database answered the scrape's read, else 0
(the other two are then absent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lr_client.errors import TransientError
from lr_client.store.contract import Inspection

#: The metrics' names, as exported by the collector and by ``lr server``.
QUEUE_DEPTH = "lr_sink_queue_depth"
OLDEST_UNDELIVERED = "lr_sink_oldest_undelivered_seconds"
UP = "lr_sink_metrics_up"
PARKED = "lr_parked_entries"
BLOCKED = "lr_blocked_queues"
PARTITION_BEHIND = "lr_sink_partition_behind_entries"


@runtime_checkable
class SinkReads(Protocol):
    """What the collector reads: a store's inspection role (every receive queue's
    backlog, failures and partitions' lag)."""

    inspection: Inspection


class SinkCollector(Collector):
    """The receive queues' depth and oldest undelivered age, read at each scrape (one
    query); of one client's queues, or every client's."""

    def __init__(
        self,
        store: SinkReads,
        client_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.client_name = client_name
        self.clock = clock

    def describe(self) -> list[Metric]:
        """Nothing: the families are read at scrape time, none at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The gauges, as of now; only ``lr_sink_metrics_up`` 0 if the read failed."""
        up = GaugeMetricFamily(UP, "1 if the sink's database answered this scrape's read")
        try:
            backlogs = self.store.inspection.sink_backlogs(self.client_name)
            failures = self.store.inspection.sink_failures(self.client_name)
            lags = self.store.inspection.sink_partition_lags(self.client_name)
        except TransientError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        labels = ["client", "source"]
        depth = GaugeMetricFamily(
            QUEUE_DEPTH, "Entries received, not delivered to the listener yet", labels=labels
        )
        age = GaugeMetricFamily(
            OLDEST_UNDELIVERED,
            "Seconds since the oldest undelivered entry arrived (0: none)",
            labels=labels,
        )
        parked = GaugeMetricFamily(
            PARKED, "Entries parked or held after their listener failed", labels=labels
        )
        blocked = GaugeMetricFamily(
            BLOCKED, "Queues (or partitions) whose delivery keeps failing", labels=labels
        )
        now = self.clock()
        for b in backlogs:
            at = b.oldest_received_at
            queue = (b.client_name, b.source_id)
            depth.add_metric(list(queue), b.depth)
            age.add_metric(list(queue), 0.0 if at is None else max(0.0, now - at))
            parked.add_metric(list(queue), failures.parked.get(queue, 0))
            blocked.add_metric(list(queue), failures.blocked.get(queue, 0))
        behind = GaugeMetricFamily(
            PARTITION_BEHIND,
            "Entries of a queue delivered by partition above the partition's delivered mark",
            labels=[*labels, "partition"],
        )
        for lag in lags:
            behind.add_metric([lag.client_name, lag.source_id, str(lag.partition)], lag.behind)
        yield from (up, depth, age, parked, blocked, behind)


def sink_registry(store: SinkReads, client_name: str | None = None) -> CollectorRegistry:
    """A registry holding a :class:`SinkCollector`, for ``make_wsgi_app`` or
    ``start_http_server`` of the application."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SinkCollector(store, client_name))
    return registry


__all__ = [
    "BLOCKED",
    "OLDEST_UNDELIVERED",
    "PARKED",
    "QUEUE_DEPTH",
    "UP",
    "SinkCollector",
    "SinkReads",
    "sink_registry",
]
