"""The sink service: an async listener applies the orders of every source, exactly once,
as a task of the service's own event loop; ``GET /orders`` shows what it holds.

The listener writes with the ``AsyncSession`` it is given: its writes commit
with the mark that the entries were delivered, so each order is applied once
even if the service is killed mid-batch. It upserts by order id, so an order
seen in a full sync and again in the log after it leaves one row. Run it with
uvicorn next to the sink site's ``lr server`` (see README.md)::

    LR_DATABASE_URL=sqlite:///site-b.db uvicorn examples.fastapi_service.sink_service:app
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from lr_client import RoutingQueueMessage
from lr_client.aio import (
    AsyncRoutingQueueListener,
    AsyncRoutingQueueSubscriber,
    create_async_engine,
)

meta = MetaData()
applied = Table(
    "applied_orders",
    meta,
    Column("source_id", String(100), primary_key=True),
    Column("id", Integer, primary_key=True),
    Column("item", String(100), nullable=False),
    Column("quantity", Integer, nullable=False),
)


class AppliedOrder(BaseModel):
    source_id: str
    id: int
    item: str
    quantity: int


class OrdersListener(AsyncRoutingQueueListener):
    """Upserts each order by (source, id), in the delivery's transaction."""

    async def _apply(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        for m in messages:
            order = json.loads(m.payload)
            key = (applied.c.source_id == source_id) & (applied.c.id == order["id"])
            done = await session.execute(
                update(applied).where(key).values(item=order["item"], quantity=order["quantity"])
            )
            if not done.rowcount:
                await session.execute(insert(applied).values(source_id=source_id, **order))
        return True

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return await self._apply(session, source_id, messages)

    async def process_full_sync(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return await self._apply(session, source_id, messages)


def create_app(database_url: str, client_name: str = "orders") -> FastAPI:
    """The service on the sink site's database (``database_url``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_async_engine(database_url)
        async with engine.begin() as conn:
            await conn.run_sync(meta.create_all)
        app.state.sessions = async_sessionmaker(engine)
        subscriber = AsyncRoutingQueueSubscriber(engine, client_name, OrdersListener())
        stop = asyncio.Event()
        delivering = asyncio.create_task(subscriber.run(stop))
        try:
            yield
        finally:
            stop.set()
            await delivering
            await subscriber.close()
            await engine.dispose()

    app = FastAPI(title="orders sink", lifespan=lifespan)

    @app.get("/orders")
    async def list_orders() -> list[AppliedOrder]:
        async with app.state.sessions() as session:
            rows = await session.execute(
                select(applied).order_by(applied.c.source_id, applied.c.id)
            )
            return [
                AppliedOrder(source_id=r.source_id, id=r.id, item=r.item, quantity=r.quantity)
                for r in rows
            ]

    return app


if os.environ.get("LR_DATABASE_URL"):  # uvicorn examples.fastapi_service.sink_service:app
    app = create_app(os.environ["LR_DATABASE_URL"])
