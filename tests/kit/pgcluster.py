"""A PostgreSQL cluster of the test's own: ``initdb`` into a temporary directory, a free port.

The reliability nemesis crashes it (``pg_ctl stop -m immediate``: no shutdown
checkpoint, WAL recovery on the next start) and starts it again under traffic,
which the shared server of the suite cannot allow. ``initdb`` refuses to run
as root: as root, every command runs as the ``postgres`` OS user (``runuser``);
``scripts/ci-deps`` makes sure the binaries and the user exist.

Binaries: ``LR_PG_BINDIR``, else the directory of ``initdb`` on ``PATH`` (or
``/usr/local/bin``), else the newest ``/usr/lib/postgresql/*/bin``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PgCluster", "pg_bindir"]


def pg_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are (None: not installed)."""
    raw = os.environ.get("LR_PG_BINDIR", "").strip()
    if raw:
        return Path(raw)
    found = shutil.which("initdb") or (
        "/usr/local/bin/initdb" if Path("/usr/local/bin/initdb").exists() else None
    )
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


def _free_port() -> int:
    """A port free now (PostgreSQL binds without ``SO_REUSEPORT``: no reservation)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class PgCluster:
    """One cluster: :meth:`init` once, then :meth:`start`, :meth:`crash`, :meth:`start` ..."""

    def __init__(self, name: str = "pg", root: Path | None = None) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL binaries (initdb, pg_ctl) not found: scripts/ci-deps")
        self.bindir = bindir
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"lr-{name}-", dir=root))
        self.data = self.dir / "data"
        self.log_path = self.dir / "server.log"
        self.port = _free_port()
        self.crashes = 0
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")

    # -- commands ---------------------------------------------------------------------
    def _run(self, *args: str, timeout: float = 120.0) -> str:
        out = subprocess.run(
            [*_as_postgres(), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.dir,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stderr}{out.stdout}")
        return out.stdout

    def _ctl(self, *args: str, timeout: float = 120.0) -> str:
        return self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), *args, timeout=timeout)

    def init(self, settings: dict[str, str] | None = None) -> PgCluster:
        """``initdb`` (trust auth, user ``postgres``) and the server's settings."""
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.dir}'",
            "max_connections": "200",
            "shared_buffers": "32MB",
            "fsync": "off",  # the OS survives a crash of the server: its page cache is kept
            "full_page_writes": "off",
            "log_min_messages": "warning",
            **(settings or {}),
        }
        with (self.data / "postgresql.conf").open("a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())
        return self

    def start(self) -> None:
        """Start (after a crash: WAL recovery first); return once it accepts connections."""
        self._ctl("-l", str(self.log_path), "-w", "-t", "120", "start")

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every backend killed, no shutdown checkpoint."""
        self.crashes += 1
        self._ctl("-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        """A clean stop (ignored if it is not running)."""
        with contextlib.suppress(RuntimeError):
            self._ctl("-m", "fast", "-w", "stop")

    def running(self) -> bool:
        try:
            self._ctl("status")
        except RuntimeError:
            return False
        return True

    def remove(self) -> None:
        """Stop it and delete its directory."""
        if self.running():
            self._ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- databases --------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database_url(self, database: str, port: int | None = None) -> str:
        """The URL of ``database`` (through ``port``, a proxy's, if given)."""
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement with ``psql`` (autocommit: CREATE DATABASE may run)."""
        return self._run(
            str(self.bindir / "psql"),
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            database,
            "-c",
            statement,
        )

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        self.sql(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""
