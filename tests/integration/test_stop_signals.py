"""A stop signal arriving while the main thread holds the stop event's lock still stops.

Python runs a signal handler in the main thread between two bytecodes, possibly
inside ``Event.wait`` or ``Event.set`` of the very event the handler would set: a
handler calling ``stop.set()`` then waits for a lock its own thread holds, and the
process never stops (seen as a sink application and an ``lr server`` hanging after
a second SIGTERM). A real process, because signals go to a process's main thread.
"""

from __future__ import annotations

import subprocess
import sys

from tests.kit.procs import ROOT, lr_env
from tests.kit.wait import scaled

SCRIPT = """
import os, signal, sys, threading
from lr_server.ops.stop_signals import stop_on_signals

stop = threading.Event()
stop_on_signals(stop)
with stop._cond:  # the main thread inside the event, as in its wait() or set()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):  # bytecodes: the handlers run here, the lock held
        pass
    assert not stop.is_set()
sys.exit(0 if stop.wait(30) else 3)
"""


def test_stop_signals_delivered_while_the_stop_event_is_locked_stop_the_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=lr_env(),
        capture_output=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr.decode()
