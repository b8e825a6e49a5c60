"""docs/quickstart.md, done as written: two ``lr server`` processes replicate to a listener.

The quick start's fenced blocks run in order in an empty temporary directory,
as a newcomer would run them, with real processes:

* the first ```bash block (create a virtualenv, ``pip install .``, make the
  directory) is the environment this suite already runs in: the package is
  installed from this tree, and ``lr`` and ``python`` are taken from the
  directory of the test's interpreter (first on ``PATH``), with this tree
  first on ``PYTHONPATH``; the test checks that block's text instead;
* a ```python block whose first line is ``# NAME.py`` is saved as ``NAME.py``;
* a ```bash block whose command ends with ``# keeps running`` (the doc opens
  a terminal for it) is started in the background, logging to a file, and
  stopped with SIGTERM at the end, when it must exit 0;
* any other ```bash block runs to completion and must exit 0;
* the last ```text block is what ``python sink.py`` prints: the test waits
  (with a deadline) until the sink has printed exactly those lines.

One substitution keeps the text literal and copy-pasteable: the doc's port
``7600`` is replaced, in every block, by a port reserved from
``tests.kit.ports``, so the test never collides with another process.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.kit.ports import reserve_port
from tests.kit.procs import ROOT, lr_env, tail, track
from tests.kit.wait import scaled, wait_for

QUICKSTART = ROOT / "docs" / "quickstart.md"
DOC_PORT = "7600"
KEEPS_RUNNING = "# keeps running"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)
INSTALL = [
    "python3.11 -m venv .venv && . .venv/bin/activate",
    "pip install .",
    "mkdir quickstart && cd quickstart",
]


def blocks() -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of the quick start, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(QUICKSTART.read_text())]


def quickstart_env() -> dict[str, str]:
    """The activated virtualenv of the doc: this interpreter's ``lr`` and ``python``."""
    env = lr_env()
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


class Background:
    """A command the doc leaves running in its own terminal."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], index: int) -> None:
        self.command = command
        self.log_path = cwd / f"terminal-{index}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        track(command, self.log_path, self.proc)

    def wait_listening(self, cwd: Path) -> None:
        """For ``lr server --config FILE`` whose site listens: wait until it accepts calls."""
        config = re.match(r"lr server --config (\S+)", self.command)
        if not config:
            return
        listen = tomllib.loads((cwd / config.group(1)).read_text())["site"].get("listen")
        if not listen:
            return
        host, port = listen.rsplit(":", 1)

        def accepting() -> bool:
            assert self.proc.poll() is None, self.output()
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    return True
            except OSError:
                return False

        wait_for(accepting, 60, what=f"{self.command!r} listening", detail=self.output)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=scaled(30))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=scaled(10))
                raise AssertionError(f"{self.command!r} did not stop on SIGTERM") from None
        return int(self.proc.returncode)


def test_install_block_installs_this_repository() -> None:
    lang, install = blocks()[0]
    assert (lang, install.splitlines()) == ("bash", INSTALL)
    # `pip install .` gives the `lr` command this suite's environment has.
    assert "lr = lr_server.cli:main" in (ROOT / "setup.cfg").read_text()
    assert (Path(sys.executable).parent / "lr").exists()


def test_quickstart_replicates_to_the_sink_listener(tmp_path: Path) -> None:
    port = str(reserve_port())
    env = quickstart_env()
    steps = [(lang, text.replace(DOC_PORT, port)) for lang, text in blocks()[1:]]
    expected = [text for lang, text in steps if lang == "text"][-1].splitlines()
    assert expected, "the quick start shows what the sink prints"

    running: list[Background] = []
    try:
        for lang, text in steps:
            first = text.splitlines()[0]
            if lang == "python":
                name = re.fullmatch(r"# (\w+\.py)", first)
                assert name, f"a python block starts with '# NAME.py': {first!r}"
                (tmp_path / name.group(1)).write_text(text)
            elif lang == "bash" and text.rstrip().endswith(KEEPS_RUNNING):
                assert len(text.strip().splitlines()) == 1, text
                running.append(Background(text.strip(), tmp_path, env, len(running) + 1))
                running[-1].wait_listening(tmp_path)
            elif lang == "bash":
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", text],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=scaled(120),
                )
                assert done.returncode == 0, (text, done.stdout, done.stderr)
            else:
                assert lang == "text", lang

        (sink,) = [p for p in running if p.command.startswith("python sink.py")]

        def printed() -> list[str]:
            return [line for line in sink.output().splitlines() if line.startswith("site-a #")]

        wait_for(
            lambda: len(printed()) >= len(expected),
            60,
            what="the sink listener printing every change",
            detail=lambda: "\n\n".join(f"{p.command}:\n{tail(p.log_path)}" for p in running),
        )
        assert printed() == expected
    finally:
        codes = {p.command: p.stop() for p in reversed(running)}
    assert set(codes.values()) == {0}, codes
