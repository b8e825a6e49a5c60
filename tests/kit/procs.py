"""Run ``lr server`` (and other helpers) as real subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lr_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


class LrServer:
    """``lr server --config FILE`` in a subprocess, logging to a file."""

    def __init__(self, config: Path, log_dir: Path | None = None) -> None:
        self.config = config
        self.log_path = (log_dir or config.parent) / f"{config.stem}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LrServer:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lr_server.cli", "server", "--config", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=lr_env(),
            cwd=ROOT,
        )
        log.close()
        return self

    def wait_listening(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"port {port} not listening after {timeout}s\n{self.log()}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError(f"did not stop on SIGTERM\n{self.log()}") from None
        return int(self.proc.returncode)

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-5000:]
        except FileNotFoundError:
            return ""
