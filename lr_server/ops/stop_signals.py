"""Signals that stop a process, handled without taking a lock in the handler.

A Python signal handler runs in the main thread between two bytecodes, possibly
inside code holding a lock. ``threading.Event.set`` takes the event's lock: a
handler calling it while the main thread was inside the same event's ``wait``
or ``set`` (a second SIGTERM arriving during the first one's handler, say)
waits for itself forever, and the process never stops. Here the handler only
puts the signal into a ``queue.SimpleQueue`` (reentrant by design) and a thread
of its own sets the event.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Iterable

#: The signals that stop ``lr server`` (and an application using :func:`stop_on_signals`).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(
    stop: threading.Event, signals: Iterable[signal.Signals] = STOP_SIGNALS
) -> threading.Thread:
    """Set ``stop`` when one of ``signals`` arrives; from the main thread. The thread
    that sets it (a daemon, ``lr-signals``)."""
    received: queue.SimpleQueue[int] = queue.SimpleQueue()

    def handler(signum: int, frame: object) -> None:
        received.put(signum)

    def relay() -> None:
        received.get()
        stop.set()

    for sig in signals:
        signal.signal(sig, handler)
    thread = threading.Thread(target=relay, name="lr-signals", daemon=True)
    thread.start()
    return thread


__all__ = ["STOP_SIGNALS", "stop_on_signals"]
