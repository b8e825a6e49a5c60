"""A sink listener that upserts into its own table, fed by two sites replicating over gRPC.

Site ``site-a`` (a sender) and ``site-b`` (a sink) run in this process on
loopback, each an embedded :class:`lr_server.Site` (what ``lr server`` runs);
the listener at ``site-b`` applies each change in the transaction in
which the delivered entries are deleted, so every change is applied exactly
once. It upserts by key, so a change seen twice (a full sync followed by the
log entries after its base position) leaves the same result.

Run: python examples/sink_listener.py
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, update
from sqlalchemy.orm import Session

from lr_client import (
    RoutingQueueClient,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
    create_engine,
)
from lr_server import Site, parse_config

meta = MetaData()
prices = Table(
    "prices", meta, Column("sku", String(20), primary_key=True), Column("cents", Integer)
)


class UpsertListener(RoutingQueueListener):
    """Applies ``{"sku": ..., "cents": ...}`` changes, idempotently per key."""

    def _apply(self, session: Session, messages: Sequence[RoutingQueueMessage]) -> None:
        for m in messages:
            change = json.loads(m.payload)
            done = session.execute(
                update(prices).where(prices.c.sku == change["sku"]).values(cents=change["cents"])
            )
            if not done.rowcount:
                session.execute(insert(prices).values(**change))

    def process_full_sync(self, session, source_id, messages):  # type: ignore[no-untyped-def]
        self._apply(session, messages)
        return True

    def process_log_entries(self, session, source_id, messages):  # type: ignore[no-untyped-def]
        self._apply(session, messages)
        return True


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _site(site_id: str, db: Path, listen: str = "", **sections: object) -> Site:
    raw: dict[str, object] = {
        "site": {"id": site_id, "database_url": f"sqlite:///{db}", "listen": listen},
        # Loopback only: plaintext must be chosen explicitly (use TLS between real sites).
        "security": {"transport": "plaintext", "client_auth": "token", "token": "a-secret"},
        "clients": [{"name": "prices"}],
        **sections,
    }
    return Site(parse_config(raw))


def main(directory: Path) -> dict[str, int]:
    port = _port()
    sink = _site(
        "site-b",
        directory / "b.db",
        listen=f"127.0.0.1:{port}",
        sources=[{"id": "site-a", "token": "a-secret"}],
    )
    source = _site(
        "site-a",
        directory / "a.db",
        destinations=[{"id": "site-b", "address": f"127.0.0.1:{port}"}],
    )
    # Entering starts each site and waits until it serves; leaving stops it.
    with sink, source:
        # The application at site-a.
        sender = RoutingQueueClient(source.store, source_id="site-a", client_name="prices")
        for sku, cents in [("tea", 350), ("cake", 420), ("tea", 375)]:
            with Session(source.store.engine) as session, session.begin():
                payload = json.dumps({"sku": sku, "cents": cents}).encode()
                sender.transmit_log_entry_message(session, payload, ["site-b"])

        # The application at site-b.
        engine = create_engine(f"sqlite:///{directory / 'b.db'}")
        meta.create_all(engine)
        stop = threading.Event()
        subscriber = RoutingQueueSubscriber(engine, "prices", UpsertListener(), poll_interval=0.05)
        worker = threading.Thread(target=subscriber.run, args=(stop,))
        worker.start()
        deadline = time.monotonic() + 30
        table: dict[str, int] = {}
        while time.monotonic() < deadline and table != {"tea": 375, "cake": 420}:
            time.sleep(0.1)
            with engine.connect() as conn:
                table = {r.sku: r.cents for r in conn.execute(select(prices))}
        stop.set()
        worker.join()
        subscriber.close()
        engine.dispose()
        return table


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print("site-b prices:", main(Path(tmp)))
