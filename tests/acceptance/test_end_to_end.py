"""Sender application -> ``lr server`` x2 (processes) -> subscriber -> the sink's own table."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from lr_client import RoutingQueueClient
from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import open_store
from lr_client.subscriber import RoutingQueueSubscriber
from tests.kit import kvapp
from tests.kit.procs import LrServer, stop_all
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config
from tests.kit.wait import scaled


def test_application_to_application(tmp_path: Path, db_url_factory: Callable[[str], str]) -> None:
    port_b = free_port()
    url_a, url_b = db_url_factory("a"), db_url_factory("b")
    cfg_a = write_config(
        tmp_path, SiteSpec("a", url_a, destinations=[("b", port_b)], snapshot="app")
    )
    cfg_b = write_config(tmp_path, SiteSpec("b", url_b, port=port_b, sources=["a"]))
    src, sink = open_store(url_a), open_store(url_b)
    for st in (src, sink):
        st.create_schema()
        kvapp.meta.create_all(st.engine)
    client = RoutingQueueClient(src, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    for i in range(100):  # written before replication starts: arrives by full sync
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"])

    listener = kvapp.KvListener()
    subscriber = RoutingQueueSubscriber(sink, "policy", listener, poll_interval=0.02)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    stop = threading.Event()
    loops = [threading.Thread(target=x.run, args=(stop,)) for x in (subscriber, runner)]
    servers = [LrServer(cfg_b).start(), LrServer(cfg_a).start()]
    try:
        servers[0].wait_listening(port_b)
        for t in loops:
            t.start()
        for i in range(200):  # and these as log entries, some while the snapshot runs
            kvapp.write(src.engine, client, {f"k{i % 150}": 1000 + i}, ["b"])
        wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=90)
    finally:
        stop.set()
        for t in loops:
            if t.is_alive():
                t.join(scaled(30))
        codes = stop_all(servers)
        subscriber.close()
        src.engine.dispose()
        sink.engine.dispose()
    assert codes == [0, 0], [s.log() for s in servers]
    assert len(listener.full_syncs) == 1
    assert listener.errors == []
