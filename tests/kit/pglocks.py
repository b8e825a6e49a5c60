"""PostgreSQL lock waits, for tests that must see a session blocked before going on."""

from __future__ import annotations

from sqlalchemy import Engine, text

_WAITING = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE application_name = :name AND wait_event_type = 'Lock'"
)


def waiting_for_a_lock(admin: Engine, application_name: str) -> bool:
    """Whether a session named ``application_name`` is waiting for a lock now."""
    with admin.connect() as conn:
        return bool(conn.execute(_WAITING, {"name": application_name}).scalar_one())
