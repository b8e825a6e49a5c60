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

Streams the config does not list (a destination the application registered
or addressed, or a client a destination is not given) are shipped by no
session. Their entries are kept, so that a destination configured later gets
its backlog, and counted in ``lr_unconfigured_entries``; the server warns
once per stream. Past a limit such a stream is dropped whatever the client's
snapshot mode (nobody could ship its backlog, and it must not fill the
disk); it takes no part in backpressure.

A full sync is another matter: such a destination (removed from the config,
or never in it) leaves every open snapshot it is in at once. Nobody ships a
snapshot to it, and a shared snapshot ends, and its rows are released, only
once no destination is left in it: the others complete it without it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from lr_client.records import OPEN_SNAPSHOT_STATUSES, Backlog
from lr_server import metrics
from lr_server.cluster.streams import shipped_streams, unconfigured_streams
from lr_server.config import SiteConfig, SnapshotProvider
from lr_server.stores import PolicyStore

log = logging.getLogger("lr.retention")


@dataclass(frozen=True)
class StreamHealth:
    destination: str
    client_name: str
    backlog: Backlog
    age_seconds: float
    slow: bool
    over: bool
    configured: bool = True


@dataclass(frozen=True)
class RetentionReport:
    streams: list[StreamHealth]
    dropped: list[tuple[str, str]]
    backpressure: dict[str, bool]
    #: (snapshot id, destination) of the open snapshots unconfigured destinations left.
    left_snapshots: list[tuple[str, str]] = field(default_factory=list)


class RetentionPolicy:
    """Applies the limits of a site's config to its send queue."""

    def __init__(self, store: PolicyStore, config: SiteConfig) -> None:
        self.store = store
        self.config = config
        self._warned: set[tuple[str, str]] = set()  # unconfigured streams already logged
        self._reported: set[tuple[str, str]] = set()  # ... with lr_unconfigured_entries set
        # Unconfigured streams found so far, and the send queue's position read up to:
        # each run reads only the entries appended since.
        self._found: set[tuple[str, str]] = set()
        self._scanned = 0

    def run_once(self) -> RetentionReport:
        limits = self.config.retention
        now = time.time()
        dropped_now: list[tuple[str, str]] = []
        already = {(d.destination, d.client_name) for d in self.store.retention.list_drops()}
        streams: list[StreamHealth] = []
        backpressure: dict[str, bool] = {}
        # A site without destinations has no flow to control (a pure sink).
        clients = self.config.clients if self.config.destinations else []
        dests_of = {
            c.name: [d.id for d in self.config.destinations if c.name in self.config.clients_for(d)]
            for c in clients
        }
        # Released streams are not measured: the full sync will catch them up.
        measured = [(d, c) for c, ds in dests_of.items() for d in ds if (d, c) not in already]
        backlogs = dict(zip(measured, self.store.shipping.backlogs(measured), strict=True))
        for client in clients:
            dests = dests_of[client.name]
            health = []
            for dest in dests:
                backlog = backlogs.get((dest, client.name))
                if backlog is None:
                    continue
                age, is_slow, over = limits.measure(backlog, now)
                health.append(StreamHealth(dest, client.name, backlog, age, is_slow, over))
                metrics.LAG_ENTRIES.labels(dest, client.name).set(backlog.entries)
                metrics.LAG_BYTES.labels(dest, client.name).set(backlog.bytes)
                metrics.LAG_SECONDS.labels(dest, client.name).set(age)
            streams += health
            slow = [h.destination for h in health if h.slow]
            on = bool(dests) and len(slow) * 2 > len(dests)
            if not on and client.snapshot != SnapshotProvider.NONE:
                for h in health:
                    if h.over:
                        reason = (
                            f"over retention: {h.backlog.entries} entries, "
                            f"{h.backlog.bytes} bytes, oldest {h.age_seconds:.0f}s"
                        )
                        if self.store.retention.drop_stream(h.destination, client.name, reason):
                            metrics.DROPS.labels(h.destination, client.name).inc()
                            log.warning(
                                "dropped %s/%s to a full sync: %s",
                                h.destination,
                                client.name,
                                reason,
                                extra={"destination": h.destination, "client": client.name},
                            )
                            dropped_now.append((h.destination, client.name))
            previous, was_slow = self.store.send.flow_state(client.name)
            if on and not previous:
                metrics.BACKPRESSURE_EVENTS.inc()
            if on != previous:
                log.warning(
                    "backpressure %s for %s (slow: %s)",
                    "on" if on else "off",
                    client.name,
                    ", ".join(slow) or "none",
                )
            if on != previous or sorted(slow) != sorted(was_slow):  # a write when it changes
                self.store.retention.set_flow_state(client.name, on, slow)
            metrics.BACKPRESSURE.labels(client.name).set(1 if on else 0)
            backpressure[client.name] = on
        streams += self._unconfigured(already, now, dropped_now)
        return RetentionReport(streams, dropped_now, backpressure, self._leave_snapshots())

    def _leave_snapshots(self) -> list[tuple[str, str]]:
        """Each destination the config does not list for a client leaves the client's open
        snapshots: nobody ships them to it, and it must not hold their rows (a shared
        one goes on for the others, and ends, released, when the last one is done)."""
        shipped = shipped_streams(self.config)
        left = []
        for view in self.store.snapshots.list_snapshots(statuses=OPEN_SNAPSHOT_STATUSES):
            dest, client = view.destination, view.client_name
            if (dest, client) in shipped:
                continue
            reason = f"{dest} is not configured for {client} at this site"
            if self.store.snapshots.cancel_snapshot(view.snapshot_id, reason, dest):
                log.warning(
                    "%s left snapshot %s: %s",
                    dest,
                    view.snapshot_id,
                    reason,
                    extra={"destination": dest, "client": client},
                )
                left.append((view.snapshot_id, dest))
        return left

    def _unconfigured(
        self, already: set[tuple[str, str]], now: float, dropped_now: list[tuple[str, str]]
    ) -> list[StreamHealth]:
        """Measure, report and drop past a limit the streams no session ships."""
        limits = self.config.retention
        health = []
        reported = set()
        found, self._scanned = unconfigured_streams(self.config, self.store.shipping, self._scanned)
        self._found |= set(found)
        self._found -= already  # released: new entries are trimmed as they come
        found = sorted(self._found)
        for (dest, client), backlog in zip(found, self.store.shipping.backlogs(found), strict=True):
            if not backlog.entries:
                self._found.discard((dest, client))  # new entries will find it again
                continue
            age, is_slow, over = limits.measure(backlog, now)
            health.append(StreamHealth(dest, client, backlog, age, is_slow, over, False))
            reported.add((dest, client))
            metrics.UNCONFIGURED_ENTRIES.labels(dest, client).set(backlog.entries)
            metrics.LAG_ENTRIES.labels(dest, client).set(backlog.entries)
            metrics.LAG_BYTES.labels(dest, client).set(backlog.bytes)
            metrics.LAG_SECONDS.labels(dest, client).set(age)
            fields = {"destination": dest, "client": client}
            if (dest, client) not in self._warned:
                self._warned.add((dest, client))
                log.warning(
                    "%d entries queued for %s/%s, which this site's config does not list: "
                    "not shipped; kept until a retention limit drops them",
                    backlog.entries,
                    dest,
                    client,
                    extra=fields,
                )
            if not over:
                continue
            reason = (
                f"not configured; over retention: {backlog.entries} entries, "
                f"{backlog.bytes} bytes, oldest {age:.0f}s"
            )
            if self.store.retention.drop_stream(dest, client, reason):
                metrics.DROPS.labels(dest, client).inc()
                log.warning("dropped %s/%s: %s", dest, client, reason, extra=fields)
                dropped_now.append((dest, client))
                metrics.UNCONFIGURED_ENTRIES.labels(dest, client).set(0)
                reported.discard((dest, client))
        for dest, client in self._reported - reported:
            metrics.UNCONFIGURED_ENTRIES.labels(dest, client).set(0)
        self._reported = reported
        return health
