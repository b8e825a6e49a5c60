"""A real ``lr server`` source whose destination accepts connections and closes them at
once: its session's connection attempts, counted by the listener with their times,
come at the documented schedule (``docs/guarantees.md``, the back-off row): waits that
double from ``initial_backoff`` up to ``max_backoff``, plus up to ``jitter``.

One attempt of the session may open more than one TCP connection (gRPC's own try of
the address), so the accepts are grouped into attempts: connections closer together
than half the smallest wait belong to one attempt.
"""

from __future__ import annotations

import socket
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest

from tests.kit.procs import LrServer
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import stop_server, tune_config

pytestmark = pytest.mark.slow

INITIAL, CAP, JITTER = 0.2, 1.6, 0.1
#: Waits after the first attempts: 0.2, 0.4, 0.8, then 1.6 from the 4th on.
ATTEMPTS = 7  # three waits at the cap


class ClosingListener:
    """Accepts every connection and closes it at once, noting when (monotonic)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.accepts: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="closing-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepts.append(time.monotonic())
            conn.close()

    def attempts(self) -> list[float]:
        """The start of each attempt: accepts grouped by gaps under half the first wait."""
        out: list[float] = []
        last = float("-inf")
        for t in list(self.accepts):
            if t - last >= INITIAL / 2:
                out.append(t)
            last = t
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_reconnect_attempts_against_a_closed_port_back_off_to_the_cap(tmp_path: Path) -> None:
    listener = ClosingListener()
    spec = SiteSpec(
        "a",
        f"sqlite:///{tmp_path / 'a.db'}",
        destinations=[("b", listener.port)],
        metrics_port=free_port(),
    )
    config = tune_config(
        write_config(tmp_path, spec, security="plaintext"),
        {"retry": {"initial_backoff": INITIAL, "max_backoff": CAP, "jitter": JITTER}},
    )
    server = LrServer(config).start()
    try:
        wait_for(
            lambda: len(listener.attempts()) >= ATTEMPTS,
            30,
            what=f"{ATTEMPTS} connection attempts",
            detail=lambda: f"{listener.accepts}\n{server.log()}",
        )
    finally:
        stop_server(server)
        listener.close()
    starts = listener.attempts()[:ATTEMPTS]
    gaps = [b - a for a, b in pairwise(starts)]
    expected = [min(INITIAL * 2**n, CAP) for n in range(len(gaps))]
    detail = f"gaps {[round(g, 3) for g in gaps]}, expected at least {expected}"
    print(detail, f"accepts {len(listener.accepts)}")
    # A wait is never shorter than its schedule (the lower bound holds under any load)...
    assert all(g >= e * 0.95 for g, e in zip(gaps, expected, strict=True)), detail
    # ...nor, past the cap, much longer: the cap holds (jitter plus the attempt's own time).
    slack = JITTER + scaled(0.5)
    assert all(g <= CAP + slack for g in gaps[3:]), detail
    # Growth: the waits before the cap grow, each about twice the one before.
    assert gaps[0] < gaps[1] < gaps[2] < CAP + slack, detail
    assert gaps[2] >= 2 * INITIAL * 2 * 0.95, detail
