"""What both demos share: sites as ``lr server`` processes, their applications, the check.

A :class:`Site` is a SQLite database and, once :func:`start_server` ran, an
``lr server`` process on a loopback port reserved for the whole demo
(:func:`stop_servers` stops them all). The applications keep their rows in
``demo_orders`` and ``demo_catalog``; a sink applies what it receives with
:class:`ApplyListener`. A demo ends with a table (:func:`summary_table`,
:func:`check_cell`) and :func:`report_check`: whether every sink holds what
it should, and the keys that differ where one does not.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, JustifyMethod
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy import Column, Integer, MetaData, String, insert, select, update
from sqlalchemy import Table as SqlTable
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.store import QueueStore, create_engine, open_store

# -- the applications' tables -----------------------------------------------------------------
app_meta = MetaData()
orders = SqlTable(
    "demo_orders", app_meta, Column("key", String(32), primary_key=True), Column("value", Integer)
)
catalog = SqlTable(
    "demo_catalog", app_meta, Column("key", String(32), primary_key=True), Column("value", Integer)
)


def encode(key: str, value: int) -> bytes:
    """A change as the entry's payload."""
    return json.dumps({"key": key, "value": value}, sort_keys=True, separators=(",", ":")).encode()


def upsert(session: Session, table: SqlTable, key: str, value: int) -> None:
    done = session.execute(update(table).where(table.c.key == key).values(value=value))
    if not getattr(done, "rowcount", 0):
        session.execute(insert(table).values(key=key, value=value))


def rows(engine: Engine, table: SqlTable) -> dict[str, int]:
    with engine.connect() as conn:
        return {r.key: r.value for r in conn.execute(select(table))}


class ApplyListener(RoutingQueueListener):
    """A sink application: upserts every change into its own table (idempotent per key)."""

    def __init__(self, table: SqlTable) -> None:
        self.table = table
        self.applied = 0
        self.snapshot_rows = 0

    def _apply(self, session: Session, messages: Sequence[RoutingQueueMessage]) -> None:
        for m in messages:
            row = json.loads(m.payload)
            upsert(session, self.table, str(row["key"]), int(row["value"]))

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._apply(session, messages)
        self.snapshot_rows += len(messages)
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._apply(session, messages)
        self.applied += len(messages)
        return True


# -- sites as processes -----------------------------------------------------------------------
@dataclass
class Site:
    id: str
    db: Path
    port: int = 0
    config: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    reserved: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def reserve_port(self) -> None:
        """Take a loopback port, bound (never listened on) until :func:`stop_servers`.

        The ``lr server`` child binds it too (gRPC sets ``SO_REUSEPORT``), while no
        other process can take it between its choice and the child's bind.
        """
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        self.reserved = s
        self.port = int(s.getsockname()[1])

    def open(self) -> tuple[Engine, QueueStore]:
        """The site's engine and queue store, the queue's and the applications' tables created."""
        engine = create_engine(self.url)
        store = open_store(engine)
        store.create_schema()
        app_meta.create_all(engine)
        return engine, store


def start_server(site: Site, workdir: Path, env: Mapping[str, str] | None = None) -> None:
    """Start ``lr server`` with the site's config (its log in ``workdir``); if the site
    has a port, return once the server listens there."""
    assert site.config is not None
    log = (workdir / f"{site.id}.log").open("ab")
    site.proc = subprocess.Popen(
        [sys.executable, "-m", "lr_server.cli", "server", "--config", str(site.config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    if not site.port:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if site.proc.poll() is not None:
            raise RuntimeError(f"lr server for {site.id} exited; see {workdir}")
        try:
            with socket.create_connection(("127.0.0.1", site.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"lr server for {site.id} did not start listening")


def stop_servers(sites: Iterable[Site]) -> None:
    """Terminate every running server, wait for each (killed after 20 s), release the ports."""
    sites = list(sites)
    for site in sites:
        if site.proc is not None and site.proc.poll() is None:
            site.proc.terminate()
    for site in sites:
        if site.proc is not None:
            try:
                site.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                site.proc.kill()
    for site in sites:
        if site.reserved is not None:
            site.reserved.close()


# -- the run and its report -------------------------------------------------------------------
def demo_console() -> Console:
    """At most 100 columns; paths and messages shown verbatim, never read as markup."""
    return Console(width=min(Console().width, 100), markup=False, emoji=False)


def run_in_workdir(prefix: str, demo: Callable[[Console, Path], bool], keep: bool) -> int:
    """Run ``demo`` in a new temporary directory; the exit code (1: a sink does not match).

    The directory is kept, and named, with ``keep`` or when the demo did not succeed.
    """
    console = demo_console()
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    ok = False
    try:
        ok = demo(console, workdir)
    finally:
        if keep or not ok:
            console.print(f"Databases, configs and logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


def demo_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def wait_caught_up(
    progress: Progress,
    description: str,
    total: int,
    caught_up: Callable[[], int],
    timeout: float = 120.0,
) -> None:
    """A bar of the sinks that match (``caught_up`` counts them), polled until all do
    or ``timeout`` s passed."""
    task = progress.add_task(description, total=total)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = caught_up()
        progress.update(task, completed=done)
        if done == total:
            return
        time.sleep(0.25)


def summary_table(title: str, columns: Sequence[tuple[str, JustifyMethod]]) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in columns:
        table.add_column(name, justify=justify)
    return table


def check_cell(found: Mapping[str, int], match: bool) -> Text:
    """A sink's check column: its row count if it holds what it should."""
    return Text(f"{len(found)} rows ok", "green") if match else Text("MISMATCH", "red")


def report_check(
    console: Console,
    ok: bool,
    success: str,
    expected: Mapping[str, Mapping[str, int]],
    actual: Mapping[str, Mapping[str, int]],
) -> None:
    """The verdict (``success``, or "Mismatch."), then the keys each sink holds wrong."""
    console.print(Text(success, "green") if ok else Text("Mismatch.", "red"))
    for name, found in actual.items():
        for line in differences(expected[name], found):
            console.print(f"  {name}: {line}")


def differences(
    expected: Mapping[str, int], actual: Mapping[str, int], limit: int = 5
) -> list[str]:
    """Up to ``limit`` keys where a sink differs from what it should hold."""
    keys = sorted(k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))
    lines = [f"{k}: expected {expected.get(k)}, found {actual.get(k)}" for k in keys[:limit]]
    if len(keys) > limit:
        lines.append(f"... and {len(keys) - limit} more keys")
    return lines
