"""The source service: ``POST /orders`` writes an order and transmits it, in one async
transaction.

The order row, the stock it takes and the entry for the sink sites commit
together or not at all: an order the stock cannot serve is refused (409) and
its transaction, entry included, rolls back. Run it with uvicorn next to the
site's ``lr server`` (see README.md)::

    LR_DATABASE_URL=sqlite:///site-a.db LR_DESTINATIONS=site-b \\
        uvicorn examples.fastapi_service.orders_service:app
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from lr_client.aio import AsyncRoutingQueueClient, create_async_engine

meta = MetaData()
orders = Table(
    "orders",
    meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("item", String(100), nullable=False),
    Column("quantity", Integer, nullable=False),
)
stock = Table(
    "stock",
    meta,
    Column("item", String(100), primary_key=True),
    Column("available", Integer, nullable=False),
)


class OrderIn(BaseModel):
    item: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0, le=1_000)


class OrderOut(BaseModel):
    id: int
    item: str
    quantity: int


def create_app(
    database_url: str,
    source_id: str,
    destinations: Sequence[str],
    initial_stock: Mapping[str, int],
    client_name: str = "orders",
) -> FastAPI:
    """The service on the source site's database (``database_url``, any URL that
    :func:`lr_client.aio.create_async_engine` takes)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_async_engine(database_url)
        async with engine.begin() as conn:
            await conn.run_sync(meta.create_all)
            known = set((await conn.execute(select(stock.c.item))).scalars())
            new = [{"item": k, "available": v} for k, v in initial_stock.items() if k not in known]
            if new:
                await conn.execute(insert(stock), new)
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        app.state.client = AsyncRoutingQueueClient.from_async_engine(engine, source_id, client_name)
        # Known to the site whether or not its lr server has started yet.
        await app.state.client.register_destinations(destinations)
        try:
            yield
        finally:
            await app.state.client.close()
            await engine.dispose()

    app = FastAPI(title="orders", lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def place_order(order: OrderIn) -> OrderOut:
        async with app.state.sessions() as session, session.begin():
            row = await session.execute(
                insert(orders)
                .values(item=order.item, quantity=order.quantity)
                .returning(orders.c.id)
            )
            placed = OrderOut(id=row.scalar_one(), item=order.item, quantity=order.quantity)
            await app.state.client.transmit_log_entry_message(
                session, placed.model_dump_json().encode(), list(destinations), key=str(placed.id)
            )
            taken = await session.execute(
                update(stock)
                .where(stock.c.item == order.item, stock.c.available >= order.quantity)
                .values(available=stock.c.available - order.quantity)
            )
            if not taken.rowcount:  # the order, and its entry, roll back with the exception
                raise HTTPException(409, f"not enough {order.item!r} in stock")
        return placed

    @app.get("/orders")
    async def list_orders() -> list[OrderOut]:
        async with app.state.sessions() as session:
            rows = await session.execute(select(orders).order_by(orders.c.id))
            return [OrderOut(id=r.id, item=r.item, quantity=r.quantity) for r in rows]

    return app


def _from_environment() -> FastAPI:
    return create_app(
        os.environ.get("LR_DATABASE_URL", "sqlite:///site-a.db"),
        os.environ.get("LR_SOURCE_ID", "site-a"),
        os.environ.get("LR_DESTINATIONS", "site-b").split(","),
        json.loads(os.environ.get("LR_STOCK", '{"tea": 100, "cake": 10}')),
    )


if os.environ.get("LR_DATABASE_URL"):  # uvicorn examples.fastapi_service.orders_service:app
    app = _from_environment()
