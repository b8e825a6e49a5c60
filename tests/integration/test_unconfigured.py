"""Trim judges entries by every registered destination, cached or not (both backends)."""

from __future__ import annotations

from sqlalchemy import select

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store import schema as s


def send(
    store: SQLAlchemyQueueStore, client: str, rows: list[tuple[bytes, list[str]]], source: str = "a"
) -> None:
    """Transmit as an application that registers every destination it addresses."""
    sender = RoutingQueueClient(store, source_id=source, client_name=client)
    sender.register_destinations(sorted({d for _, ds in rows for d in ds}))
    with store.engine.begin() as conn:
        for payload, dests in rows:
            sender.transmit_log_entry_message(conn, payload, dests)


def positions(store: SQLAlchemyQueueStore) -> list[int]:
    """Positions still stored in the send queue."""
    e = s.send_log_entries
    with store.read() as conn:
        return [int(r[0]) for r in conn.execute(select(e.c.position).order_by(e.c.position))]


def test_trim_keeps_what_a_destination_registered_since_still_needs(db_url: str) -> None:
    server = open_store(db_url)  # the server's store: its site cache predates z
    server.create_schema()
    server.register_sites(["b"])
    app = open_store(db_url)
    try:
        send(app, "policy", [(b"bz", ["b", "z"])] * 3 + [(b"b", ["b"])])
        server.set_cursor("b", "policy", 4)
        assert server.trim() == 1
        assert positions(server) == [1, 2, 3]
        assert app.backlog("z", "policy").entries == 3
    finally:
        server.engine.dispose()
        app.engine.dispose()
