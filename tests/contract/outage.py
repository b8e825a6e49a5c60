"""A lost database connection, on each backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import sqlalchemy
from sqlalchemy.engine import Engine

from lr_client.store import SQLAlchemyQueueStore, create_engine
from tests.conftest import PG_URL


class Outage:
    """Loses every connection of a store, as a database restart or a network cut does.

    PostgreSQL: the server ends the store's sessions (``pg_terminate_backend``)
    and is reachable again at once. SQLite: the store's connections are closed
    and the database file cannot be opened until :meth:`end`.
    """

    def __init__(self, store: SQLAlchemyQueueStore, db_url: str, app_name: str) -> None:
        self.store = store
        self.app_name = app_name
        self.path = Path(db_url.split("///", 1)[1]) if db_url.startswith("sqlite") else None
        self.lasting = self.path is not None  #: calls fail until end()
        self._admin: Engine | None = None

    def begin(self) -> None:
        if self.path is None:
            self._admin = self._admin or create_engine(PG_URL, poolclass=sqlalchemy.pool.NullPool)
            with self._admin.begin() as conn:
                ended = conn.execute(
                    sqlalchemy.text(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name = :name"
                    ),
                    {"name": self.app_name},
                ).all()
            assert ended and all(ok for (ok,) in ended), "no connection of the store was ended"
            return
        self.store.engine.pool.dispose()  # the process's connections are gone
        self.path.rename(self.path.with_name(self.path.name + ".away"))
        self.path.mkdir()  # cannot be opened as a database

    def end(self) -> None:
        if self.path is None:
            return
        shutil.rmtree(self.path)
        self.path.with_name(self.path.name + ".away").rename(self.path)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.dispose()
