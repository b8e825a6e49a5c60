"""The SQL an engine sends, for tests that count statements of a kind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event


@contextmanager
def recorded(engine: Engine) -> Iterator[list[str]]:
    """Every statement ``engine`` sends meanwhile, in order (``clear()`` it to start again)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)
