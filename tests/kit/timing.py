"""Where a run's time went: its slowest tests and the time of each folder.

A pytest plugin (registered by ``tests/conftest.py``). Each test's time is the
sum of its setup, call and teardown, as the worker that ran it measured them;
at the end of the run the terminal shows the run's wall time, the
:data:`SHOWN` slowest tests and the seconds spent in each folder of
``tests/`` (summed over the workers). ``LR_TEST_TIMES=FILE`` also writes them
as JSON (what ``docs/testing.md`` reports).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

#: Slowest tests shown at the end of a run.
SHOWN = 15


class Timing:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def folders(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.seconds.items():
            parts = nodeid.split("::", 1)[0].split("/")
            out[parts[1] if len(parts) > 2 else parts[0]] += seconds
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        wall = time.monotonic() - self.started
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SHOWN]
        write = terminalreporter.write_line
        terminalreporter.section(f"the {len(slowest)} slowest tests (setup + call + teardown)")
        for nodeid, seconds in slowest:
            write(f"{seconds:7.1f}s {nodeid}")
        total = sum(self.seconds.values())
        folders = self.folders()
        write(
            "time per folder (summed over workers): "
            + ", ".join(f"{name} {seconds:.0f}s" for name, seconds in folders.items())
            + f"; all {total:.0f}s of tests in {wall:.0f}s of wall time"
        )
        out = os.environ.get("LR_TEST_TIMES")
        if out:
            Path(out).write_text(
                json.dumps(
                    {
                        "wall_seconds": round(wall, 1),
                        "test_seconds": round(total, 1),
                        "folders": {k: round(v, 1) for k, v in folders.items()},
                        "tests": {k: round(v, 2) for k, v in self.seconds.items()},
                    },
                    indent=1,
                )
            )


def register(config: pytest.Config) -> None:
    """Time the run, once per run (not in xdist's workers: their reports reach the controller)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timing(), "lr-timing")
