"""A source killed and restarted gets back in while idle calls flood its sink.

Real ``lr server`` processes on both backends. While the source replicates, the
sink receives a flood of calls that open and never send: anonymous ones and ones
with the source's own token (as a previous process, or someone holding its token,
could leave). The source is killed (SIGKILL) and restarted; everything it queued
before, during and after arrives, in order and once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore, open_store
from tests.kit.procs import LrServer
from tests.kit.rawgrpc import DEADLINE, Calls, code_of, token_meta
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config


def transmit(store: SQLAlchemyQueueStore, payloads: list[bytes]) -> None:
    client = RoutingQueueClient(store, source_id="a", client_name="policy")
    with Session(store.engine) as session, session.begin():
        for payload in payloads:
            client.transmit_log_entry_message(session, payload, ["sink"])


def received(store: SQLAlchemyQueueStore) -> list[bytes]:
    queues = [q for q in store.queues.list_queues("policy") if q.source_id == "a"]
    if not queues:
        return []
    with store.read() as conn:
        return [e.payload for e in store.queues.read_queue(conn, queues[0].queue_id, 10_000)]


def test_a_restarted_source_gets_in_through_a_flood_of_idle_calls(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    port = free_port()
    sink_url, source_url = db_url_factory("sink"), db_url_factory("a")
    src_store = open_store(source_url)
    src_store.create_schema()
    RoutingQueueClient(src_store, source_id="a", client_name="policy").register_destinations(
        ["sink"]
    )
    sink = LrServer(write_config(tmp_path, SiteSpec("sink", sink_url, port=port, sources=["a"])))
    spec = SiteSpec("a", source_url, destinations=[("sink", port)])
    source = LrServer(write_config(tmp_path, spec))
    calls = Calls(f"127.0.0.1:{port}")
    sink_store: SQLAlchemyQueueStore | None = None
    try:
        sink.start().wait_listening(port)
        sink_store = open_store(sink_url)
        source.start()
        sent = [b"before-%d" % i for i in range(20)]
        transmit(src_store, sent)
        wait_for(lambda: received(sink_store) == sent, DEADLINE)  # type: ignore[arg-type]

        anonymous = calls.flood([])
        as_source = calls.flood(token_meta("a"))
        source.kill()
        during = [b"during-%d" % i for i in range(20)]
        transmit(src_store, during)
        source.start()
        after = [b"after-%d" % i for i in range(20)]
        transmit(src_store, after)
        wait_for(
            lambda: received(sink_store) == sent + during + after,  # type: ignore[arg-type]
            DEADLINE,
        )
        assert [code_of(c) for c in anonymous] == [grpc.StatusCode.UNAUTHENTICATED] * len(anonymous)
        # The calls made with the source's token: at most its cap (4) of them stay open.
        wait_for(lambda: sum(not c.done() for c in as_source) <= 4, DEADLINE)
        assert all(f.sent == 0 for f in calls.feeds)
    finally:
        calls.close()
        source.kill()
        assert sink.stop() == 0, sink.log()
        src_store.engine.dispose()
        if sink_store is not None:
            sink_store.engine.dispose()
