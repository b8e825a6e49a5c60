"""Real ``lr server`` processes, started from config files, replicate real traffic."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore, open_store
from tests.kit.procs import LrServer, stop_all
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config


def _received(store: SQLAlchemyQueueStore, source: str) -> list[bytes]:
    out: list[bytes] = []
    for q in store.queues.list_queues("policy"):
        if q.source_id == source:
            with store.read() as conn:
                out += [e.payload for e in store.queues.read_queue(conn, q.queue_id, 100_000)]
    return out


def test_two_sites_as_processes(tmp_path: Path, db_url_factory: Callable[[str], str]) -> None:
    port_b, port_c = free_port(), free_port()
    urls = {s: db_url_factory(s) for s in ("a", "b", "c")}
    cfg_a = write_config(
        tmp_path, SiteSpec("a", urls["a"], destinations=[("b", port_b), ("c", port_c)])
    )
    cfg_b = write_config(tmp_path, SiteSpec("b", urls["b"], port=port_b, sources=["a"]))
    cfg_c = write_config(tmp_path, SiteSpec("c", urls["c"], port=port_c, sources=["a"]))
    # Each database is set up before its server starts (as `lr init-db` does).
    stores = {s: open_store(urls[s]) for s in urls}
    for st in stores.values():
        st.create_schema()
    src = stores["a"]
    client = RoutingQueueClient(src, source_id="a", client_name="policy")
    client.register_destinations(["b", "c"])
    servers = [LrServer(cfg_b).start(), LrServer(cfg_c).start(), LrServer(cfg_a).start()]
    try:
        servers[0].wait_listening(port_b)
        servers[1].wait_listening(port_c)
        expected: dict[str, list[bytes]] = {"b": [], "c": []}
        for i in range(300):
            dests = [["b"], ["c"], ["b", "c"]][i % 3]
            with Session(src.engine) as session, session.begin():
                client.transmit_log_entry_message(session, b"%d" % i, dests)
            for d in dests:
                expected[d].append(b"%d" % i)
        sinks = {s: stores[s] for s in ("b", "c")}
        wait_for(
            lambda: all(_received(sinks[s], "a") == expected[s] for s in sinks),
            60,
            what="the 300 entries delivered in order to b and c",
            detail=lambda: {s: len(_received(sinks[s], "a")) for s in sinks},
        )
        # The sender's cursors are durable and its status is visible.
        for dest in ("b", "c"):
            wait_for(
                lambda d=dest: (
                    src.shipping.get_cursor(d, "policy").position == src.send.head_position()
                ),
                30,
                what=f"the cursor of {dest} at the head",
            )
        status = {r["destination"]: r for r in src.inspection.list_session_status()}
        assert set(status) == {"b", "c"}
    finally:
        codes = stop_all(servers)
        for st in stores.values():
            st.engine.dispose()
    assert codes == [0, 0, 0], [s.log() for s in servers]
    # Structured logs: every line of the sender's log is a JSON object naming the site.
    text = servers[2].log_path.read_text()
    lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    assert lines and all(x["site"] == "a" for x in lines)
