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
from tests.kit import procs  # noqa: E402
from tests.kit.guards import ON_CI, need  # noqa: E402
from tests.kit.ports import release_ports  # noqa: E402
from tests.kit.sites import Sites  # noqa: E402

__all__ = ["ON_CI", "PG_URL", "PgSchema", "pg_available", "require_pg"]

PG_URL = os.environ.get("LR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    release_ports()


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
    """A throwaway schema on the test server; ``url`` points at it."""

    def __init__(self) -> None:
        require_pg()
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


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL for an empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'site.db'}"
        return
    schema = PgSchema()
    try:
        yield schema.url
    finally:
        schema.drop()


@pytest.fixture
def db_url_factory(
    request: pytest.FixtureRequest, tmp_path: Path, db_url: str
) -> Iterator[Callable[[str], str]]:
    """More databases of the same backend as ``db_url`` (one per site)."""
    made: list[PgSchema] = []

    def make(name: str) -> str:
        if db_url.startswith("sqlite"):
            return f"sqlite:///{tmp_path / (name + '.db')}"
        schema = PgSchema()
        made.append(schema)
        return schema.url

    yield make
    for schema in made:
        schema.drop()


@pytest.fixture
def store(db_url: str) -> Iterator[SQLAlchemyQueueStore]:
    """An empty store with its schema, on each backend."""
    st = open_store(create_engine(db_url))
    st.create_schema()
    st.rotation_period = 0.0  # PostgreSQL: a trim closes the current slot, so what is passed goes
    yield st
    st.engine.dispose()


@pytest.fixture
def sites(tmp_path: Path, db_url_factory: Callable[[str], str]) -> Iterator[Sites]:
    """In-process sites (real gRPC on loopback), each with its own database of the backend."""
    s = Sites(tmp_path, db_url_factory)
    yield s
    s.close()
