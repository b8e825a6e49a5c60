"""Transmit throughput: ``RoutingQueueClient`` against a plain INSERT, a naive outbox and PgQ.

    python bench/transmit.py [--seconds N] [--backend sqlite|postgresql|both]
                             [--out bench/results/transmit.json]
    python bench/transmit.py --async [--tasks 1,16] ...   (bench/transmit_async.py)

Entries per second with 1 KiB payloads, one entry per transaction and 100 per
transaction, to 1 and 8 destinations, on SQLite (a file in a temporary
directory, through lr_client.create_engine: WAL, synchronous=NORMAL) and
PostgreSQL (a schema per case in a throwaway database on the server of
$LR_BENCH_PG_URL, default postgresql://postgres@127.0.0.1:5432/test; a database
of its own, so other users of the server's test database stay out of it). Every system writes
through an application-style Session(engine) with one begin() per transaction, with the
same driver and commit pattern:

  ours    transmit_log_entry_message (1/txn) or transmit_log_entry_messages (100/txn)
  plain   INSERT of the same row (client name, payload, timestamp) into a bare table
          with an identity primary key (executemany for 100/txn)
  outbox  a naive outbox: one row per destination (payload duplicated), indexed by
          (destination, id) so a per-destination reader can find its rows
  pgq     pgq.insert_event into a PgQ queue (PostgreSQL, when the pgq extension is
          installed on the server; it is created in the throwaway database). ev_data
          is text, so the payload goes in as encode(payload, 'base64'); the
          destinations go in ev_extra1.

The cases of one group run interleaved (--rounds slices each, in rotating
order) and ratios are the median of per-round ratios, so load swings on a
shared machine hit every case alike. With --writers (the default) PostgreSQL
also runs the concurrent-writers section of bench/writers.py: 1, 4, 16 and 64
writer threads, each transaction an application row plus one entry, held open
0, 2 and 10 ms, for ours, plain and PgQ. PostgreSQL also runs 4 concurrent writers
(1 entry/txn, 1 destination) for ours and plain. Ours on PostgreSQL includes the
commit stamp each transmitting transaction writes at COMMIT; the positions its
sequencer writes after commit are counted in storage. Storage is
measured apart: --storage-entries entries into fresh tables, then bytes per
entry. --experiment adds a locally patched variant of ours (never the shipped
code) to test a suggested change side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import sys
import tempfile
import time
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402
from rich.console import Console  # noqa: E402
from sqlalchemy import (  # noqa: E402
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    text,
)
from sqlalchemy.engine import Engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_PG_URL,
    Measurement,
    PgDatabase,
    PgSchema,
    ServerCpu,
    SqlTrace,
    fmt_rate,
    fmt_ratio,
    interleaved,
    loadavg,
    machine_facts,
    paired_ratio,
    pg_facts,
    pg_relation_bytes,
    print_table,
    quote_ident,
    run_for,
    run_threads,
    sqlite_table_bytes,
    unique_name,
    write_json,
)
from bench.writers import (  # noqa: E402
    HOLD_MS,
    WRITER_COUNTS,
    WriterCell,
    WriterRatio,
    measure_writers,
    report_writers,
)
from lr_client import LRMessageWithDestinations, RoutingQueueClient, create_engine  # noqa: E402

PAYLOAD_BYTES = 1024
ENTRIES_PER_TXN = (1, 100)
DESTINATION_COUNTS = (1, 8)
CONCURRENT_WRITERS = 4
SOURCE_ID = "bench-src"
CLIENT_NAME = "bench"
DESTINATIONS = [f"site-{i}" for i in range(1, max(DESTINATION_COUNTS) + 1)]

#: Targets: measured and reported, never asserted.
TARGET_VS_PLAIN = 0.9
TARGET_VS_PGQ = 1.0
TARGET_STORAGE_8_VS_1 = 1.2

PGQ_INSTALL = "apt-get install postgresql-15-pgq3 pgqd; then CREATE EXTENSION pgq"

# -- the baselines' tables -------------------------------------------------------------

bench_meta = MetaData()
_Id = BigInteger().with_variant(Integer(), "sqlite")

plain_table = Table(
    "bench_plain",
    bench_meta,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("client_name", String(63), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("created_at", Double, nullable=False),
)

outbox_table = Table(
    "bench_outbox",
    bench_meta,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("destination", String(63), nullable=False),
    Column("client_name", String(63), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("created_at", Double, nullable=False),
)
Index("bench_outbox_dest", outbox_table.c.destination, outbox_table.c.id)

PLAIN_INSERT = text(
    "INSERT INTO bench_plain (client_name, payload, created_at) "
    "VALUES (:client_name, :payload, :created_at)"
)
_OUTBOX_INSERT = text(
    "INSERT INTO bench_outbox (destination, client_name, payload, created_at) "
    "VALUES (:destination, :client_name, :payload, :created_at)"
)
_PGQ_INSERT = text(
    "SELECT pgq.insert_event(:queue, 'lr', encode(:payload, 'base64'), :dests, :client_name, "
    "NULL, NULL)"
)


# -- where a system writes -----------------------------------------------------------------


@dataclass
class Slot:
    """A fresh database for one system: a SQLite file or a PostgreSQL schema/database."""

    backend: str
    engine: Engine
    schema: str | None = None  # PostgreSQL: the schema holding the system's tables


class System(ABC):
    """One way of durably queueing a payload for some destinations."""

    name: ClassVar[str]

    def __init__(self, slot: Slot, destinations: list[str]) -> None:
        self.slot = slot
        self.engine = slot.engine
        self.destinations = destinations

    @abstractmethod
    def setup(self) -> None: ...

    @abstractmethod
    def write(self, session: Session, payloads: list[bytes]) -> None:
        """The body of one application transaction."""

    @abstractmethod
    def tables(self) -> tuple[str | None, list[str]]:
        """(schema, tables) holding what this system stored; None is the slot's schema."""

    def stored_bytes(self) -> int:
        schema, tables = self.tables()
        with self.engine.connect() as conn:
            if self.slot.backend == "sqlite":
                return sqlite_table_bytes(conn, tables)
            return pg_relation_bytes(conn, schema or self.slot.schema or "public", tables)

    def vacuum(self) -> None:
        """PostgreSQL: VACUUM the tables (merges the GIN pending list, as autovacuum would)."""
        if self.slot.backend != "postgresql":
            return
        schema, tables = self.tables()
        where = quote_ident(schema or self.slot.schema or "public")
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in tables:
                conn.exec_driver_sql(f"VACUUM {where}.{quote_ident(table)}")


class Ours(System):
    name = "ours"

    def setup(self) -> None:
        self.client = RoutingQueueClient(self.engine, source_id=SOURCE_ID, client_name=CLIENT_NAME)
        self.client.store.create_schema()
        self.client.register_destinations(DESTINATIONS)

    def write(self, session: Session, payloads: list[bytes]) -> None:
        if len(payloads) == 1:
            self.client.transmit_log_entry_message(session, payloads[0], self.destinations)
        else:
            self.client.transmit_log_entry_messages(
                session, [LRMessageWithDestinations(p, self.destinations) for p in payloads]
            )

    def tables(self) -> tuple[str | None, list[str]]:
        if self.slot.backend == "sqlite":
            return None, ["lrq_send_log_entries"]
        # The entries, their commit stamps and what the sequencer wrote for them.
        return None, [
            "lrq_send_entries",
            "lrq_send_commits",
            "lrq_send_positions",
            "lrq_send_blocks",
        ]

    def stored_bytes(self) -> int:
        self.client.store.send.sequence()  # PostgreSQL: positions are written after commit
        return super().stored_bytes()


class Plain(System):
    name = "plain"

    def setup(self) -> None:
        bench_meta.create_all(self.engine, tables=[plain_table])

    def write(self, session: Session, payloads: list[bytes]) -> None:
        now = time.time()
        rows = [{"client_name": CLIENT_NAME, "payload": p, "created_at": now} for p in payloads]
        session.execute(PLAIN_INSERT, rows[0] if len(rows) == 1 else rows)

    def tables(self) -> tuple[str | None, list[str]]:
        return None, ["bench_plain"]


class Outbox(System):
    name = "outbox"

    def setup(self) -> None:
        bench_meta.create_all(self.engine, tables=[outbox_table])

    def write(self, session: Session, payloads: list[bytes]) -> None:
        now = time.time()
        rows = [
            {"destination": d, "client_name": CLIENT_NAME, "payload": p, "created_at": now}
            for p in payloads
            for d in self.destinations
        ]
        session.execute(_OUTBOX_INSERT, rows[0] if len(rows) == 1 else rows)

    def tables(self) -> tuple[str | None, list[str]]:
        return None, ["bench_outbox"]


class PgQ(System):
    name = "pgq"

    def setup(self) -> None:
        self.queue = unique_name("bench_q")
        with self.engine.begin() as conn:
            conn.execute(text("SELECT pgq.create_queue(:q)"), {"q": self.queue})
        self.fixed = {
            "queue": self.queue,
            "dests": ",".join(self.destinations),
            "client_name": CLIENT_NAME,
        }

    def write(self, session: Session, payloads: list[bytes]) -> None:
        rows = [{**self.fixed, "payload": p} for p in payloads]
        session.execute(_PGQ_INSERT, rows[0] if len(rows) == 1 else rows)

    def tables(self) -> tuple[str | None, list[str]]:
        with self.engine.connect() as conn:
            pfx, ntables = conn.execute(
                text("SELECT queue_data_pfx, queue_ntables FROM pgq.queue WHERE queue_name = :q"),
                {"q": self.queue},
            ).one()
        base = str(pfx).split(".", 1)[1]
        return "pgq", [base] + [f"{base}_{i}" for i in range(int(ntables))]


# -- experiments: locally patched variants of ours (not the shipped code) -------------------


@dataclass(frozen=True)
class Experiment:
    backend: str
    description: str
    insert: Callable[..., list[int]] | None = None
    ddl: tuple[str, ...] = ()


#: Locally patched variants of ours, by name.
EXPERIMENTS: dict[str, Experiment] = {
    # Without the destinations' own indexes (the stream tags that keep a destination's
    # read independent of what others hold): what they cost a transmit. (SQLite makes
    # a destination's only when its reads walk many entries of others.)
    "no-dest-index-pg": Experiment(
        "postgresql",
        "without the partial index per destination",
        ddl=tuple(f"DROP INDEX IF EXISTS lrq_send_positions_dest_{n}" for n in range(64)),
    ),
}


def experiment_kind(name: str) -> type[System]:
    exp = EXPERIMENTS[name]

    class Patched(Ours):
        def setup(self) -> None:
            super().setup()
            with self.engine.begin() as conn:
                for stmt in exp.ddl:
                    conn.exec_driver_sql(stmt)
            if exp.insert is not None:
                core = self.client.store.core  # type: ignore[attr-defined]
                core.insert_entries = types.MethodType(exp.insert, core)

    Patched.name = f"ours:{name}"
    return Patched


# -- backends --------------------------------------------------------------------------------


class Backend(ABC):
    name: ClassVar[str]

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.cpu: ServerCpu | None = None  # the database server's CPU, when visible

    @abstractmethod
    def slot(self) -> Slot: ...

    def pgq_slot(self) -> Slot | None:
        return None

    def facts(self) -> dict[str, Any]:
        return {}

    def make(self, kind: type[System], dests: int) -> System | None:
        slot = self.pgq_slot() if kind is PgQ else self.slot()
        if slot is None:
            return None
        system = kind(slot, DESTINATIONS[:dests])
        system.setup()
        return system


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, stack: contextlib.ExitStack) -> None:
        super().__init__(stack)
        self.dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lrbench-")))
        self.count = 0

    def slot(self) -> Slot:
        self.count += 1
        engine = create_engine(f"sqlite:///{self.dir / f'slot{self.count}.db'}")
        self.stack.callback(engine.dispose)
        return Slot("sqlite", engine)

    def facts(self) -> dict[str, Any]:
        return {"journal_mode": "wal", "synchronous": "NORMAL", "location": "a temp directory"}


class PostgresBackend(Backend):
    """Schemas in one throwaway database, which also holds PgQ.

    A database of its own, not just a schema: other schemas' writers (other
    tests, other stores) stay out of the measurement.
    """

    name = "postgresql"

    def __init__(self, stack: contextlib.ExitStack, url: str) -> None:
        super().__init__(stack)
        self.server_url = url
        self.url = url
        self.database: dict[str, Any] = {}
        self.pgq_status: dict[str, Any] = {"available": False, "reason": "not checked"}

    def open(self) -> None:
        try:
            db = self.stack.enter_context(PgDatabase(self.server_url, "lrbench"))
        except sqlalchemy.exc.DBAPIError as exc:
            self.database = {"throwaway": False, "warning": f"no CREATE DATABASE: {_first(exc)}"}
        else:
            self.url = db.url
            self.database = {"throwaway": True, "name": db.name}
        self.open_pgq()
        cpu = ServerCpu(self.url)
        self.stack.callback(cpu.close)
        self.database["server_cpu_visible"] = cpu.available
        if cpu.available and self.database["throwaway"]:
            self.cpu = cpu

    def slot(self) -> Slot:
        schema = self.stack.enter_context(PgSchema(self.url))
        return Slot("postgresql", schema.engine(), schema.name)

    def open_pgq(self) -> None:
        """Install pgq in the throwaway database (it creates its own schema ``pgq``)."""
        admin = create_engine(self.url, poolclass=sqlalchemy.pool.NullPool)
        try:
            with admin.connect() as conn:
                version = conn.execute(
                    text("SELECT default_version FROM pg_available_extensions WHERE name = 'pgq'")
                ).scalar()
            if version is None:
                reason = f"pgq not installed on the server: {PGQ_INSTALL}"
                self.pgq_status = {"available": False, "reason": reason}
                return
            if not self.database.get("throwaway"):
                reason = "no throwaway database to install pgq into"
                self.pgq_status = {"available": False, "reason": reason}
                return
            with admin.begin() as conn:
                conn.exec_driver_sql("CREATE EXTENSION pgq")
        except sqlalchemy.exc.DBAPIError as exc:
            self.pgq_status = {"available": False, "reason": f"cannot set up pgq: {_first(exc)}"}
            return
        finally:
            admin.dispose()
        self.pgq_status = {"available": True, "version": str(version)}

    def pgq_slot(self) -> Slot | None:
        if not self.pgq_status["available"]:
            return None
        engine = create_engine(self.url)
        self.stack.callback(engine.dispose)
        return Slot("postgresql", engine, "pgq")

    def facts(self) -> dict[str, Any]:
        admin = create_engine(self.url, poolclass=sqlalchemy.pool.NullPool)
        try:
            with admin.connect() as conn:
                return {**pg_facts(conn), "database": self.database}
        finally:
            admin.dispose()


def _first(exc: sqlalchemy.exc.DBAPIError) -> str:
    return (str(exc.orig) if exc.orig else str(exc)).strip().splitlines()[0]


@contextlib.contextmanager
def open_backend(name: str, pg_url: str) -> Iterator[Backend]:
    """The backend; everything it created is dropped on exit."""
    with contextlib.ExitStack() as stack:
        if name == "sqlite":
            yield SQLiteBackend(stack)
        else:
            backend = PostgresBackend(stack, pg_url)
            backend.open()
            yield backend


# -- measuring --------------------------------------------------------------------------------


@dataclass
class Cell:
    backend: str
    system: str
    entries_per_txn: int
    destinations: int
    writers: int
    entries: int
    seconds: float
    rate: float
    slice_rates: list[float]
    client_cpu_us_per_entry: float
    server_cpu_us_per_entry: float | None  # PostgreSQL backends; None when not visible


@dataclass
class Ratio:
    backend: str
    system: str
    entries_per_txn: int
    destinations: int
    writers: int
    baseline: str
    ratio: float  # median of per-round ratios
    ratio_of_totals: float
    cpu_ratio: float | None  # baseline CPU per entry / ours: the ratio if CPU-bound
    target: float | None
    met: bool | None


@dataclass
class Storage:
    backend: str
    system: str
    destinations: int
    entries: int
    state: str  # "inserted", or "vacuumed" (PostgreSQL, after VACUUM)
    bytes: int
    bytes_per_entry: float


def make_step(
    system: System,
    per_txn: int,
    payloads: Sequence[bytes],
    trace: SqlTrace | None = None,
    label: str = "",
) -> Callable[[], int]:
    """One application transaction of ``per_txn`` entries per call."""
    pool = itertools.cycle(payloads)
    engine = system.engine

    def step() -> int:
        batch = [next(pool) for _ in range(per_txn)]
        with Session(engine) as session, session.begin():
            system.write(session, batch)
        return per_txn

    if trace is None:
        return step

    def traced() -> int:
        with trace.section(label):
            return step()

    return traced


def timed(step: Callable[[], int], cpu: ServerCpu | None, seconds: float) -> Measurement:
    return run_for(seconds, step, cpu)


def timed_threads(
    steps: Sequence[Callable[[], int]], cpu: ServerCpu | None, seconds: float
) -> Measurement:
    return run_threads(seconds, steps, cpu)


def kinds_for(backend: Backend, experiments: Sequence[str]) -> list[type[System]]:
    kinds: list[type[System]] = [Ours, Plain, Outbox]
    if backend.pgq_slot() is not None:
        kinds.append(PgQ)
    kinds += [experiment_kind(e) for e in experiments if EXPERIMENTS[e].backend == backend.name]
    return kinds


def measure_backend(
    backend: Backend,
    seconds: float,
    rounds: int,
    payloads: Sequence[bytes],
    experiments: Sequence[str],
    console: Console,
    trace: SqlTrace | None,
) -> tuple[list[Cell], dict[tuple[Any, ...], Measurement]]:
    systems: dict[tuple[str, int], System] = {}
    for dests in DESTINATION_COUNTS:
        for kind in kinds_for(backend, experiments):
            system = backend.make(kind, dests)
            if system is not None:
                systems[(kind.name, dests)] = system
                if trace is not None:
                    trace.attach(system.engine)
    cells: list[Cell] = []
    measured: dict[tuple[Any, ...], Measurement] = {}
    warm = min(0.3, seconds / 10)

    def record(name: str, per_txn: int, dests: int, writers: int, m: Measurement) -> None:
        measured[(backend.name, name, per_txn, dests, writers)] = m
        server = 1e6 * m.server_cpu / m.count if backend.cpu is not None else None
        cells.append(
            Cell(
                backend.name,
                name,
                per_txn,
                dests,
                writers,
                m.count,
                m.seconds,
                m.rate,
                m.slices,
                1e6 * m.client_cpu / m.count,
                server,
            )
        )

    for per_txn in ENTRIES_PER_TXN:
        for dests in DESTINATION_COUNTS:
            group = {name: s for (name, d), s in systems.items() if d == dests}
            console.log(f"{backend.name}: {per_txn}/txn, {dests} dest(s): {', '.join(group)}")
            cases: dict[str, Callable[[float], Measurement]] = {}
            for name, system in group.items():
                label = f"{backend.name} {name} {per_txn}/txn {dests}d"
                step = make_step(system, per_txn, payloads, trace, label)
                run_for(warm, step)
                cases[name] = functools.partial(timed, step, backend.cpu)
            for name, m in interleaved(cases, seconds, rounds).items():
                record(name, per_txn, dests, 1, m)
    if backend.name == "postgresql":
        console.log(f"{backend.name}: {CONCURRENT_WRITERS} concurrent writers, 1/txn, 1 dest")
        cases = {}
        for name in ("ours", "plain"):
            steps = [
                make_step(systems[(name, 1)], 1, [*payloads[i:], *payloads[:i]])
                for i in range(CONCURRENT_WRITERS)
            ]
            run_threads(warm, steps)
            cases[name] = functools.partial(timed_threads, steps, backend.cpu)
        for name, m in interleaved(cases, seconds, rounds).items():
            record(name, 1, 1, CONCURRENT_WRITERS, m)
    for system in systems.values():  # their pooled connections are not needed any more
        system.engine.dispose()
    return cells, measured


def measure_storage(
    backend: Backend, entries: int, payloads: Sequence[bytes], experiments: Sequence[str]
) -> list[Storage]:
    out: list[Storage] = []
    per_txn = 100
    txns = max(1, entries // per_txn)
    n = txns * per_txn
    for kind in kinds_for(backend, experiments):
        for dests in DESTINATION_COUNTS:
            system = backend.make(kind, dests)
            if system is None:
                continue
            step = make_step(system, per_txn, payloads)
            for _ in range(txns):
                step()
            size = system.stored_bytes()
            out.append(Storage(backend.name, kind.name, dests, n, "inserted", size, size / n))
            if backend.name == "postgresql":
                system.vacuum()
                size = system.stored_bytes()
                out.append(Storage(backend.name, kind.name, dests, n, "vacuumed", size, size / n))
            system.engine.dispose()
    return out


# -- reporting ---------------------------------------------------------------------------------


def ratios_of(measured: dict[tuple[Any, ...], Measurement]) -> list[Ratio]:
    targets = {"plain": TARGET_VS_PLAIN, "pgq": TARGET_VS_PGQ, "outbox": None, "ours": None}
    out = []
    for (backend, system, per_txn, dests, writers), m in measured.items():
        if not system.startswith("ours"):
            continue
        for baseline, target in targets.items():
            b = measured.get((backend, baseline, per_txn, dests, writers))
            if b is None or b is m or b.rate <= 0:
                continue
            ratio = paired_ratio(m, b)
            cpu = b.cpu_us_per_entry / m.cpu_us_per_entry if m.cpu_us_per_entry > 0 else None
            met = None if target is None or system != "ours" else ratio >= target
            out.append(
                Ratio(
                    backend,
                    system,
                    per_txn,
                    dests,
                    writers,
                    baseline,
                    ratio,
                    m.rate / b.rate,
                    cpu,
                    target,
                    met,
                )
            )
    return out


def storage_ratios(storage: list[Storage]) -> list[dict[str, Any]]:
    out = []
    by_key = {(s.backend, s.system, s.state, s.destinations): s for s in storage}
    lo, hi = min(DESTINATION_COUNTS), max(DESTINATION_COUNTS)
    for (backend, system, state, dests), s in by_key.items():
        if dests != lo or (backend, system, state, hi) not in by_key:
            continue
        ratio = by_key[(backend, system, state, hi)].bytes_per_entry / s.bytes_per_entry
        target = TARGET_STORAGE_8_VS_1 if system == "ours" else None
        out.append(
            {
                "backend": backend,
                "system": system,
                "state": state,
                "bytes_per_entry_1": s.bytes_per_entry,
                "bytes_per_entry_8": by_key[(backend, system, state, hi)].bytes_per_entry,
                "ratio_8_to_1": ratio,
                "target": target,
                "met": None if target is None else ratio <= target,
            }
        )
    return out


def report(
    console: Console,
    cells: list[Cell],
    ratios: list[Ratio],
    st_ratios: list[dict[str, Any]],
) -> None:
    rate = {(c.backend, c.system, c.entries_per_txn, c.destinations, c.writers): c for c in cells}
    ratio = {
        (x.backend, x.system, x.entries_per_txn, x.destinations, x.writers, x.baseline): x
        for x in ratios
    }

    def r(*key: Any) -> float | None:
        found = rate.get(key)
        return None if found is None else found.rate

    def q(*key: Any) -> float | None:
        found = ratio.get(key)
        return None if found is None else found.ratio

    def cpu_ratio(b: str, system: str, n: int, d: int, baseline: str) -> float | None:
        found = ratio.get((b, system, n, d, 1, baseline))
        return None if found is None else found.cpu_ratio

    rows = []
    exp_rows = []
    for c in cells:
        if c.writers != 1 or not c.system.startswith("ours"):
            continue
        b, n, d = c.backend, c.entries_per_txn, c.destinations
        if c.system == "ours":
            rows.append(
                [
                    b,
                    str(n),
                    str(d),
                    fmt_rate(c.rate),
                    fmt_rate(r(b, "plain", n, d, 1)),
                    fmt_rate(r(b, "outbox", n, d, 1)),
                    fmt_rate(r(b, "pgq", n, d, 1)),
                    fmt_ratio(q(b, "ours", n, d, 1, "plain"), TARGET_VS_PLAIN),
                    fmt_ratio(q(b, "ours", n, d, 1, "outbox")),
                    fmt_ratio(q(b, "ours", n, d, 1, "pgq"), TARGET_VS_PGQ),
                ]
            )
        else:
            exp_rows.append(
                [
                    b,
                    c.system,
                    str(n),
                    str(d),
                    fmt_rate(c.rate),
                    fmt_ratio(q(b, c.system, n, d, 1, "plain"), TARGET_VS_PLAIN),
                    fmt_ratio(q(b, "ours", n, d, 1, "plain")),
                    fmt_ratio(q(b, c.system, n, d, 1, "ours")),
                    fmt_ratio(cpu_ratio(b, c.system, n, d, "ours")),
                ]
            )
    print_table(
        console,
        "Transmit throughput, entries/s (1 KiB payloads, one writer)",
        ["db", "per txn", "dests", "ours", "plain", "outbox", "PgQ", "/plain", "/outbox", "/PgQ"],
        rows,
        caption=f"targets: ours/plain >= {TARGET_VS_PLAIN}, ours/PgQ >= {TARGET_VS_PGQ} "
        "(ratios: median of per-round ratios)",
    )
    rows = []
    for c in cells:
        if c.writers != 1 or c.system != "ours":
            continue
        b, n, d = c.backend, c.entries_per_txn, c.destinations

        def cpu(system: str, b: str = b, n: int = n, d: int = d) -> str:
            found = rate.get((b, system, n, d, 1))
            if found is None:
                return "-"
            shown = f"{found.client_cpu_us_per_entry:,.0f}"
            if found.server_cpu_us_per_entry is not None:
                shown += f" + {found.server_cpu_us_per_entry:,.0f}"
            return shown

        rows.append(
            [
                b,
                str(n),
                str(d),
                cpu("ours"),
                cpu("plain"),
                cpu("outbox"),
                cpu("pgq"),
                fmt_ratio(cpu_ratio(b, "ours", n, d, "plain"), TARGET_VS_PLAIN),
                fmt_ratio(cpu_ratio(b, "ours", n, d, "pgq"), TARGET_VS_PGQ),
            ]
        )
    print_table(
        console,
        "CPU per entry, microseconds (this process + PostgreSQL backends)",
        ["db", "per txn", "dests", "ours", "plain", "outbox", "PgQ", "plain/ours", "PgQ/ours"],
        rows,
        caption="less sensitive to a shared machine than entries/s; the ratio is the "
        "throughput ratio if CPU-bound (not for commit-bound 1/txn on PostgreSQL)",
    )
    conc = [c for c in cells if c.writers > 1]
    if conc:
        rows = []
        for c in conc:
            single = r(c.backend, c.system, 1, 1, 1)
            rows.append(
                [
                    c.backend,
                    c.system,
                    str(c.writers),
                    fmt_rate(c.rate),
                    fmt_rate(single),
                    fmt_ratio(c.rate / single if single else None),
                    fmt_ratio(q(c.backend, c.system, 1, 1, c.writers, "plain")),
                ]
            )
        print_table(
            console,
            "Concurrent writers (1 entry/txn, 1 destination)",
            ["db", "system", "writers", "entries/s", "1 writer", "scaling", "/plain"],
            rows,
            left=2,
        )
    if exp_rows:
        print_table(
            console,
            "Experiments: locally patched variants of ours (not the shipped code)",
            [
                "db",
                "variant",
                "per txn",
                "dests",
                "entries/s",
                "/plain",
                "ours/plain",
                "/ours",
                "CPU ours/variant",
            ],
            exp_rows,
            left=2,
        )
    rows = [
        [
            x["backend"],
            x["system"],
            x["state"],
            f"{x['bytes_per_entry_1']:,.0f}",
            f"{x['bytes_per_entry_8']:,.0f}",
            fmt_ratio(x["ratio_8_to_1"], x["target"], at_most=True),
        ]
        for x in st_ratios
    ]
    print_table(
        console,
        "Bytes stored per entry (tables + indexes)",
        ["db", "system", "state", "1 dest", "8 dests", "8/1"],
        rows,
        caption=f"target (ours): 8 destinations <= {TARGET_STORAGE_8_VS_1}x 1 destination",
        left=3,
    )


# -- entry point --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per case (3)")
    p.add_argument(
        "--backend", choices=["sqlite", "postgresql", "both"], default="both", help="(both)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (bench/results/transmit.json; with --async, transmit-async.json)",
    )
    p.add_argument(
        "--async",
        dest="run_async",
        action="store_true",
        help="the async API instead: AsyncRoutingQueueClient against a plain async INSERT\n"
        "on each async driver (bench/transmit_async.py)",
    )
    p.add_argument(
        "--tasks",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 16],
        help="--async: concurrent tasks per cell, comma-separated (1,16)",
    )
    p.add_argument("--rounds", type=int, default=5, help="interleaved slices per case (5)")
    p.add_argument(
        "--storage-entries",
        type=int,
        default=5000,
        help="entries written per case to measure bytes per entry (5000)",
    )
    p.add_argument(
        "--experiment",
        action="append",
        default=[],
        choices=sorted(EXPERIMENTS),
        help="add a locally patched variant of ours:\n"
        + "\n".join(f"  {k}: {v.description}" for k, v in EXPERIMENTS.items()),
    )
    p.add_argument(
        "--writers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PostgreSQL: the concurrent-writers section (bench/writers.py; default on)",
    )
    p.add_argument(
        "--writer-counts",
        type=lambda v: [int(x) for x in v.split(",")],
        default=list(WRITER_COUNTS),
        help="writer threads per cell, comma-separated (1,4,16,64)",
    )
    p.add_argument(
        "--hold-ms",
        type=lambda v: [int(x) for x in v.split(",")],
        default=list(HOLD_MS),
        help="milliseconds each transaction stays open after its writes (0,2,10)",
    )
    p.add_argument(
        "--trace-sql",
        action="store_true",
        help="print the SQL issued per transaction (slows every case)",
    )
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.storage_entries < 100:
        p.error("--seconds must be > 0, --rounds >= 1, --storage-entries >= 100")
    if any(n < 1 for n in args.writer_counts) or any(h < 0 for h in args.hold_ms):
        p.error("--writer-counts must be >= 1 and --hold-ms >= 0")
    if any(n < 1 for n in args.tasks):
        p.error("--tasks must be >= 1")
    if args.out is None:
        name = "transmit-async.json" if args.run_async else "transmit.json"
        args.out = ROOT / "bench" / "results" / name
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pg_url = os.environ.get("LR_BENCH_PG_URL", DEFAULT_PG_URL)
    console = Console(width=None if sys.stdout.isatty() else 130)
    names = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    payloads = [os.urandom(PAYLOAD_BYTES) for _ in range(1024)]
    if args.run_async:
        from bench import transmit_async

        done = transmit_async.run(args, names, pg_url, console, payloads)
        m = done["machine"]
        console.print(
            f"{m['cpus']} CPUs, load average {m['loadavg_at_start'][0]} at start, "
            f"{m['loadavg_at_end'][0]} at end; wrote {args.out} in {done['elapsed_seconds']} s"
        )
        return 0
    trace = SqlTrace() if args.trace_sql else None
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "transmit",
        "format": 1,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "seconds_per_case": args.seconds,
            "rounds": args.rounds,
            "payload_bytes": PAYLOAD_BYTES,
            "entries_per_txn": list(ENTRIES_PER_TXN),
            "destinations": list(DESTINATION_COUNTS),
            "concurrent_writers": CONCURRENT_WRITERS,
            "storage_entries": args.storage_entries,
            "backends": names,
            "experiments": args.experiment,
            "trace_sql": args.trace_sql,
        },
        "machine": machine_facts(),
        "backend_facts": {},
        "pgq": {"available": False, "reason": "PostgreSQL not benchmarked"},
        "targets": {
            "ours_vs_plain_at_least": TARGET_VS_PLAIN,
            "ours_vs_pgq_at_least": TARGET_VS_PGQ,
            "storage_8_vs_1_at_most": TARGET_STORAGE_8_VS_1,
        },
    }
    cells: list[Cell] = []
    measured: dict[tuple[Any, ...], Measurement] = {}
    storage: list[Storage] = []
    w_cells: list[WriterCell] = []
    w_ratios: list[WriterRatio] = []
    for name in names:
        with open_backend(name, pg_url) as backend:
            result["backend_facts"][name] = backend.facts()
            if isinstance(backend, PostgresBackend):
                result["pgq"] = backend.pgq_status
                if not backend.pgq_status["available"]:
                    console.log(f"PgQ baseline skipped: {backend.pgq_status['reason']}")
            c, m = measure_backend(
                backend, args.seconds, args.rounds, payloads, args.experiment, console, trace
            )
            cells += c
            measured.update(m)
            console.log(f"{name}: storage, {args.storage_entries} entries per case")
            storage += measure_storage(backend, args.storage_entries, payloads, args.experiment)
            if isinstance(backend, PostgresBackend) and args.writers:
                kinds = [k for k in (Ours, Plain, PgQ) if k is not PgQ or backend.pgq_slot()]
                systems = [s for s in (backend.make(k, 1) for k in kinds) if s is not None]
                w_cells, w_ratios = measure_writers(
                    systems,
                    args.seconds,
                    args.rounds,
                    payloads,
                    console,
                    args.writer_counts,
                    args.hold_ms,
                    backend.cpu,
                )
    ratios = ratios_of(measured)
    st_ratios = storage_ratios(storage)
    result["results"] = [asdict(c) for c in cells]
    result["ratios"] = [asdict(r) for r in ratios]
    result["storage"] = [asdict(s) for s in storage]
    result["storage_ratios"] = st_ratios
    result["writers"] = {
        "settings": {"writer_counts": args.writer_counts, "hold_ms": args.hold_ms},
        "results": [{**asdict(c), "entries_per_cpu_second": c.per_core} for c in w_cells],
        "ratios": [asdict(r) for r in w_ratios],
    }
    result["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    result["machine"]["loadavg_at_end"] = loadavg()
    report(console, cells, ratios, st_ratios)
    if w_cells:
        report_writers(console, w_cells, w_ratios)
    if trace is not None:
        print_table(
            console,
            "SQL per transaction (client-side time, traced run)",
            ["case", "statement", "calls/txn", "us/txn"],
            trace.rows(),
            left=2,
        )
    write_json(args.out, result)
    m = result["machine"]
    console.print(
        f"{m['cpus']} CPUs, load average {m['loadavg_at_start'][0]} at start, "
        f"{m['loadavg_at_end'][0]} at end; wrote {args.out} in {result['elapsed_seconds']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
