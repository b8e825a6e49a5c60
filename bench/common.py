"""Helpers shared by the benchmarks: timing loops, throwaway PostgreSQL schemas and
databases, storage sizes, machine facts, rich tables and JSON output.

Benchmarks are scripts (``python bench/<name>.py``); they read the environment
and their flags in ``main`` and pass explicit values to these helpers.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy
from rich.console import Console
from rich.table import Table
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine

from bench.cpu_profile import process_cpu
from lr_client import create_engine, open_store
from lr_client.store import SQLAlchemyQueueStore

#: Where the benchmarks find PostgreSQL unless ``LR_BENCH_PG_URL`` says otherwise.
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"

_IDENT_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def quote_ident(name: str) -> str:
    """A validated, quoted SQL identifier (only names the benchmarks generate)."""
    if _IDENT_RE.fullmatch(name) is None:
        raise ValueError(f"refusing identifier {name!r}")
    return f'"{name}"'


def unique_name(prefix: str) -> str:
    """``<prefix>_<random hex>``, checked to be a plain identifier."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    quote_ident(name)
    return name


# -- timing ------------------------------------------------------------------------------


@dataclass
class Measurement:
    """``count`` operations (entries) done in ``seconds`` of wall time.

    ``client_cpu`` is this process's CPU time, ``server_cpu`` that of the
    PostgreSQL backends (see :class:`ServerCpu`): unlike wall time, CPU per
    entry barely moves when other jobs share the machine.
    """

    count: int = 0
    seconds: float = 0.0
    slices: list[float] = field(default_factory=list)  # the rate of each timed slice
    client_cpu: float = 0.0
    server_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_entry(self) -> float:
        total = self.client_cpu + self.server_cpu
        return 1e6 * total / self.count if self.count else 0.0

    def add(self, other: Measurement) -> None:
        self.count += other.count
        self.seconds += other.seconds
        self.slices.append(other.rate)
        self.client_cpu += other.client_cpu
        self.server_cpu += other.server_cpu


class ServerCpu:
    """CPU seconds used by the backends connected to one database of a PostgreSQL
    server on this host (``/proc/<pid>/stat``), excluding its own connection.

    ``available`` is False when the server's processes cannot be seen (a remote
    server, another OS); then :meth:`sample` returns nothing.
    """

    def __init__(self, url: str) -> None:
        self._engine = create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        self._conn: Connection | None = self._engine.connect().execution_options(
            isolation_level="AUTOCOMMIT"
        )
        own = int(self._conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        self.available = process_cpu(own) is not None

    def sample(self) -> dict[int, float]:
        if not self.available or self._conn is None:
            return {}
        pids = self._conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalars()
        out = {}
        for pid in pids:
            cpu = process_cpu(int(pid))
            if cpu is not None:
                out[int(pid)] = cpu
        return out

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        return sum(v - before.get(pid, 0.0) for pid, v in after.items())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()


def paired_ratio(a: Measurement, b: Measurement) -> float:
    """Median over rounds of ``a``'s slice rate / ``b``'s (measured close in time).

    Robust to the load swings of a shared machine; falls back to total rates.
    """
    pairs = [x / y for x, y in zip(a.slices, b.slices, strict=False) if y > 0]
    if not pairs:
        return a.rate / b.rate if b.rate > 0 else 0.0
    return statistics.median(pairs)


def run_for(
    seconds: float, step: Callable[[], int], server: ServerCpu | None = None
) -> Measurement:
    """Call ``step`` (which returns how many entries it did) until ``seconds`` have passed."""
    before = server.sample() if server is not None else {}
    count = 0
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline or count == 0:
        count += step()
        now = time.perf_counter()
    client = time.process_time() - cpu
    used = ServerCpu.used(before, server.sample()) if server is not None else 0.0
    return Measurement(count, now - start, client_cpu=client, server_cpu=used)


def run_threads(
    seconds: float, steps: Sequence[Callable[[], int]], server: ServerCpu | None = None
) -> Measurement:
    """Run one thread per step function for ``seconds``; the aggregate rate."""
    stop = threading.Event()
    ready = threading.Barrier(len(steps) + 1)
    counts = [0] * len(steps)
    errors: list[BaseException] = []

    def worker(i: int, step: Callable[[], int]) -> None:
        ready.wait()
        try:
            while not stop.is_set():
                counts[i] += step()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=worker, args=(i, s), daemon=True) for i, s in enumerate(steps)
    ]
    for t in threads:
        t.start()
    before = server.sample() if server is not None else {}
    cpu = time.process_time()
    ready.wait()
    start = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    client = time.process_time() - cpu
    used = ServerCpu.used(before, server.sample()) if server is not None else 0.0
    if errors:
        raise errors[0]
    return Measurement(sum(counts), elapsed, client_cpu=client, server_cpu=used)


def interleaved(
    cases: dict[str, Callable[[float], Measurement]], seconds: float, rounds: int
) -> dict[str, Measurement]:
    """Give each case ``seconds`` in total, as ``rounds`` slices in rotating order.

    On a shared machine the load drifts; interleaving spreads the drift over
    every case, so ratios between cases are fairer than back-to-back runs.
    """
    names = list(cases)
    totals = {n: Measurement() for n in names}
    rounds = max(1, rounds)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            totals[name].add(cases[name](seconds / rounds))
    return totals


class SqlTrace:
    """Statements per transaction and their client-side time, per labelled case.

    ``attach`` an engine, then run each transaction inside ``section(label)``.
    The listeners cost time themselves: rates measured while tracing are not
    comparable with untraced ones.
    """

    def __init__(self) -> None:
        self.transactions: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.statements: dict[str, dict[str, list[float]]] = {}
        self._label: str | None = None
        self._started: dict[int, float] = {}

    def attach(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    @contextmanager
    def section(self, label: str) -> Iterator[None]:
        self._label = label
        start = time.perf_counter()
        try:
            yield
        finally:
            self._label = None
            self.transactions[label] = self.transactions.get(label, 0) + 1
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self._started[id(cursor)] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        started = self._started.pop(id(cursor), None)
        if self._label is None or started is None:
            return
        key = " ".join(statement.split())[:80]
        per_label = self.statements.setdefault(self._label, {})
        per_label.setdefault(key, []).append(time.perf_counter() - started)

    def rows(self) -> list[list[str]]:
        """Table rows: label, statement, calls per transaction, microseconds per transaction.

        The last row of each label is the rest of the transaction's time
        (BEGIN, COMMIT, pool checkout and Python).
        """
        out = []
        for label, txns in self.transactions.items():
            spent = 0.0
            for stmt, times in self.statements.get(label, {}).items():
                spent += sum(times)
                out.append(
                    [label, stmt, f"{len(times) / txns:.2f}", f"{1e6 * sum(times) / txns:,.0f}"]
                )
            rest = self.seconds[label] - spent
            out.append(
                [label, "(rest: BEGIN/COMMIT, checkout, Python)", "", f"{1e6 * rest / txns:,.0f}"]
            )
        return out


# -- PostgreSQL throwaways ------------------------------------------------------------


def sqlalchemy_pg_url(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg://``."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def _replace_database(url: str, database: str) -> str:
    parsed = sqlalchemy.make_url(sqlalchemy_pg_url(url))
    return parsed.set(database=database).render_as_string(hide_password=False)


class PgSchema:
    """A schema created on entry and dropped (with everything in it) on exit.

    ``url`` points at it through ``search_path``; :meth:`engine` makes engines
    (through :func:`lr_client.create_engine`) that are disposed on exit.
    """

    def __init__(self, admin_url: str, prefix: str = "lrbench") -> None:
        self.admin_url = admin_url
        self.name = unique_name(prefix)
        base = sqlalchemy_pg_url(admin_url)
        sep = "&" if "?" in base else "?"
        self.url = f"{base}{sep}options=-csearch_path%3D{self.name}"
        self._engines: list[Engine] = []
        self._admin: Engine | None = None

    def __enter__(self) -> PgSchema:
        self._admin = create_engine(self.admin_url, poolclass=sqlalchemy.pool.NullPool)
        with self._admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {quote_ident(self.name)}")
        return self

    def engine(self, **kwargs: Any) -> Engine:
        eng = create_engine(self.url, **kwargs)
        self._engines.append(eng)
        return eng

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for eng in self._engines:
            eng.dispose()
        if self._admin is not None:
            with self._admin.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quote_ident(self.name)} CASCADE")
            self._admin.dispose()


@contextmanager
def queue_store(
    backend: str, pg_url: str, name: str
) -> Iterator[tuple[SQLAlchemyQueueStore, str | None]]:
    """A queue store for one bench: SQLite, a ``<name>.db`` file in a temporary
    directory, or a throwaway PostgreSQL schema (``lrbench_<name>_...``), with the
    schema's name (None on SQLite). Its engine is disposed on exit."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="lrbench-") as tmp:
            engine = create_engine(f"sqlite:///{tmp}/{name}.db")
            try:
                yield open_store(engine), None
            finally:
                engine.dispose()
        return
    with PgSchema(pg_url, prefix=f"lrbench_{name}") as schema:
        yield open_store(schema.engine()), schema.name


class PgDatabase:
    """A database created on entry and dropped on exit (needs CREATEDB)."""

    def __init__(self, admin_url: str, prefix: str = "lrbench") -> None:
        self.admin_url = admin_url
        self.name = unique_name(prefix)
        self.url = _replace_database(admin_url, self.name)
        self._engines: list[Engine] = []
        self._admin: Engine | None = None

    def __enter__(self) -> PgDatabase:
        self._admin = create_engine(
            self.admin_url, poolclass=sqlalchemy.pool.NullPool, isolation_level="AUTOCOMMIT"
        )
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {quote_ident(self.name)}")
        return self

    def engine(self, **kwargs: Any) -> Engine:
        eng = create_engine(self.url, **kwargs)
        self._engines.append(eng)
        return eng

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for eng in self._engines:
            eng.dispose()
        if self._admin is not None:
            with self._admin.connect() as conn:
                conn.exec_driver_sql(
                    f"DROP DATABASE IF EXISTS {quote_ident(self.name)} WITH (FORCE)"
                )
            self._admin.dispose()


def pg_relation_bytes(conn: Connection, schema: str, tables: Sequence[str]) -> int:
    """``pg_total_relation_size`` (heap, TOAST, indexes, FSM/VM) summed over ``tables``;
    a partitioned table counts its partitions (its own size is 0)."""
    query = text(
        "SELECT COALESCE(SUM(pg_total_relation_size(x.rel)), 0) FROM ("
        " SELECT c.oid AS rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = :schema AND c.relname = ANY(:tables) AND c.relkind = 'r'"
        " UNION ALL"
        " SELECT t.relid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " CROSS JOIN LATERAL pg_partition_tree(c.oid) t"
        " WHERE n.nspname = :schema AND c.relname = ANY(:tables) AND c.relkind = 'p'"
        " AND t.isleaf) x"
    )
    return int(conn.execute(query, {"schema": schema, "tables": list(tables)}).scalar_one())


def pg_facts(conn: Connection, names: Sequence[str] = ()) -> dict[str, str]:
    """Server version and the settings ``names`` (by default those that decide
    commit-bound rates)."""
    names = list(names) or [
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "commit_delay",
        "shared_buffers",
    ]
    rows = conn.execute(
        text("SELECT name, setting FROM pg_settings WHERE name = ANY(:names)"), {"names": names}
    ).all()
    facts = {str(r[0]): str(r[1]) for r in rows}
    facts["server_version"] = str(conn.execute(text("SHOW server_version")).scalar_one())
    return facts


# -- SQLite ----------------------------------------------------------------------------


def sqlite_table_bytes(conn: Connection, tables: Sequence[str]) -> int:
    """Pages used by ``tables`` and their indexes (the ``dbstat`` virtual table)."""
    names = list(tables)
    for table in tables:
        rows = conn.execute(
            text("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = :t"),
            {"t": table},
        ).all()
        names.extend(str(r[0]) for r in rows)
    total = 0
    for name in names:
        value = conn.execute(
            text("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = :n"), {"n": name}
        ).scalar_one()
        total += int(value)
    return total


# -- the machine ---------------------------------------------------------------------


def loadavg() -> list[float]:
    """1, 5 and 15 minute load averages (zeros where the OS has none)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return [round(x, 2) for x in load]


def machine_facts() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": loadavg(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
    }


def process_rss(pid: int) -> int | None:
    """Resident set size of process ``pid`` in bytes (``VmRSS`` of Linux ``/proc``), or None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return None


# -- arithmetic ------------------------------------------------------------------------


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The slope of the least-squares line through ``(x, y)`` points (None for < 2 x values)."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def nice_ceiling(v: float) -> float:
    """The smallest 1/2/5 x 10^k at or above ``v`` (1 for ``v`` <= 0): a chart's axis end."""
    if v <= 0:
        return 1.0
    mag = 10 ** len(str(int(v))) / 10 if v >= 1 else 1.0
    for m in (1, 2, 5, 10):
        if m * mag >= v:
            return float(m * mag)
    return float(10 * mag)


# -- output ---------------------------------------------------------------------------


def svg_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass
class Series:
    """One line of a chart: ``(x, y)`` points, a colour, optionally dashed."""

    label: str
    colour: str
    points: list[tuple[float, float]]
    dashed: bool = False


@dataclass
class Panel:
    """One chart of :func:`panels_svg`: a y-axis label, its lines and vertical markers
    (``(x, text, colour)``: an event at ``x``, such as a destination dropped)."""

    ylabel: str
    series: list[Series]
    markers: list[tuple[float, str, str]] = field(default_factory=list)


def panels_svg(title: str, xlabel: str, panels: Sequence[Panel], width: int = 760) -> str:
    """Line charts stacked over one shared x axis, hand-written SVG (no plotting library).

    Each panel scales its y axis from 0 to a round number above its largest value; the
    legend (every distinct label, in the style of its first line) sits under the title.
    """
    left, right, top, panel_h, gap = 80, 20, 40, 130, 36
    legend: dict[str, Series] = {}
    for p in panels:
        for s in p.series:
            legend.setdefault(s.label, s)
    top += 18 * ((len(legend) + 1) // 2)
    height = top + len(panels) * (panel_h + gap) + 30
    pw = width - left - right
    xs = [x for p in panels for s in p.series for x, _ in s.points]
    xs += [x for p in panels for x, _, _ in p.markers]
    xmax = nice_ceiling(max(xs, default=1.0))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">'
        f"{svg_escape(title)}</text>",
    ]
    for i, s in enumerate(legend.values()):
        lx, ly = left + (i % 2) * pw / 2, 38 + 18 * (i // 2)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        out.append(
            f'<line x1="{lx}" y1="{ly}" x2="{lx + 30}" y2="{ly}" stroke="{s.colour}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 36}" y="{ly + 4}">{svg_escape(s.label)}</text>')
    for n, panel in enumerate(panels):
        y0 = top + n * (panel_h + gap)
        ymax = nice_ceiling(max((v for s in panel.series for _, v in s.points), default=1.0))

        def px(x: float) -> float:
            return left + pw * x / xmax

        def py(v: float, y0: float = y0, ymax: float = ymax) -> float:
            return y0 + panel_h * (1 - v / ymax)

        for i in range(5):
            v = ymax * i / 4
            out.append(
                f'<line x1="{left}" y1="{py(v):.1f}" x2="{left + pw}" y2="{py(v):.1f}" '
                'stroke="#ddd"/>'
            )
            out.append(
                f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:,.4g}</text>'
            )
        out += [
            f'<line x1="{left}" y1="{y0 + panel_h}" x2="{left + pw}" y2="{y0 + panel_h}" '
            'stroke="black"/>',
            f'<line x1="{left}" y1="{y0}" x2="{left}" y2="{y0 + panel_h}" stroke="black"/>',
            f'<text x="{left + 4}" y="{y0 - 6}">{svg_escape(panel.ylabel)}</text>',
        ]
        for t in range(6):
            x = xmax * t / 5
            out.append(
                f'<text x="{px(x):.1f}" y="{y0 + panel_h + 14}" text-anchor="middle">{x:g}</text>'
            )
        for s in panel.series:
            if not s.points:
                continue
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            poly = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in s.points)
            out.append(
                f'<polyline fill="none" stroke="{s.colour}" stroke-width="2"{dash} '
                f'points="{poly}"/>'
            )
        for i, (x, label, colour) in enumerate(panel.markers):
            out.append(
                f'<line x1="{px(x):.1f}" y1="{y0}" x2="{px(x):.1f}" y2="{y0 + panel_h}" '
                f'stroke="{colour}" stroke-dasharray="2 3"/>'
            )
            out.append(
                f'<text x="{px(x) + 4:.1f}" y="{y0 + 12 + 14 * i}" fill="{colour}">'
                f"{svg_escape(label)}</text>"
            )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">'
        f"{svg_escape(xlabel)}</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None, target: float | None = None, *, at_most: bool = False) -> str:
    """``0.93x``, coloured against a target (``at_most`` for a ceiling)."""
    if value is None:
        return "-"
    shown = f"{value:.2f}x"
    if target is None:
        return shown
    met = value <= target if at_most else value >= target
    return f"[green]{shown}[/]" if met else f"[red]{shown}[/]"


def print_table(
    console: Console,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    caption: str | None = None,
    left: int = 1,
) -> None:
    """A rich table; the first ``left`` columns are left-justified, the rest right."""
    table = Table(title=title, caption=caption, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i < left else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(data, "__dataclass_fields__"):
        data = asdict(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


__all__ = [
    "DEFAULT_PG_URL",
    "Measurement",
    "Panel",
    "PgDatabase",
    "PgSchema",
    "Series",
    "ServerCpu",
    "SqlTrace",
    "fmt_rate",
    "fmt_ratio",
    "interleaved",
    "least_squares_slope",
    "loadavg",
    "machine_facts",
    "nice_ceiling",
    "paired_ratio",
    "panels_svg",
    "pg_facts",
    "pg_relation_bytes",
    "print_table",
    "process_rss",
    "quote_ident",
    "run_for",
    "run_threads",
    "sqlite_table_bytes",
    "svg_escape",
    "unique_name",
    "write_json",
]
