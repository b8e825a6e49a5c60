"""examples/fastapi_service end to end: a FastAPI order service transmits in its own
async transaction, real ``lr server`` processes ship, a FastAPI sink service's async
listener applies; what the client posted (and was accepted) is what the sink holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from examples.fastapi_service import orders_service, sink_service
from tests.kit.procs import ROOT, LrServer
from tests.kit.sites import free_port
from tests.kit.wait import Deadline

EXAMPLE = ROOT / "examples" / "fastapi_service"


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds, or fail after a (load-scaled) deadline."""
    deadline = Deadline(60)
    while not await check():
        assert not deadline.expired(), f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def _scenario(source_url: str, sink_url: str) -> None:
    source = orders_service.create_app(source_url, "site-a", ["site-b"], {"tea": 100, "cake": 2})
    sink = sink_service.create_app(sink_url)
    async with (
        source.router.lifespan_context(source),
        sink.router.lifespan_context(sink),
        _client(source) as shop,
        _client(sink) as replica,
    ):
        wanted = [("tea", 3), ("cake", 1), ("cake", 5), ("tea", 1), ("cake", 1), ("cake", 1)]
        accepted: list[dict[str, Any]] = []
        refused = 0
        for item, quantity in wanted:
            r = await shop.post("/orders", json={"item": item, "quantity": quantity})
            if r.status_code == 409:  # out of stock: the order and its entry rolled back
                refused += 1
                continue
            assert r.status_code == 201, r.text
            accepted.append({"source_id": "site-a", **r.json()})
        assert (await shop.post("/orders", json={"item": "", "quantity": 0})).status_code == 422
        assert refused == 2 and len(accepted) == 4
        placed = (await shop.get("/orders")).json()
        assert [o["id"] for o in placed] == [o["id"] for o in accepted]

        async def replicated() -> bool:
            return bool((await replica.get("/orders")).json() == accepted)

        await _until(replicated, "the sink service to hold every accepted order")


def _config(tmp_path: Path, site: str, url: str, port: int) -> Path:
    """The example's own config of ``site``, on this test's database and port."""
    text = (EXAMPLE / f"{site}.toml").read_text()
    assert f"sqlite:///{site}.db" in text and "127.0.0.1:50052" in text
    path = tmp_path / f"{site}.toml"
    path.write_text(
        text.replace(f"sqlite:///{site}.db", url).replace("127.0.0.1:50052", f"127.0.0.1:{port}")
    )
    return path


def test_an_order_posted_to_the_service_is_applied_by_the_sink_service_once(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    port = free_port()
    sink_url, source_url = db_url_factory("site-b"), db_url_factory("site-a")
    servers = [LrServer(_config(tmp_path, "site-b", sink_url, port)).start()]
    try:
        servers[0].wait_listening(port)
        servers.append(LrServer(_config(tmp_path, "site-a", source_url, port)).start())
        asyncio.run(_scenario(source_url, sink_url))
    finally:
        for server in servers:
            server.stop()
