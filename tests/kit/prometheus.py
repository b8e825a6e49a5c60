"""A real Prometheus server and promtool (Debian's ``prometheus`` package) for tests.

:class:`Prometheus` runs the ``prometheus`` binary on a reserved loopback
port with its data in a directory of the test, logs to a file shown when the
test fails (:func:`tests.kit.procs.track`), and is killed when the ``with``
block ends. Without the binaries the tests that need them skip (on CI: fail)
through :func:`tests.kit.guards.need`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.kit.guards import need
from tests.kit.ports import reserve_port
from tests.kit.procs import tail, track
from tests.kit.wait import scaled, wait_for


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; skips (on CI: fails) if it is missing."""
    path = shutil.which(name)
    need(path, f"the {name} binary is not installed (Debian package prometheus)")
    assert path is not None
    return path


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS``; the completed process (output as text)."""
    return subprocess.run(
        [binary("promtool"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=scaled(60),
        check=False,
    )


class Prometheus:
    """``prometheus`` with ``config`` (YAML text) in ``directory``; a context manager."""

    def __init__(self, config: str, directory: Path) -> None:
        self.binary = binary("prometheus")
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path = directory / "prometheus.yml"
        self.config_path.write_text(config)
        self.log_path = directory / "prometheus.log"
        self.port = reserve_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
        )
        log.close()
        track("prometheus", self.log_path, self.proc)
        try:
            wait_for(self._ready, 60, what="Prometheus ready", detail=self.log)
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.kill()

    def kill(self) -> None:
        """SIGKILL: its data directory is the test's to throw away."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=scaled(10))

    def log(self) -> str:
        return tail(self.log_path)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of ``GET /api/v1/<path>?<params>``; fails with Prometheus's error."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=scaled(10)) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now: ``[{"metric": ..., "value": ...}]``."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def values(self, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
        """{values of ``labels``: sample value} of the series ``expr`` evaluates to."""
        return {
            tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1])
            for r in self.query(expr)
        }


__all__ = ["Prometheus", "binary", "promtool"]
