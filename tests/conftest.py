"""Shared fixtures: one store contract, run against SQLite and PostgreSQL.

PostgreSQL tests take their server from ``LR_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and isolate themselves in a
schema per test. Without a server they skip, except with ``CI=true``, where
an unreachable server fails the run (:func:`tests.kit.guards.need`).

When a test fails, the tail of the log of every process it started through
``tests.kit.procs`` (``lr server``, sink applications) is added to its report.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store  # noqa: E402
from tests.kit import procs, timing  # noqa: E402
from tests.kit.apps import App  # noqa: E402
from tests.kit.guards import ON_CI, need  # noqa: E402
from tests.kit.ports import release_ports  # noqa: E402
from tests.kit.sites import Sites  # noqa: E402
from tests.kit.spark_jvm import quick_spark_jvm  # noqa: E402
from tests.kit.templates import (  # noqa: E402
    PG_SCHEMA,
    database_url,
    drop_pg_database,
    finish_drops,
    migrated_pg_database,
    migrated_sqlite,
)

__all__ = ["ON_CI", "PG_URL", "PgSchema", "pg_available", "require_pg"]

PG_URL = os.environ.get("LR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

quick_spark_jvm()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    procs.forget_exited()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, show the log tail of each process the test (or its fixtures) started."""
    report = yield
    if report.failed:
        for title, text in procs.tracked_logs():
            report.sections.append((f"log of {title}", text or "(empty)"))
    return report


def pytest_configure(config: pytest.Config) -> None:
    timing.register(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test of the ``pg_schema`` fixture needs PostgreSQL too (``-m postgres`` selects it).

    The Spark tests go first: pytest-xdist's ``worksteal`` gives each worker a
    contiguous share of the collection and others steal from the end of a
    share, so one worker runs them all, from the start, on its one SparkSession.
    In the middle of the collection, workers stole them near the end of the run
    and each started Spark applications of its own while others did (two or
    three JVMs starting at once on two cores: 42.9-61.8 s for a test that takes
    16 s alone).

    With ``LR_TEST_ORDER=fastest-first`` (``scripts/mutate`` sets it) the folders of
    the fastest tests go first, unit tests before the store contract before the
    rest: mutmut hands pytest a mutant's tests in no order and stops at the first
    failure, so a mutant a unit test kills is not first run through the slow ones.
    """
    for item in items:
        if "pg_schema" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
    items.sort(key=lambda item: not item.nodeid.startswith("tests/spark/"))
    if os.environ.get("LR_TEST_ORDER") == "fastest-first":
        items.sort(key=_speed_rank)


#: The folders in the order of their tests' usual speed (``LR_TEST_ORDER``).
_FASTEST_FIRST = {"unit": 0, "contract": 1, "integration": 2}


def _speed_rank(item: pytest.Item) -> int:
    folder = Path(item.path).parent.name
    return _FASTEST_FIRST.get(folder, len(_FASTEST_FIRST))


def pytest_sessionfinish(session: pytest.Session) -> None:
    release_ports()
    # Test databases are released (renewed or dropped) in the background
    # (tests/kit/templates.py): wait for them, then drop the renewed ones.
    for database, error in finish_drops():
        sys.stderr.write(f"\ntest database {database} not released: {error}\n")


_pg_state: dict[str, object] = {}


def pg_available() -> bool:
    if "ok" not in _pg_state:
        try:
            eng = sqlalchemy.create_engine(
                "postgresql+psycopg://" + PG_URL.split("://", 1)[1],
                connect_args={"connect_timeout": 5},
            )
            with eng.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            eng.dispose()
            _pg_state["ok"] = True
        except Exception as exc:  # pragma: no cover - depends on the machine
            _pg_state["ok"] = False
            _pg_state["error"] = repr(exc)
    return bool(_pg_state["ok"])


def require_pg() -> None:
    need(pg_available(), f"PostgreSQL unreachable at {PG_URL}: {_pg_state.get('error')}")


class PgSchema:
    """A throwaway schema on the test server; ``url`` points at it.

    Empty, in the server's test database; or, ``migrated``, the schema ``lr``
    of a database of its own copied from a migrated template
    (:mod:`tests.kit.templates`). ``admin`` is an engine on the same
    database, outside that schema (advisory locks are per database).
    """

    def __init__(self, migrated: bool = False) -> None:
        require_pg()
        self.database: str | None = None
        if migrated:
            self.database = migrated_pg_database(PG_URL)
            self.name = PG_SCHEMA
            self.url = database_url(PG_URL, self.database)
            self.admin = create_engine(
                database_url(PG_URL, self.database, "public"), poolclass=sqlalchemy.pool.NullPool
            )
        else:
            self.name = "t_" + uuid.uuid4().hex[:12]
            self.admin = create_engine(PG_URL, poolclass=sqlalchemy.pool.NullPool)
            with self.admin.begin() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{self.name}"')
            base = "postgresql+psycopg://" + PG_URL.split("://", 1)[1]
            sep = "&" if "?" in base else "?"
            self.url = f"{base}{sep}options=-csearch_path%3D{self.name}"

        self._engines: list[Engine] = []

    def engine(self, **kwargs: object) -> Engine:
        eng = create_engine(self.url, **kwargs)  # type: ignore[arg-type]
        self._engines.append(eng)
        return eng

    def drop(self) -> None:
        for eng in self._engines:
            eng.dispose()
        if self.database is not None:
            self.admin.dispose()
            drop_pg_database(PG_URL, self.database)
            return
        with self.admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
        self.admin.dispose()


@pytest.fixture
def pg_schema() -> Iterator[PgSchema]:
    schema = PgSchema()
    try:
        yield schema
    finally:
        schema.drop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'site.db'}"


#: Fixtures that want ``db_url``'s database at the current schema revision.
STORE_FIXTURES = frozenset({"store", "_store_and_name"})


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL of each backend: an empty database, or, for a test that also
    asks for a store fixture (:data:`STORE_FIXTURES`), the migrated database of that
    store (a copy of one real migration, :mod:`tests.kit.templates`)."""
    migrated = not STORE_FIXTURES.isdisjoint(request.fixturenames)
    if request.param == "sqlite":
        path = tmp_path / "site.db"
        if migrated:
            migrated_sqlite(path)
        yield f"sqlite:///{path}"
        return
    schema = PgSchema(migrated)
    try:
        yield schema.url
    finally:
        schema.drop()


@pytest.fixture
def db_url_factory(
    request: pytest.FixtureRequest, tmp_path: Path, db_url: str
) -> Iterator[Callable[..., str]]:
    """More databases of the same backend as ``db_url`` (one per site).

    ``make(name)`` gives a database at the current schema revision (a copy of one
    real migration); ``make(name, migrated=False)`` an empty one.
    """
    made: list[PgSchema] = []

    def make(name: str, migrated: bool = True) -> str:
        if db_url.startswith("sqlite"):
            path = tmp_path / (name + ".db")
            if migrated:
                migrated_sqlite(path)
            return f"sqlite:///{path}"
        schema = PgSchema(migrated)
        made.append(schema)
        return schema.url

    yield make
    for schema in made:
        schema.drop()


@pytest.fixture
def store(db_url: str) -> Iterator[SQLAlchemyQueueStore]:
    """A store with its schema and nothing else, on each backend (``db_url``'s database)."""
    st = open_store(create_engine(db_url))
    st.create_schema()
    st.retention.rotation_period = (
        0.0  # PostgreSQL: a trim closes the current slot, so what is passed goes
    )
    yield st
    st.engine.dispose()


@pytest.fixture
def sites(
    request: pytest.FixtureRequest, tmp_path: Path, db_url_factory: Callable[[str], str]
) -> Iterator[Sites]:
    """In-process sites (real gRPC on loopback), each with its own database of the backend.

    In a test marked ``stop_calls_at_once`` a stopped site cancels the calls
    open to it after 0.1 s instead of its receiver's 2 s grace (a sender's
    stream never ends by itself, so each stop would wait that long).
    """
    s = Sites(tmp_path, db_url_factory)
    if request.node.get_closest_marker("stop_calls_at_once"):
        s.call_grace = 0.1
    yield s
    s.close()


@pytest.fixture
def flavour() -> str:
    """How the application transmits: ``sync`` unless the test is parametrised over
    every flavour (:func:`tests.kit.apps.every_flavour`)."""
    return "sync"


@pytest.fixture
def make_app(flavour: str) -> Iterator[Callable[..., App]]:
    """``make(store, source_id, client_name, **settings)``: a transmitting application of
    the test's flavour on ``store``'s database (:class:`tests.kit.apps.App`)."""
    made: list[App] = []

    def make(
        store: SQLAlchemyQueueStore,
        source_id: str = "site-a",
        client_name: str = "policy",
        **settings: object,
    ) -> App:
        app = App(store, flavour, source_id, client_name, **settings)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
