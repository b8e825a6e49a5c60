"""Tracing across real processes: the source application (in this process, the SDK's
in-memory exporter), the source's and the sink's ``lr server`` (real processes under a
tracer provider that writes spans to a file: tests.kit.traced_server), the sink's
subscriber (in this process). One trace holds an entry's transmit, the ship of its
batch, its receive and its apply; each batch span links the entry with its source,
client and position. Without OpenTelemetry loaded, nothing of it is imported.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.orm import Session

from lr_client import (
    RoutingQueueClient,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
    tracing,
)
from lr_client.headers import TRACEPARENT, encode_headers
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from tests.kit.aio import SyncDriven
from tests.kit.procs import ROOT, LrServer, lr_env, stop_all
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.traced_server import read_spans, span_record
from tests.kit.wait import wait_for

_EXPORTER = InMemorySpanExporter()
LOG = ReplicationType.LOG_ENTRY_SYNC


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's spans (the global provider is set once per process); tracing is
    off again after the test, for the tests that follow in this process."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    tracing.enable(None)
    yield _EXPORTER
    tracing.enable(False)


class Applied(RoutingQueueListener):
    def __init__(self) -> None:
        self.seen: list[RoutingQueueMessage] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.seen += messages
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        pass

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        pass


def named(found: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in found if s["name"] == name]


def test_one_trace_links_transmit_ship_receive_apply(
    tmp_path: Path, db_url_factory: Callable[[str], str], spans: InMemorySpanExporter
) -> None:
    port_b = free_port()
    urls = {s: db_url_factory(s) for s in ("a", "b")}
    traced = "[tracing]\nenabled = true"
    cfg_a = write_config(
        tmp_path, SiteSpec("a", urls["a"], destinations=[("b", port_b)], extra=traced)
    )
    cfg_b = write_config(
        tmp_path, SiteSpec("b", urls["b"], port=port_b, sources=["a"], extra=traced)
    )
    files = {s: tmp_path / f"spans-{s}.jsonl" for s in ("a", "b")}
    stores = {s: open_store(urls[s]) for s in urls}
    client = RoutingQueueClient(stores["a"], source_id="a", client_name="policy")
    client.register_destinations(["b"])
    servers = [
        LrServer(cfg, launcher=["-m", "tests.kit.traced_server", str(files[s])]).start()
        for s, cfg in (("b", cfg_b), ("a", cfg_a))
    ]
    try:
        servers[0].wait_listening(port_b)
        tracer = trace.get_tracer("the-application")
        with (
            tracer.start_as_current_span("place-order"),
            Session(stores["a"].engine) as session,
            session.begin(),
        ):
            client.transmit_log_entry_message(
                session, b"order-1", ["b"], headers={"content-type": "application/json"}
            )
        listener = Applied()
        with RoutingQueueSubscriber(stores["b"], "policy", listener) as sub:
            wait_for(lambda: sub.poll_once() > 0 or bool(listener.seen), 60, what="the apply")
        wait_for(lambda: named(read_spans(files["a"]), "lr.ship"), 30, what="the ship span")
        wait_for(lambda: named(read_spans(files["b"]), "lr.receive"), 30, what="the receive")
    finally:
        codes = stop_all(servers)
        for st in stores.values():
            st.engine.dispose()
    assert codes == [0, 0]
    [message] = listener.seen
    assert message.headers["content-type"] == "application/json"
    assert TRACEPARENT in message.headers
    local = [span_record(s) for s in spans.get_finished_spans()]
    [app] = named(local, "place-order")
    [transmit] = named(local, "lr.transmit")
    [ship] = named(read_spans(files["a"]), "lr.ship")
    [receive] = named(read_spans(files["b"]), "lr.receive")
    [apply] = named(local, "lr.apply")
    assert transmit["parent_id"] == app["span_id"]
    assert transmit["attributes"] == {"lr.source": "a", "lr.client": "policy"}
    assert message.headers[TRACEPARENT].startswith(
        f"00-{transmit['trace_id']}-{transmit['span_id']}-"
    )
    entry = {"lr.source": "a", "lr.client": "policy", "lr.position": message.source_position}
    for span in (ship, receive, apply):
        assert span["trace_id"] == transmit["trace_id"], span["name"]
        assert span["parent_id"] == transmit["span_id"], span["name"]
        assert span["links"] == [
            {"trace_id": transmit["trace_id"], "span_id": transmit["span_id"], "attributes": entry}
        ], span["name"]
        assert span["attributes"]["lr.first_position"] == message.source_position
    assert ship["attributes"]["lr.to"] == "b" and receive["attributes"]["lr.from"] == "a"


@pytest.mark.parametrize("api", ["sync", "aio"])
def test_a_listener_applies_a_batch_in_a_span_linked_to_each_traced_entry(
    store: SQLAlchemyQueueStore, spans: InMemorySpanExporter, api: str
) -> None:
    """In process, both subscribers: one ``lr.apply`` span per batch, a child of the first
    traced entry's context, linked to each traced entry; an untraced batch makes none."""
    traces = [f"{0xA1 + i:032x}" for i in range(2)]
    parents = [f"{0xB1 + i:016x}" for i in range(2)]
    traced = [encode_headers({TRACEPARENT: f"00-{traces[i]}-{parents[i]}-01"}) for i in (0, 1)]
    entries = [
        WireEntry(1, LOG, b"1", headers=traced[0]),
        WireEntry(2, LOG, b"2"),
        WireEntry(3, LOG, b"3", headers=traced[1]),
    ]
    store.recv.apply_log_batch("src", "policy", entries)
    listener = Applied()
    sub: Any
    if api == "aio":
        sub = SyncDriven(store.engine.url.render_as_string(hide_password=False), "policy", listener)
    else:
        sub = RoutingQueueSubscriber(store, "policy", listener)
    with sub:
        assert sub.poll_once() == 3
    [apply] = [span_record(s) for s in spans.get_finished_spans() if s.name == "lr.apply"]
    assert (apply["trace_id"], apply["parent_id"]) == (traces[0], parents[0])
    links = [(x["trace_id"], x["span_id"], x["attributes"]["lr.position"]) for x in apply["links"]]
    assert links == [(traces[0], parents[0], 1), (traces[1], parents[1], 3)]
    assert (apply["attributes"]["lr.source"], apply["attributes"]["lr.client"]) == ("src", "policy")
    spans.clear()
    store.recv.apply_log_batch("src", "policy", [WireEntry(4, LOG, b"4")], previous_position=3)
    with RoutingQueueSubscriber(store, "policy", listener) as again:
        assert again.poll_once() == 1
    assert spans.get_finished_spans() == ()


def test_without_opentelemetry_loaded_nothing_of_it_is_imported(tmp_path: Path) -> None:
    """A transmit with headers, its ship, receive and apply code paths, and a server
    config without ``[tracing]``: no module of OpenTelemetry is imported."""
    script = textwrap.dedent(
        f"""
        import sys
        from sqlalchemy.orm import Session
        from lr_client import RoutingQueueClient, RoutingQueueSubscriber, RoutingQueueListener
        from lr_client.records import ReplicationType, WireEntry
        from lr_client.store import open_store
        import lr_server.server, lr_server.receiving.receiver, lr_server.sending.outbound
        from lr_server.config import load_config

        store = open_store("sqlite:///{tmp_path / "app.db"}")
        store.create_schema()
        client = RoutingQueueClient(store, "a", "policy")
        client.register_destinations(["b"])
        with Session(store.engine) as session, session.begin():
            client.transmit_log_entry_message(session, b"x", ["b"], headers={{"k": "v"}})
        entry = WireEntry(1, ReplicationType.LOG_ENTRY_SYNC, b"y")
        store.recv.apply_log_batch("b", "policy", [entry])

        class L(RoutingQueueListener):
            def process_log_entries(self, session, source_id, messages):
                return True
            def process_full_sync(self, session, source_id, messages):
                return True
            def on_full_sync_start(self, session, source_id, snapshot_id):
                pass
            def on_full_sync_end(self, session, source_id, snapshot_id):
                pass

        with RoutingQueueSubscriber(store, "policy", L()) as sub:
            assert sub.poll_once() == 1
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert loaded == [], loaded
        print("clean")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=lr_env(), cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "clean", done.stderr
