"""Where the CPU of a run goes: CPU seconds per process or thread, and py-spy samples.

:class:`ProcessCpu` reads ``utime + stime`` of processes (``/proc/<pid>/stat``),
:class:`ThreadCpu` of the calling thread (``time.thread_time``). :class:`PySpy`
samples processes with `py-spy <https://github.com/benfred/py-spy>`_ when it is
installed (``pip install py-spy``; ``LR_BENCH_PYSPY`` names the binary), and
:func:`top_functions` turns its collapsed stacks into the functions with the most
samples inclusive (cumulative) and exclusive (self).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) used so far by process ``pid``, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class PgBackendsCpu:
    """CPU seconds of the PostgreSQL backends (on this host) whose ``application_name``
    is ``name``: one run's own connections, not the others' sharing the database."""

    def __init__(self, url: str, name: str) -> None:
        from sqlalchemy import create_engine, pool

        self.name = name
        self._engine = create_engine(url, poolclass=pool.NullPool)
        self._seen: dict[int, float] = {}

    def sample(self) -> dict[int, float]:
        """CPU seconds per backend now (those that ended keep their last sample)."""
        from sqlalchemy import text

        with self._engine.connect() as conn:
            pids = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :n"),
                {"n": self.name},
            ).scalars()
            for pid in pids:
                cpu = process_cpu(int(pid))
                if cpu is not None:
                    self._seen[int(pid)] = cpu
        return dict(self._seen)

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        return sum(v - before.get(pid, 0.0) for pid, v in after.items())

    def close(self) -> None:
        self._engine.dispose()


def pyspy_binary() -> str | None:
    """The py-spy executable: ``LR_BENCH_PYSPY``, else ``py-spy`` on PATH, else None."""
    named = os.environ.get("LR_BENCH_PYSPY")
    if named:
        return named if Path(named).exists() else None
    return shutil.which("py-spy")


class PySpy:
    """``py-spy record`` of one process into collapsed stacks (``--format raw``)."""

    def __init__(self, binary: str, pid: int, out: Path, rate: int = 100) -> None:
        self.out = out
        self._proc = subprocess.Popen(
            [
                binary,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                str(rate),
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self, timeout: float = 30.0) -> dict[str, int]:
        """Stop sampling; the collapsed stacks (``stack -> samples``), {} if none."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return read_collapsed(self.out)


def read_collapsed(path: Path) -> dict[str, int]:
    """Collapsed stacks (``frame;frame;... count`` per line) as ``stack -> count``."""
    stacks: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return stacks
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


def _short(frame: str) -> str:
    """``func (path/to/module.py:12)`` -> ``func (module.py)``: one name per function."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(where).parts
    return f"{name} ({'/'.join(parts[-2:])})" if where else name


def top_functions(stacks: dict[str, int], n: int = 15, within: str | None = None) -> dict[str, Any]:
    """The ``n`` functions with most samples inclusive and exclusive (fractions of all).

    ``within`` keeps only the stacks holding a frame that contains that text (one
    thread's work in a process that runs others).
    """
    if within is not None:
        stacks = {k: v for k, v in stacks.items() if within in k}
    total = sum(stacks.values())
    inclusive: Counter[str] = Counter()
    exclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        for f in set(frames):
            inclusive[f] += count
        exclusive[frames[-1]] += count
    if not total:
        return {"samples": 0, "cumulative": [], "self": []}

    def share(c: Counter[str]) -> list[list[Any]]:
        return [[f, round(v / total, 3)] for f, v in c.most_common(n)]

    return {"samples": total, "cumulative": share(inclusive), "self": share(exclusive)}


__all__ = [
    "PgBackendsCpu",
    "PySpy",
    "process_cpu",
    "pyspy_binary",
    "read_collapsed",
    "top_functions",
]
