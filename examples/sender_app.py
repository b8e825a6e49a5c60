"""The transactional sender: an application writes its own row and transmits, atomically.

Run: python examples/sender_app.py [DIRECTORY]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.orm import Session

from lr_client import LRMessageWithDestinations, RoutingQueueClient, create_engine

meta = MetaData()
orders = Table("orders", meta, Column("id", Integer, primary_key=True), Column("item", String(40)))


def main(directory: Path) -> None:
    engine = create_engine(f"sqlite:///{directory / 'site-a.db'}")
    meta.create_all(engine)
    client = RoutingQueueClient(engine, source_id="site-a", client_name="orders")
    client.create_schema()  # `lr init-db --config site-a.toml` does this for a real site
    client.register_destinations(["site-b", "site-c"])

    # 1. The order and its replication commit together.
    with Session(engine) as session, session.begin():
        session.execute(insert(orders).values(id=1, item="book"))
        client.transmit_log_entry_message(
            session, b'{"id": 1, "item": "book"}', ["site-b", "site-c"]
        )
        client.transmit_log_entry_messages(
            session,
            [
                LRMessageWithDestinations(b'{"audit": "order 1"}', ["site-b"]),
                LRMessageWithDestinations(b'{"stock": -1}', ["site-c"]),
            ],
        )

    # 2. A failed transaction sends nothing.
    try:
        with Session(engine) as session, session.begin():
            session.execute(insert(orders).values(id=2, item="lamp"))
            client.transmit_log_entry_message(session, b'{"id": 2}', ["site-b"])
            raise RuntimeError("payment declined")
    except RuntimeError as exc:
        print(f"transaction rolled back ({exc}): nothing queued for it")

    with engine.connect() as conn:
        print("orders:", conn.execute(select(func.count()).select_from(orders)).scalar())
    for dest in ("site-b", "site-c"):
        queued = client.store.shipping.read_log_entries(dest, "orders", 0, 100)
        print(f"queued for {dest}:", [(e.position, e.payload.decode()) for e in queued])
    engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
