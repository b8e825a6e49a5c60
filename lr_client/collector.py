"""Building a delivery's batch without Python's cyclic garbage collector scanning it.

A batch is thousands of new objects that all live until it is delivered: the
driver's rows, a :class:`~lr_client.records.HeadEntry` and a
:class:`~lr_client.listener.RoutingQueueMessage` per entry. Each collection of
the youngest generation while they are made scans them again, none of them is
garbage, and every few batches the ones promoted trigger a collection of the
whole heap: about 2 µs per entry of a 4,000-entry snapshot batch, a quarter of
the subscriber's CPU (docs/benchmarks.md). Paused while the batch is read and
planned, they are scanned once, after; the listener runs with the collector on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (a few milliseconds).

    Nothing changes if it is already off (the application's choice, or another
    thread's pause), and it is turned back on only by the pause that turned it off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


__all__ = ["collector_paused"]
