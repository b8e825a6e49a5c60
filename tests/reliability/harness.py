"""Sites as real processes for the reliability tests, and their knobs.

A :class:`Deployment` is one source site ``a`` replicating to sink sites, each
an ``lr server`` subprocess, with a sink application process
(:mod:`tests.reliability.sink_app`) per sink. Any of them can be SIGKILLed and
restarted; :meth:`Deployment.verify` runs the verifier over the source's and
the sinks' records.

Knobs (environment, read only here):

* ``LR_RELIABILITY_SEED``: the seed of the random fault plan (printed by
  every test; set it to replay a failing run);
* ``LR_RELIABILITY_TRIALS``: trials per fault test (CI default: 2);
* ``LR_SOAK_SECONDS``: soak duration per backend (CI default: 15);
* ``LR_FUZZ_EXAMPLES``: hypothesis examples per bad-input property (CI default: 60).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from sqlalchemy.engine import Engine

from lr_client.store import create_engine, open_store
from tests.kit.procs import ROOT, LrServer, lr_env, tail, track
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.traffic import SourceApp, read_applied, read_sent, read_snapshots
from tests.kit.verifier import Report, verify
from tests.kit.wait import scaled, wait_for

SINK_APP = Path(__file__).with_name("sink_app.py")
#: Seconds after SIGTERM past which a sink application's stop counts as slow.
SLOW_STOP = 10.0


# -- knobs --------------------------------------------------------------------------------
def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip() else default


def reliability_seed() -> int:
    """``LR_RELIABILITY_SEED`` or a fresh random seed; printed so a failure can be replayed."""
    seed = _env_int("LR_RELIABILITY_SEED", random.SystemRandom().randrange(1, 2**31))
    print(f"\nLR_RELIABILITY_SEED={seed}")
    return seed


def trial_count(default: int = 2) -> int:
    return max(1, _env_int("LR_RELIABILITY_TRIALS", default))


def soak_seconds(default: int = 15) -> int:
    return max(5, _env_int("LR_SOAK_SECONDS", default))


def fuzz_examples(default: int = 60) -> int:
    return max(1, _env_int("LR_FUZZ_EXAMPLES", default))


# -- config files -------------------------------------------------------------------------
def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def tune_config(path: Path, sections: Mapping[str, Mapping[str, object]]) -> Path:
    """Set keys of ``[section]`` tables in a config written by ``write_config``.

    ``SiteSpec.extra`` is appended after the ``[[...]]`` arrays, so it cannot
    reach ``[replication]`` or ``[retry]``, which ``write_config`` already
    declares (TOML forbids a second ``[replication]``); this edits them in place.
    """
    lines = path.read_text().splitlines()
    for section, values in sections.items():
        header = f"[{section}]"
        if header not in lines:
            lines += [header] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
            continue
        start = lines.index(header) + 1
        end = start
        while end < len(lines) and not lines[end].startswith("["):
            end += 1
        keep = [ln for ln in lines[start:end] if ln.split("=", 1)[0].strip() not in values]
        lines[start:end] = keep + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def with_pg_setting(url: str, name: str, value: str) -> str:
    """Add ``-c name=value`` to a PostgreSQL URL's ``options`` (SQLite: unchanged)."""
    if not url.startswith("postgresql"):
        return url
    setting = f"-c{name}%3D{value}"
    if "options=" in url:
        return url.replace("options=", f"options={setting}%20", 1)
    return f"{url}{'&' if '?' in url else '?'}options={setting}"


def with_app_name(url: str, name: str) -> str:
    """Tag a PostgreSQL URL's connections with ``application_name`` (SQLite: unchanged)."""
    if not url.startswith("postgresql"):
        return url
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


# -- processes ----------------------------------------------------------------------------
class SinkProc:
    """The sink application (:mod:`tests.reliability.sink_app`) as a subprocess."""

    def __init__(
        self,
        url: str,
        log_path: Path,
        clients: Sequence[str],
        lease_seconds: float = 2.0,
        partitions: int = 1,
    ) -> None:
        self.url = url
        self.log_path = log_path
        self.clients = list(clients)
        self.lease_seconds = lease_seconds
        self.partitions = partitions
        self.ready = log_path.with_suffix(".ready")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SinkProc:
        """Start the process (see :meth:`wait_ready`)."""
        self.ready.unlink(missing_ok=True)
        args = [sys.executable, str(SINK_APP), "--url", self.url, "--ready", str(self.ready)]
        args += [f"--lease-seconds={self.lease_seconds}", f"--partitions={self.partitions}"]
        for c in self.clients:
            args += ["--client", c]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=lr_env(), cwd=ROOT
            )
        track(f"sink app {self.log_path.stem}", self.log_path, self.proc)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until its subscribers run (the sink's schema exists, its tables too)."""
        proc = self.proc
        assert proc is not None

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"sink app exited with {proc.returncode}\n{self.log()}")
            return self.ready.exists()

        wait_for(ready, timeout, what="the sink app ready", detail=self.log)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=scaled(10))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then wait; a stop slower than :data:`SLOW_STOP` s has the process
        write its threads' stacks to its log (SIGUSR1), one past ``timeout`` is killed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=scaled(SLOW_STOP))
            return
        except subprocess.TimeoutExpired:
            print(f"sink app {self.log_path.stem}: still running {SLOW_STOP} s after SIGTERM")
            self.proc.send_signal(signal.SIGUSR1)
        try:
            self.proc.wait(timeout=scaled(timeout))
        except subprocess.TimeoutExpired:
            self.kill()
        print(tail(self.log_path, 12000))

    def log(self) -> str:
        return tail(self.log_path, 4000)


def stop_server(server: LrServer) -> None:
    """SIGTERM, or SIGKILL if it does not stop (teardown must not fail on it)."""
    try:
        server.stop(timeout=20)
    except AssertionError:
        server.kill()


def rss_kib(pid: int) -> int:
    """Resident set size of a process (``VmRSS`` of ``/proc/<pid>/status``)."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", text, re.MULTILINE)
    assert match, text
    return int(match.group(1))


# -- a deployment -------------------------------------------------------------------------
ROLES = ("sender", "sink", "subscriber")


class Deployment:
    """Source ``a`` -> ``sinks``, as ``lr server`` processes plus sink application processes."""

    def __init__(
        self,
        tmp_path: Path,
        make_url: Callable[[str], str],
        sinks: Sequence[str] = ("b", "c"),
        *,
        clients: Sequence[str] = ("policy",),
        snapshot: str = "none",
        tune: Mapping[str, Mapping[str, object]] | None = None,
        sink_apps: bool = True,
        source_members: int = 1,
    ) -> None:
        self.tmp_path = tmp_path
        self.sinks = list(sinks)
        self.clients = list(clients)
        tag = uuid.uuid4().hex[:6]
        self.raw_urls = {s: make_url(s) for s in ["a", *self.sinks]}
        #: application_name of each process's connections (PostgreSQL): lr-<site>-<tag>, app-...
        self.app_names = {s: f"lr-{s}-{tag}" for s in self.raw_urls}
        self.app_names.update({f"app-{s}": f"app-{s}-{tag}" for s in self.sinks})
        self.ports = {s: free_port() for s in self.sinks}
        tune = {"retry": {"max_backoff": 0.5}, **(tune or {})}
        self.configs: dict[str, Path] = {}
        for s in self.sinks:
            spec = SiteSpec(
                s,
                with_app_name(self.raw_urls[s], self.app_names[s]),
                port=self.ports[s],
                sources=["a"],
                clients=self.clients,
            )
            self.configs[s] = tune_config(write_config(tmp_path, spec), tune)
        spec = SiteSpec(
            "a",
            with_app_name(self.raw_urls["a"], self.app_names["a"]),
            destinations=[(s, self.ports[s]) for s in self.sinks],
            clients=self.clients,
            snapshot=snapshot,
        )
        self.configs["a"] = tune_config(write_config(tmp_path, spec), tune)
        self.servers = {s: LrServer(self.configs[s]) for s in self.configs}
        #: The source's servers: "a" (member a-1), then "a#2" (a-2), ... on its one database.
        self.source_servers = ["a"] + [f"a#{n}" for n in range(2, source_members + 1)]
        if source_members > 1:
            for n, key in enumerate(self.source_servers, 1):
                self.servers[key] = LrServer(
                    self.configs["a"], args=["--member-id", f"a-{n}"], name=f"a-{n}"
                )
        self.apps = (
            {
                s: SinkProc(
                    with_app_name(self.raw_urls[s], self.app_names[f"app-{s}"]),
                    tmp_path / f"app-{s}.log",
                    self.clients,
                )
                for s in self.sinks
            }
            if sink_apps
            else {}
        )
        self._engines: dict[str, Engine] = {}
        self.events: list[str] = []

    def engine(self, site: str) -> Engine:
        if site not in self._engines:
            self._engines[site] = create_engine(self.raw_urls[site])
        return self._engines[site]

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> Deployment:
        """Start every process at once; return when the sinks listen and their apps run.

        Create the source application (its tables and the queue schema) first.
        """
        for server in self.servers.values():
            server.start()
        for app in self.apps.values():
            app.start()
        for s in self.sinks:
            self.servers[s].wait_listening(self.ports[s])
        for app in self.apps.values():
            app.wait_ready()
        return self

    def kill(self, role: str, site: str) -> None:
        """SIGKILL the ``role`` process ("sender", "sink" or "subscriber") of ``site``."""
        self.events.append(f"{time.strftime('%H:%M:%S')} kill {role} {site}")
        if role == "subscriber":
            self.apps[site].kill()
        else:
            self.servers[site].kill()

    def restart(self, role: str, site: str) -> None:
        """Start the process again (without waiting: the others retry meanwhile)."""
        self.events.append(f"{time.strftime('%H:%M:%S')} restart {role} {site}")
        if role == "subscriber":
            self.apps[site].start()
        else:
            self.servers[site].start()

    def site_of(self, role: str, rng: random.Random) -> str:
        return "a" if role == "sender" else rng.choice(self.sinks)

    def close(self) -> None:
        """SIGTERM everything at once, then wait (SIGKILL what does not stop)."""
        for app in self.apps.values():
            if app.proc is not None and app.proc.poll() is None:
                app.proc.terminate()
        running = [s for s in self.servers.values() if s.proc and s.proc.poll() is None]
        for server in running:
            server.signal(signal.SIGTERM)
        for app in self.apps.values():
            app.stop()
        for server in running:
            stop_server(server)
        for eng in self._engines.values():
            eng.dispose()

    def logs(self) -> str:
        parts = [f"--- {name}.log\n{srv.log()[-3000:]}" for name, srv in self.servers.items()]
        parts += [f"--- app-{s}.log\n{a.log()[-2000:]}" for s, a in self.apps.items()]
        return "\n".join(parts)

    # -- checking ---------------------------------------------------------------------
    def verify(self, source: SourceApp | None = None, sinks: Iterable[str] | None = None) -> Report:
        sinks = list(sinks) if sinks is not None else self.sinks
        applied = [a for s in sinks for a in read_applied(self.engine(s), s)]
        return verify(
            read_sent(self.engine("a"), "a"),
            applied,
            snapshots=read_snapshots(self.engine("a"), "a"),
            rolled_back=source.rolled_back if source else (),
            destinations=sinks,
        )

    def received_backlog(self) -> int:
        """Entries received at the sinks and not yet delivered to their listeners."""
        return sum(
            sum(open_store(self.engine(s)).inspection.queue_depths().values()) for s in self.sinks
        )

    def wait_drained(self, source: SourceApp | None = None, timeout: float = 120.0) -> Report:
        """Poll until nothing is missing and the receive queues are empty; the final report."""
        last: list[Report] = []

        def drained() -> Report | None:
            report = self.verify(source)
            last[:] = [report]
            if report.lost == 0 and report.snapshot_problems == 0 and not self.received_backlog():
                return report
            return None

        return wait_for(
            drained,
            timeout,
            0.25,
            what="every entry delivered and the receive queues empty",
            detail=lambda: "\n".join([last[0].summary() if last else "", *self.events]),
        )
