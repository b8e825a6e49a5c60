"""Retention limits, drops and backpressure: one slow site never fills the disk.

Every stream (destination, client) is measured against the limits of
``[retention]``: unacknowledged entries, bytes, and the age of the oldest
one. Past ``soft_fraction`` of any limit a destination is *slow*; past the
limit itself it is *over*. Per client (the seeds' smart throttling):

* when more than half of the client's destinations are slow, dropping them
  all would be wrong: backpressure is turned on and ``transmit`` refuses or
  waits (see :class:`lr_client.RoutingQueueClient`), nothing is dropped;
* otherwise each destination that is over is *dropped*: its backlog is
  released for trimming, a drop record keeps the first dropped position, and
  it gets a full sync before log entries resume. Only clients with a
  snapshot provider are dropped; without one a destination stays slow.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from lr_client.records import Backlog
from lr_client.store import SQLAlchemyQueueStore
from lr_server import metrics
from lr_server.config import RetentionConfig, SiteConfig

log = logging.getLogger("lr.retention")


@dataclass(frozen=True)
class StreamHealth:
    destination: str
    client_name: str
    backlog: Backlog
    age_seconds: float
    slow: bool
    over: bool


@dataclass(frozen=True)
class RetentionReport:
    streams: list[StreamHealth]
    dropped: list[tuple[str, str]]
    backpressure: dict[str, bool]


def measure(backlog: Backlog, limits: RetentionConfig, now: float) -> tuple[float, bool, bool]:
    """(age of the oldest entry, slow, over) of one backlog."""
    age = 0.0 if backlog.oldest_created_at is None else max(0.0, now - backlog.oldest_created_at)
    ratios = (
        backlog.entries / limits.max_entries,
        backlog.bytes / limits.max_bytes,
        age / limits.max_age_seconds if limits.max_age_seconds else 0.0,
    )
    worst = max(ratios)
    return age, worst >= limits.soft_fraction, worst >= 1.0


class RetentionPolicy:
    """Applies the limits of a site's config to its send queue."""

    def __init__(self, store: SQLAlchemyQueueStore, config: SiteConfig) -> None:
        self.store = store
        self.config = config

    def run_once(self) -> RetentionReport:
        limits = self.config.retention
        now = time.time()
        dropped_now: list[tuple[str, str]] = []
        already = {(d.destination, d.client_name) for d in self.store.list_drops()}
        streams: list[StreamHealth] = []
        backpressure: dict[str, bool] = {}
        for client in self.config.clients:
            dests = [
                d.id for d in self.config.destinations if client.name in self.config.clients_for(d)
            ]
            health = []
            for dest in dests:
                if (dest, client.name) in already:
                    continue  # its backlog is released; the full sync will catch it up
                backlog = self.store.backlog(dest, client.name)
                age, is_slow, over = measure(backlog, limits, now)
                health.append(StreamHealth(dest, client.name, backlog, age, is_slow, over))
                metrics.LAG_ENTRIES.labels(dest, client.name).set(backlog.entries)
                metrics.LAG_BYTES.labels(dest, client.name).set(backlog.bytes)
                metrics.LAG_SECONDS.labels(dest, client.name).set(age)
            streams += health
            slow = [h.destination for h in health if h.slow]
            on = bool(dests) and len(slow) * 2 > len(dests)
            if not on and client.snapshot != "none":
                for h in health:
                    if h.over:
                        reason = (
                            f"over retention: {h.backlog.entries} entries, "
                            f"{h.backlog.bytes} bytes, oldest {h.age_seconds:.0f}s"
                        )
                        if self.store.drop_stream(h.destination, client.name, reason):
                            metrics.DROPS.labels(h.destination, client.name).inc()
                            log.warning(
                                "dropped %s/%s to a full sync: %s",
                                h.destination,
                                client.name,
                                reason,
                                extra={"destination": h.destination, "client": client.name},
                            )
                            dropped_now.append((h.destination, client.name))
            previous, _ = self.store.flow_state(client.name)
            if on and not previous:
                metrics.BACKPRESSURE_EVENTS.inc()
            if on != previous:
                log.warning(
                    "backpressure %s for %s (slow: %s)",
                    "on" if on else "off",
                    client.name,
                    ", ".join(slow) or "none",
                )
            self.store.set_flow_state(client.name, on, slow)
            backpressure[client.name] = on
        return RetentionReport(streams, dropped_now, backpressure)
