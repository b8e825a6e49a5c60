"""Run ``lr server`` (and other helpers) as real subprocesses.

Every process started through :func:`track` logs to a file; when a test
fails, ``tests/conftest.py`` appends the tail of each tracked process's log to
the failure report, so the reason a server did not deliver is on screen.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.kit.wait import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_CHARS = 6000


@dataclass
class Tracked:
    name: str
    log_path: Path
    proc: subprocess.Popen[bytes]


_tracked: list[Tracked] = []


def track(name: str, log_path: Path, proc: subprocess.Popen[bytes]) -> None:
    """Show ``log_path`` (``proc``'s output) in the report of a test that fails."""
    _tracked.append(Tracked(name, log_path, proc))


def forget_exited() -> None:
    """Drop processes that have ended (a new test starts; running ones stay shown)."""
    _tracked[:] = [t for t in _tracked if t.proc.poll() is None]


def tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" if there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def tracked_logs() -> list[tuple[str, str]]:
    """``(title, log tail)`` of every tracked process."""
    out = []
    for t in _tracked:
        state = "running" if t.proc.poll() is None else f"exit code {t.proc.returncode}"
        out.append((f"{t.name} (pid {t.proc.pid}, {state}): {t.log_path}", tail(t.log_path)))
    return out


def lr_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def stop_all(servers: Sequence[LrServer], timeout: float = 30.0) -> list[int]:
    """SIGTERM every running server at once, then wait for each; their exit codes.

    One after another, each stop waits while the servers still running retry
    the stopped ones; together they take about as long as the slowest. Each
    gets one SIGTERM only: a second one can land while the interpreter exits
    (its handlers reset) and end it with -15.
    """
    for server in servers:
        if server.proc is not None and server.proc.poll() is None:
            server.signal(signal.SIGTERM)
    codes = []
    for server in servers:
        proc = server.proc
        assert proc is not None
        try:
            proc.wait(timeout=scaled(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=scaled(10))
            raise AssertionError(f"did not stop on SIGTERM\n{server.log()}") from None
        codes.append(int(proc.returncode))
    return codes


class LrServer:
    """``lr server --config FILE`` in a subprocess, logging to a file."""

    def __init__(
        self,
        config: Path,
        log_dir: Path | None = None,
        args: Sequence[str] = (),
        name: str = "",
        launcher: Sequence[str] = ("-m", "lr_server.cli"),
    ) -> None:
        self.config = config
        #: What runs ``lr`` after the interpreter (a wrapper module and its arguments).
        self.launcher = list(launcher)
        self.name = name or config.stem
        self.log_path = (log_dir or config.parent) / f"{self.name}.log"
        self.args = list(args)  # more `lr server` options (--member-id, --listen, ...)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LrServer:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *self.launcher,
                "server",
                "--config",
                str(self.config),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=lr_env(),
            cwd=ROOT,
        )
        log.close()
        track(f"lr server {self.name}", self.log_path, self.proc)
        return self

    def wait_listening(self, port: int, timeout: float = 60.0) -> None:
        """Wait until the server accepts connections on ``port`` (fails if it exits)."""

        def listening() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return True
            except OSError:
                return False

        wait_for(listening, timeout, what=f"lr server listening on {port}", detail=self.log)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=scaled(10))

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=scaled(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=scaled(10))
                raise AssertionError(f"did not stop on SIGTERM\n{self.log()}") from None
        return int(self.proc.returncode)

    def log(self) -> str:
        """The log's tail (for failure messages)."""
        return tail(self.log_path)

    def full_log(self) -> str:
        """The whole log: count or search in this, since a flood of lines pushes any
        line out of the tail."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
