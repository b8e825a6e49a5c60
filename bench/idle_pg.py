"""``bench/idle.py``'s PostgreSQL side: the sites' transactions and connections, and
whether the server has room for a cell's connections."""

from __future__ import annotations

import sqlalchemy
from sqlalchemy import text

from lr_client import create_engine


class PgWatch:
    """Transactions and connections of the sites' databases (``pg_stat_database``,
    ``pg_stat_activity``), read from the admin database."""

    def __init__(self, admin_url: str, databases: dict[str, tuple[str, str]]) -> None:
        self.databases = databases  # database name -> (role, site)
        self.engine = create_engine(
            admin_url, poolclass=sqlalchemy.pool.NullPool, isolation_level="AUTOCOMMIT"
        )
        self.conn = self.engine.connect()
        self.connections_max = dict.fromkeys(databases, 0)

    def transactions(self) -> dict[str, int]:
        rows = self.conn.execute(
            text(
                "SELECT datname, xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = ANY(:names)"
            ),
            {"names": list(self.databases)},
        ).all()
        return {str(r[0]): int(r[1]) for r in rows}

    def sample_connections(self) -> None:
        rows = self.conn.execute(
            text(
                "SELECT datname, count(*) FROM pg_stat_activity WHERE datname = ANY(:names) "
                "GROUP BY datname"
            ),
            {"names": list(self.databases)},
        ).all()
        for name, count in rows:
            self.connections_max[str(name)] = max(self.connections_max[str(name)], int(count))

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


#: Connections an idle site holds (seen on PostgreSQL 15 with the defaults): a sink's
#: database 3, plus 3 per client for its subscriber process (6 with one client, 9 with
#: two); the source's about 6 per member (6 with 1 or 8 destinations; counted as 8). A
#: cell is skipped unless the server has that many free plus this margin for its other
#: users.
PG_MARGIN = 10


def pg_connections_needed(
    backend: str, sink_backend: str, dests: int, clients: int, members: int
) -> int:
    """About how many PostgreSQL connections a cell holds (0 without PostgreSQL)."""
    need = members * 8 if backend == "postgresql" else 0
    if sink_backend == "postgresql":
        need += dests * (3 + 3 * clients)
    return need + PG_MARGIN if need else 0


def pg_free_connections(admin_url: str) -> int:
    """``max_connections`` less the reserved ones and those open now."""
    engine = create_engine(admin_url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT current_setting('max_connections')::int"
                        " - current_setting('superuser_reserved_connections')::int"
                        " - (SELECT count(*) FROM pg_stat_activity)"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()
