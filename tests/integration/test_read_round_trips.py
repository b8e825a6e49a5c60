"""PostgreSQL: the reads a sender makes per batch run as statements, without a
transaction, so a batch pays no ``BEGIN`` and ``COMMIT`` round trips for them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore
from lr_server.sending.request_board import read_requests

pytestmark = pytest.mark.postgres


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The transaction commands psycopg sends (``BEGIN``, ``COMMIT``, ...) from now on."""
    sent: list[bytes] = []
    base = psycopg.Connection.__mro__[1]  # psycopg's BaseConnection
    real = base._exec_command

    def recorded(self: Any, command: Any, *args: Any, **kw: Any) -> Any:
        sent.append(command if isinstance(command, bytes) else str(command).encode())
        return real(self, command, *args, **kw)

    monkeypatch.setattr(base, "_exec_command", recorded)
    yield sent


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batchs_reads_of_the_send_queue_and_requests_begin_no_transaction(
    db_url: str, store: SQLAlchemyQueueStore, commands: list[bytes]
) -> None:
    assert store.dialect == "postgresql"
    client = RoutingQueueClient(store.engine, source_id="a", client_name="app")
    client.register_destinations(["b"])
    with Session(store.engine) as session, session.begin():
        for n in range(3):
            client.transmit_log_entry_message(session, b"p%d" % n, ["b"])
    store.send.sequence()
    store.core.site_numbers()  # the sites' numbers, read once per store
    commands.clear()

    own = store.shipping.read_log_entries("b", "app", 0, 100)
    shared = store.shipping.read_client_log("app", 0, 100)
    board = read_requests(store)

    assert [e.payload for e in own] == [b"p0", b"p1", b"p2"]
    assert [e.payload for e in shared] == [b"p0", b"p1", b"p2"]
    assert board.snapshots == {} and board.drops == {} and board.replays == {}
    assert not [c for c in commands if c.strip().upper().startswith(b"BEGIN")], commands
