"""``examples/deploy/``: the systemd unit passes ``systemd-analyze verify``.

The unit's ``ExecStart`` names the install path (``/opt/lr/bin/lr``), which
``verify`` requires to exist; the test checks a copy whose ``ExecStart`` names this
environment's ``lr`` instead, every other line as shipped. Any warning ``verify``
prints about the unit (an unknown key, a bad value) fails the test, not only errors.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.kit.guards import need
from tests.kit.procs import ROOT
from tests.kit.wait import scaled

UNIT = ROOT / "examples" / "deploy" / "lr-server.service"
INSTALLED = "/opt/lr/bin/lr"


def _lr_here() -> str:
    path = Path(sys.executable).with_name("lr")
    found = str(path) if path.exists() else shutil.which("lr")
    assert found, "the lr entry point is not installed in this environment"
    return found


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    need(tool, "systemd-analyze is not installed (Debian package systemd)")
    assert tool is not None
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} server --config " in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(INSTALLED, _lr_here()))
    done = subprocess.run(
        [tool, "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    about_unit = [line for line in (done.stdout + done.stderr).splitlines() if UNIT.name in line]
    assert done.returncode == 0, done.stdout + done.stderr
    assert about_unit == [], "\n".join(about_unit)


def test_the_unit_stops_with_sigterm_and_waits_past_the_servers_own_grace() -> None:
    text = UNIT.read_text()
    assert re.search(r"^KillSignal=SIGTERM$", text, re.MULTILINE)
    stop = re.search(r"^TimeoutStopSec=(\d+)$", text, re.MULTILINE)
    assert stop is not None
    # 5 s for batches in flight, then up to 10 s per thread joined (lr server's grace).
    assert int(stop.group(1)) >= 20
    assert re.search(r"^Restart=(always|on-failure)$", text, re.MULTILINE)
