"""Bounded receive queues: a sink refuses a client's log batches while its queue is full.

Per client, ``receive_queue_max_entries`` / ``receive_queue_max_bytes`` (``[[clients]]``
of the sink's config; 0: no limit) bound what waits undelivered in each of its receive
queues (one per source). A log batch (a replayed one too) that arrives while the queue
holds as much or more is refused with :class:`~lr_client.errors.ReceiveQueueFullError`
(gRPC ``RESOURCE_EXHAUSTED``, retryable): nothing of it is stored, the source's stream
breaks, and its session sends it again after its backoff, as for a sink that is down, so
the source's lag, retention and backpressure see a blocked sink as a slow one. Once the
subscriber drained the queue below its limits, the next attempt is stored. A queue thus
holds at most its limit plus one batch. Snapshot batches and drop notices are never
refused: a full sync is delivered only once its end has arrived, so refusing its
batches could wait for ever. ``lr_receive_queue_full`` is 1 while a queue refuses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from lr_client.errors import QUEUE_FULL, ReceiveQueueFullError
from lr_server import metrics
from lr_server.config import SiteConfig

log = logging.getLogger("lr.receiver")


class SizedStore(Protocol):
    def receive_queue_size(self, source_id: str, client_name: str) -> tuple[int, int]: ...


class ReceiveLimits:
    """The limits of a sink's receive queues, by client: (entries, bytes), 0 for none."""

    def __init__(self, store: SizedStore, limits: Mapping[str, tuple[int, int]]) -> None:
        self.store = store
        self.limits = {c: lim for c, lim in limits.items() if any(lim)}
        self.full: set[tuple[str, str]] = set()  # (source, client) refusing now

    @classmethod
    def from_config(cls, store: SizedStore, config: SiteConfig) -> ReceiveLimits:
        return cls(
            store,
            {
                c.name: (c.receive_queue_max_entries, c.receive_queue_max_bytes)
                for c in config.clients
            },
        )

    def check(self, source_id: str, client: str) -> None:
        """Refuse (:class:`ReceiveQueueFullError`) a log batch for a queue at its limits."""
        limit = self.limits.get(client)
        if limit is None:
            return
        max_entries, max_bytes = limit
        entries, nbytes = self.store.receive_queue_size(source_id, client)
        key = (source_id, client)
        gauge = metrics.RECEIVE_QUEUE_FULL.labels(source_id, client)
        if (max_entries and entries >= max_entries) or (max_bytes and nbytes >= max_bytes):
            if key not in self.full:
                self.full.add(key)
                gauge.set(1)
                log.warning(
                    "%s/%s: the receive queue is full (%d entries, %d bytes; limits %s, %s): "
                    "refusing log batches until its subscriber drains it",
                    source_id,
                    client,
                    entries,
                    nbytes,
                    max_entries or "none",
                    max_bytes or "none",
                )
            raise ReceiveQueueFullError(
                f"{source_id}/{client}: the {QUEUE_FULL} ({entries} entries, {nbytes} bytes); "
                "sent again once its subscriber drains it"
            )
        if key in self.full:
            self.full.discard(key)
            gauge.set(0)
            log.info("%s/%s: the receive queue takes batches again", source_id, client)


__all__ = ["ReceiveLimits"]
