"""The queue store contract, one module per role, on SQLite and PostgreSQL.

Each module exercises one role of the store (``Sites``, ``SendLog``,
``Shipping``, ``Snapshots``, ``Retention``, ``Receiving``,
``SubscriberQueues``, ``Inspection``) through that role's public methods
only: no table is read or written directly and no schema object is imported
(checks of rows and schema internals live in
``tests/integration/test_store_backends.py``).

A few methods run inside the caller's transaction and take its ``conn``
(``append_log_entries``, ``write_snapshot_entries``, ``read_queue``,
``save_state``, and optionally ``request_snapshot`` and
``head_position``). The tests take that connection from the store's own
transactions (:class:`~lr_client.store.contract.Transactions`), or, where the
application's transaction is what is tested, from ``app_transaction`` (a
plain ``engine.begin()``, as an application opens one). Nothing else of the
engine is used, but by the fixtures: they dispose of it at the end, and a
SQLite outage closes its pooled connections.

Each test types its store as the role it exercises (``store: QueueStore``), or
as :class:`~lr_client.store.contract.QueueStore` where another role arranges
the state; the fixtures give the real store.

Fixtures: ``store`` (a store with its schema), ``bare_store`` (a store on an
empty database), ``outage`` (loses the store's connections),
``connections`` (counts them) and ``app_transaction``, each on every backend
of ``db_url``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
import sqlalchemy
from sqlalchemy.engine import Connection

from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from tests.conftest import PG_URL
from tests.contract.outage import Outage


def _open(db_url: str) -> tuple[SQLAlchemyQueueStore, str]:
    """A store on ``db_url`` whose PostgreSQL connections carry a name of their own."""
    name = "" if db_url.startswith("sqlite") else "lr-contract-" + uuid.uuid4().hex[:12]
    args = {"connect_args": {"application_name": name}} if name else {}
    st = open_store(create_engine(db_url, **args))
    assert isinstance(st, SQLAlchemyQueueStore)
    return st, name


@pytest.fixture
def bare_store(db_url: str) -> Iterator[SQLAlchemyQueueStore]:
    """A store on an empty database: no schema."""
    st, _ = _open(db_url)
    yield st
    st.engine.dispose()


@pytest.fixture
def _store_and_name(db_url: str) -> Iterator[tuple[SQLAlchemyQueueStore, str]]:
    st, name = _open(db_url)
    st.create_schema()
    st.retention.rotation_period = (
        0.0  # PostgreSQL: a trim closes the current slot, so what is passed goes
    )
    yield st, name
    st.engine.dispose()


@pytest.fixture
def store(_store_and_name: tuple[SQLAlchemyQueueStore, str]) -> SQLAlchemyQueueStore:
    """An empty store with its schema, on each backend."""
    return _store_and_name[0]


@pytest.fixture
def app_transaction(
    store: SQLAlchemyQueueStore,
) -> Callable[[], AbstractContextManager[Connection]]:
    """Opens an application's transaction on the ``store`` fixture's database."""
    return store.engine.begin


@pytest.fixture
def outage(_store_and_name: tuple[SQLAlchemyQueueStore, str], db_url: str) -> Iterator[Outage]:
    """Cuts the ``store`` fixture's connections."""
    st, name = _store_and_name
    cut = Outage(st, db_url, name)
    yield cut
    cut.close()


@pytest.fixture
def connections(
    _store_and_name: tuple[SQLAlchemyQueueStore, str],
) -> Iterator[Callable[..., int]]:
    """How many database connections the ``store`` fixture holds open.

    PostgreSQL: the server's sessions of the store (``pg_stat_activity``;
    ``closing=True`` waits a moment for the sessions being closed to end);
    SQLite: the connections of the engine's pool.
    """
    st, name = _store_and_name
    if not name:

        def in_pool(closing: bool = False) -> int:
            pool: sqlalchemy.pool.QueuePool = st.engine.pool  # type: ignore[assignment]
            return pool.checkedin() + pool.checkedout()

        yield in_pool
        return
    admin = create_engine(PG_URL, poolclass=sqlalchemy.pool.NullPool)
    query = sqlalchemy.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n")

    def count(closing: bool = False) -> int:
        deadline = time.monotonic() + 5
        while True:
            with admin.connect() as conn:
                n = int(conn.execute(query, {"n": name}).scalar_one())
            if not closing or n == 0 or time.monotonic() > deadline:
                return n
            time.sleep(0.05)

    yield count
    admin.dispose()
