"""Per-stage latency of a hop: where a batch's time goes between a transmit and the
listener's commit.

Each stage is measured by the process it ends in, per batch, on the batch's first
(oldest) entry, and summed up over the stage's last :data:`SAMPLES` batches:

* ``queued``: the transmit (the entry's ``created_at``) to the sender session's read
  of it: the application's commit, on PostgreSQL the sequencer's tick, the wake-up;
* ``sent``: that read to the batch's send on the stream (the open-snapshot check,
  a full window);
* ``stored``: the send to the sink's acknowledgement (the network, the sink's receive
  transaction, the way back);
* ``applied``: the batch stored in the sink's receive queue (``received_at``) to the
  commit of the subscriber's delivery (its wake-up, the listener).

The first two compare wall clocks of the transmitting application and the server, the
last one those of the sink's server and the subscriber (the same host's, or skew
shows in them). A :class:`StageBook` keeps the samples; the process writes its
summaries to the store (:mod:`lr_client.store.ops.latency`) at most every
:data:`FLUSH_INTERVAL` s while batches come, and ``lr status`` shows them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from lr_client.errors import LRError
from lr_client.store.ops.contract import StageLatencies
from lr_client.store.ops.latency import StageLatency

log = logging.getLogger("lr_client.latency")

#: The batches each stage's summary covers (the last ones).
SAMPLES = 1000
#: Seconds between two writes of a process's summaries, at most.
FLUSH_INTERVAL = 10.0
#: The stages, in the order a batch goes through them.
STAGES = ("queued", "sent", "stored", "applied")


def percentile(ordered: list[float], fraction: float) -> float:
    """The value of ``ordered`` (sorted, not empty) at ``fraction`` of the way (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class StageBook:
    """The last batches' seconds per (peer, client, stage), and when to write them."""

    def __init__(
        self,
        samples: int = SAMPLES,
        flush_interval: float = FLUSH_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.samples = samples
        self.flush_interval = flush_interval
        self.clock = clock
        self._seen: dict[tuple[str, str, str], deque[float]] = {}
        self._new = False
        self._flushed_at = float("-inf")

    def add(self, peer: str, client: str, stage: str, seconds: float) -> None:
        key = (peer, client, stage)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = deque(maxlen=self.samples)
        found.append(max(0.0, seconds))
        self._new = True

    def rows(self) -> list[StageLatency]:
        """Each stage's summary (batches, median, 99th percentile, largest)."""
        out = []
        for (peer, client, stage), seen in sorted(self._seen.items()):
            ordered = sorted(seen)
            p50, p99 = percentile(ordered, 0.5), percentile(ordered, 0.99)
            out.append(StageLatency(peer, client, stage, len(ordered), p50, p99, ordered[-1]))
        return out

    def due(self) -> bool:
        """Whether batches came since the last write, and the interval is over."""
        return self._new and self.clock() - self._flushed_at >= self.flush_interval

    def flush(self, store: StageLatencies, force: bool = False) -> bool:
        """Write the summaries if due (or ``force``d and any came); whether written. A
        store that cannot be written keeps them for the next try."""
        if not (self.due() or (force and self._new)):
            return False
        try:
            store.save_stage_latency(self.rows())
        except LRError as exc:
            log.warning("cannot record the stages' latency: %s", exc)
            return False
        self._new, self._flushed_at = False, self.clock()
        return True


__all__ = ["FLUSH_INTERVAL", "SAMPLES", "STAGES", "StageBook", "percentile"]
