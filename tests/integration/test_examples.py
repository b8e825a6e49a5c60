"""Every runnable example runs and does what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.kit.procs import ROOT, lr_env
from tests.kit.wait import scaled


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        env=lr_env(),
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_sender_app(tmp_path: Path) -> None:
    out = _run("sender_app.py", str(tmp_path))
    assert "orders: 1" in out
    assert "queued for site-b: [(1, " in out and '"audit": "order 1"' in out
    assert '"stock": -1' in out.split("queued for site-c:")[1]
    assert '"id": 2' not in out


def test_sink_listener() -> None:
    out = _run("sink_listener.py")
    assert "site-b prices: {'tea': 375, 'cake': 420}" in out or (
        "site-b prices: {'cake': 420, 'tea': 375}" in out
    ), out
