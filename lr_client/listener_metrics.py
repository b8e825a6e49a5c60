"""The sink's delivery metrics, measured around the application's listener.

:class:`ListenerMetrics` holds them on a registry the application chooses;
:meth:`ListenerMetrics.wrap` returns a listener that calls the application's
and measures each batch. The subscriber is not changed: it is given the wrapped
listener::

    registry = sink_registry(store, "policy")  # lr_client.sink_metrics: depth and age
    metrics = ListenerMetrics(registry)
    subscriber = RoutingQueueSubscriber(engine, "policy", metrics.wrap(MyListener()))

Per client, source and ``kind`` (``log`` or ``snapshot``):

* ``lr_sink_listener_batches_total{outcome}``: batches the listener was called
  with, by outcome: ``accepted`` (it returned True), ``refused`` (False) or
  ``failed`` (it raised); the last two are delivered again after a backoff;
* ``lr_sink_listener_entries_total``: entries of the accepted batches (a
  transaction rolled back after the listener accepted delivers them again);
* ``lr_sink_apply_seconds``: the listener's time per batch (a histogram).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from lr_client.listener import RoutingQueueListener, RoutingQueueMessage, takes_base_position

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

LABELS = ("client", "source", "kind")
APPLY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ListenerMetrics:
    """The listener's batches, entries and apply time, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Counter(
            "lr_sink_listener_batches",
            "Batches the sink's listener was called with, by outcome",
            [*LABELS, "outcome"],
            registry=registry,
        )
        self.entries = Counter(
            "lr_sink_listener_entries",
            "Entries of the batches the sink's listener accepted",
            LABELS,
            registry=registry,
        )
        self.apply_seconds = Histogram(
            "lr_sink_apply_seconds",
            "Time the sink's listener took per batch",
            LABELS,
            buckets=APPLY_BUCKETS,
            registry=registry,
        )

    def wrap(self, listener: RoutingQueueListener) -> MeteredListener:
        """``listener``, measured: give the result to the subscriber."""
        return MeteredListener(listener, self)

    def measure(
        self,
        call: Callable[[], bool],
        source_id: str,
        kind: str,
        messages: Sequence[RoutingQueueMessage],
    ) -> bool:
        """Call ``call`` (a listener's ``process_*``), recording its outcome and time."""
        labels = (messages[0].client_name if messages else "", source_id, kind)
        start = time.perf_counter()
        outcome = "failed"
        try:
            accepted = call()
            outcome = "accepted" if accepted else "refused"
            return accepted
        finally:
            self.apply_seconds.labels(*labels).observe(time.perf_counter() - start)
            self.batches.labels(*labels, outcome).inc()
            if outcome == "accepted":
                self.entries.labels(*labels).inc(len(messages))


class MeteredListener(RoutingQueueListener):
    """Calls ``inner`` for every callback; measures ``process_*`` on ``metrics``."""

    def __init__(self, inner: RoutingQueueListener, metrics: ListenerMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        """The inner listener's, measured as ``kind="log"``."""
        inner = self.inner.process_log_entries
        return self.metrics.measure(
            lambda: inner(session, source_id, messages), source_id, "log", messages
        )

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        """The inner listener's, measured as ``kind="snapshot"``."""
        inner = self.inner.process_full_sync
        return self.metrics.measure(
            lambda: inner(session, source_id, messages), source_id, "snapshot", messages
        )

    def on_full_sync_start(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        """The inner listener's (told ``base_position`` if its override takes it)."""
        call: Any = self.inner.on_full_sync_start
        if takes_base_position(call):
            call(session, source_id, snapshot_id, base_position=base_position)
        else:
            call(session, source_id, snapshot_id)

    def on_full_sync_end(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        """The inner listener's (told ``base_position`` if its override takes it)."""
        call: Any = self.inner.on_full_sync_end
        if takes_base_position(call):
            call(session, source_id, snapshot_id, base_position=base_position)
        else:
            call(session, source_id, snapshot_id)

    def on_stream_dropped(
        self, session: Session, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        """The inner listener's."""
        self.inner.on_stream_dropped(session, source_id, first_dropped_position, reason)

    def on_error(self, error: BaseException) -> None:
        """The inner listener's."""
        self.inner.on_error(error)


__all__ = ["APPLY_BUCKETS", "ListenerMetrics", "MeteredListener"]
