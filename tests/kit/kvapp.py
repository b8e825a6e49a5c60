"""A small key-value application used end to end: source writes, provider, sink listener.

The source keeps ``kv(key, value)`` and transmits every change as JSON in the
same transaction; the snapshot provider sends every row; the sink listener
upserts into its own ``kv`` table with the session it is given, so applying
a change twice is harmless (idempotent per key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.snapshot import SnapshotContext

meta = MetaData()
kv = Table("app_kv", meta, Column("key", String(64), primary_key=True), Column("value", Integer))
applied = Table(
    "app_applied",
    meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source", String(63)),
    Column("position", Integer),
    Column("kind", String(16)),
)


def encode(key: str, value: int) -> bytes:
    return json.dumps({"k": key, "v": value}, separators=(",", ":")).encode()


def upsert(session: Session, key: str, value: int) -> None:
    done = session.execute(update(kv).where(kv.c.key == key).values(value=value))
    if not done.rowcount:
        session.execute(insert(kv).values(key=key, value=value))


def write(
    engine: Engine,
    client: RoutingQueueClient,
    changes: dict[str, int],
    dests: Sequence[str],
    keyed: bool = False,
) -> None:
    """One application transaction: change rows and transmit the changes (with
    ``keyed``, each with its row's key as partition key)."""
    with Session(engine) as session, session.begin():
        for key, value in changes.items():
            upsert(session, key, value)
            client.transmit_log_entry_message(
                session, encode(key, value), list(dests), key=key if keyed else None
            )


def table(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {r.key: r.value for r in conn.execute(select(kv))}


def provider(engine: Engine):  # type: ignore[no-untyped-def]
    """An in-process snapshot provider sending every row of the source table."""

    def provide(ctx: SnapshotContext) -> None:
        rows = table(engine)
        ctx.transmit(encode(k, v) for k, v in sorted(rows.items()))

    return provide


class KvListener(RoutingQueueListener):
    """Applies changes to the sink's table in the delivering transaction."""

    def __init__(self) -> None:
        self.full_syncs: list[str] = []
        self.errors: list[BaseException] = []

    def _apply(self, session: Session, messages: Sequence[RoutingQueueMessage], kind: str) -> None:
        for m in messages:
            d = json.loads(m.payload)
            upsert(session, d["k"], d["v"])
            session.execute(
                insert(applied).values(source=m.source_id, position=m.source_position, kind=kind)
            )

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.full_syncs.append(snapshot_id)

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._apply(session, messages, "snapshot")
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self._apply(session, messages, "log")
        return True

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)
