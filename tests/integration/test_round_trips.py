"""PostgreSQL: the round trips a batch pays. The reads a sender makes per batch run
as statements, without a transaction (no ``BEGIN`` and ``COMMIT`` for them); a sink
takes a batch's stream lock and reads under it in one call."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg._connection_base import BaseConnection
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.recv import arrival_watch
from lr_server.sending.request_board import read_requests

pytestmark = pytest.mark.postgres


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The transaction commands psycopg sends (``BEGIN``, ``COMMIT``, ...) from now on, in
    this thread."""
    sent: list[bytes] = []
    me = threading.get_ident()
    real = BaseConnection._exec_command

    def recorded(self: Any, command: Any, *args: Any, **kw: Any) -> Any:
        if threading.get_ident() == me:
            sent.append(command if isinstance(command, bytes) else str(command).encode())
        return real(self, command, *args, **kw)

    monkeypatch.setattr(BaseConnection, "_exec_command", recorded)
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


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The statements psycopg's cursors run and copy from now on (SQLAlchemy's too), in
    this thread (the test kit's threads copy and drop databases meanwhile)."""
    ran: list[str] = []
    me = threading.get_ident()
    for name in ("execute", "copy"):
        real = getattr(psycopg.Cursor, name)

        def recorded(cur: Any, query: Any, *args: Any, _real: Any = real, **kw: Any) -> Any:
            if threading.get_ident() == me:
                ran.append(str(query))
            return _real(cur, query, *args, **kw)

        monkeypatch.setattr(psycopg.Cursor, name, recorded)
    yield ran


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_sink_locks_a_stream_reads_under_it_and_notifies_in_one_statement(
    db_url: str, store: SQLAlchemyQueueStore, statements: list[str]
) -> None:
    def batch(first: int, previous: int) -> list[WireEntry]:
        return [
            WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"e%d" % p) for p in (first, first + 1)
        ]

    assert store.recv.apply_log_batch("a", "app", batch(1, 0), 0) == (True, 2)
    listener = psycopg.connect(pg_url(store), autocommit=True)
    listener.execute(f"LISTEN {arrival_watch.CHANNEL}")
    statements.clear()
    assert store.recv.apply_log_batch("a", "app", batch(3, 2), 2) == (True, 4)
    assert [(n.channel, n.payload) for n in listener.notifies(timeout=5.0, stop_after=1)] == [
        (arrival_watch.CHANNEL, "app")
    ]
    listener.close()
    assert store.recv.apply_log_batch("a", "app", batch(3, 2), 2) == (False, 4)  # a repeat

    copies = [i for i, q in enumerate(statements) if q.startswith("COPY")]
    assert len(copies) == 1
    assert ["lrq_recv_lock" in q for q in statements[: copies[0]]] == [True]
    separate = ("pg_advisory_xact_lock", "lrq_recv_state", "pg_notify")
    assert not [q for q in statements if any(word in q for word in separate)]
    assert store.recv.sink_progress("a", "app").last_position == 4


def pg_url(store: SQLAlchemyQueueStore) -> str:
    """A libpq URL of the store's database (psycopg's own connection, to listen on)."""
    url = store.engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)
