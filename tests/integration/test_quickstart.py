"""docs/quickstart.md, done as written: two ``lr server`` processes replicate to a listener.

The quick start's fenced blocks run in order in an empty temporary directory,
as a newcomer would run them, with real processes:

* the first ```bash block (create a virtualenv, ``pip install .``, make the
  directory) is checked word for word and done without network: ``pip
  install .`` of a copy of what setup.cfg packages, into a directory first on
  ``PYTHONPATH`` and ``PATH`` (its ``lr``), with ``--no-deps`` since the
  dependencies are those of the test's own environment (whose ``python`` is
  the virtualenv's); the quick start then runs that installed copy;
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

import configparser
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.kit.ports import reserve_port
from tests.kit.procs import ROOT, tail, track
from tests.kit.wait import scaled, wait_for

QUICKSTART = ROOT / "docs" / "quickstart.md"
DOC_PORT = "7600"
KEEPS_RUNNING = "# keeps running"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: `pip install .` without network: the dependencies and the build backend (setuptools,
#: pinned in the `dev` extra: it builds wheels itself) are the test environment's.
OFFLINE = ["--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check"]
INSTALL = [
    "python3.11 -m venv .venv && . .venv/bin/activate",
    "pip install .",
    "mkdir quickstart && cd quickstart",
]


def blocks() -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of the quick start, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(QUICKSTART.read_text())]


def pip_install(tmp_path: Path) -> dict[str, str]:
    """``pip install .`` of the repository's packaging, offline; the environment using it."""
    src, target = tmp_path / "repository", tmp_path / "installed"
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    included = setup["options.packages.find"]["include"].split()
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in {name.split(".")[0] for name in included}:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *OFFLINE, "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    env = dict(os.environ)
    env["PYTHONPATH"] = str(target)
    env["PATH"] = os.pathsep.join([str(target / "bin"), str(Path(sys.executable).parent)])
    env["PATH"] += os.pathsep + os.environ.get("PATH", "")
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


def test_quickstart_replicates_to_the_sink_listener(tmp_path: Path) -> None:
    lang, install = blocks()[0]
    assert (lang, install.splitlines()) == ("bash", INSTALL)
    env = pip_install(tmp_path)
    work = tmp_path / "quickstart"
    work.mkdir()
    where = subprocess.run(
        ["bash", "-c", "command -v lr; python -c 'import lr_client; print(lr_client.__file__)'"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where == [
        str(tmp_path / "installed" / "bin" / "lr"),
        str(tmp_path / "installed" / "lr_client" / "__init__.py"),
    ]

    port = str(reserve_port())
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
                (work / name.group(1)).write_text(text)
            elif lang == "bash" and text.rstrip().endswith(KEEPS_RUNNING):
                assert len(text.strip().splitlines()) == 1, text
                running.append(Background(text.strip(), work, env, len(running) + 1))
                running[-1].wait_listening(work)
            elif lang == "bash":
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", text],
                    cwd=work,
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
