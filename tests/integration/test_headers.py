"""Entry headers from transmit to the sink: stored once with the entry, validated
(bad ones write nothing), shipped over real gRPC, relayed through a cascade, and
never sent to a sink of an older wire protocol. Both backends; every sender flavour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from lr_client import (
    InvalidHeadersError,
    InvalidInputError,
    LRMessageWithDestinations,
    RoutingQueueClient,
)
from lr_client.headers import MAX_HEADERS, MAX_VALUE_BYTES, decode_headers
from lr_client.store import SQLAlchemyQueueStore
from lr_server.protocol import versions as protocol
from tests.kit.apps import App, every_flavour
from tests.kit.sites import CHAIN, Sites
from tests.kit.wait import scaled, wait_for

HEADERS = {"content-type": "application/json", "schema": "orders.v2", "note": "clé ✓"}


def stored(store: SQLAlchemyQueueStore, dest: str = "site-b") -> list[tuple[bytes, dict[str, str]]]:
    return [
        (e.payload, dict(decode_headers(e.headers)))
        for e in store.shipping.read_log_entries(dest, "policy", 0, 100)
    ]


@pytest.fixture
def app(store: SQLAlchemyQueueStore, make_app: Callable[..., App]) -> App:
    store.sites.register_sites(["site-b"])
    return make_app(store)


@every_flavour()
def test_headers_are_stored_once_with_their_entry(app: App) -> None:
    with app.transaction() as tx:
        tx.transmit(b"1", ["site-b"], headers=HEADERS)
        tx.transmit(b"2", ["site-b"])
        tx.transmit(b"3", ["site-b"], headers={})  # empty: none
        tx.transmit_many(
            [
                LRMessageWithDestinations(b"4", ["site-b"], key=b"k", headers={"a": "1"}),
                LRMessageWithDestinations(b"5", ["site-b"]),
                LRMessageWithDestinations(b"6", ["site-b"], headers={"b": ""}),
            ]
        )
    assert stored(app.store) == [
        (b"1", HEADERS),
        (b"2", {}),
        (b"3", {}),
        (b"4", {"a": "1"}),
        (b"5", {}),
        (b"6", {"b": ""}),
    ]
    log = app.store.shipping.read_client_log("policy", 0, 100)
    assert [e.headers is None for e in log] == [False, True, True, False, True, False]


BAD: list[Any] = [
    ["content-type"],  # not a mapping
    {"Content-Type": "x"},  # uppercase
    {"": "x"},
    {"-x": "x"},
    {"a b": "x"},
    {"x" * 65: "x"},
    {7: "x"},
    {"a": 7},
    {"a": "\ud800"},  # not encodable
    {"a": "x" * (MAX_VALUE_BYTES + 1)},
    {"a": "é" * (MAX_VALUE_BYTES // 2 + 1)},  # the limit is in bytes
    {f"h{i}": "" for i in range(MAX_HEADERS + 1)},
    {f"h{i}": "v" * 1000 for i in range(9)},  # each fine, too many bytes together
    {"lr-traceparent": "00-x"},  # reserved for the library
]


@pytest.mark.parametrize("headers", BAD)
def test_bad_headers_are_refused_and_nothing_is_written(
    store: SQLAlchemyQueueStore, headers: Any
) -> None:
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    client.register_destinations(["site-b"])
    with Session(store.engine) as session, session.begin():
        with pytest.raises(InvalidHeadersError) as single:
            client.transmit_log_entry_message(session, b"1", ["site-b"], headers=headers)
        with pytest.raises(InvalidHeadersError):
            client.transmit_log_entry_messages(
                session,
                [
                    LRMessageWithDestinations(b"ok", ["site-b"], headers={"a": "b"}),
                    LRMessageWithDestinations(b"bad", ["site-b"], headers=headers),
                ],
            )
    assert isinstance(single.value, InvalidInputError)
    assert stored(store) == []  # all or none: the good message of the batch neither


@every_flavour(only_async=True)
def test_the_async_client_refuses_bad_headers_before_writing(app: App) -> None:
    with app.transaction() as tx:
        with pytest.raises(InvalidHeadersError, match="reserved"):
            tx.transmit(b"1", ["site-b"], headers={"lr-x": "1"})
        tx.transmit(b"2", ["site-b"], headers={"a": "1"})
    assert stored(app.store) == [(b"2", {"a": "1"})]


def received(sink: SQLAlchemyQueueStore, source: str) -> list[tuple[bytes, dict[str, str]]]:
    queues = [q for q in sink.queues.list_queues("policy") if q.source_id == source]
    if not queues:
        return []
    with sink.read() as conn:
        entries = sink.queues.read_queue(conn, queues[0].queue_id, 100)
    return [(e.payload, dict(decode_headers(e.headers))) for e in entries]


def transmit(store: SQLAlchemyQueueStore, source: str, dests: list[str], n: int) -> list[Any]:
    client = RoutingQueueClient(store, source_id=source, client_name="policy")
    client.register_destinations(dests)
    rows = [(b"p%d" % i, {"n": str(i)} if i % 2 else {}) for i in range(n)]
    with Session(store.engine) as session, session.begin():
        for payload, headers in rows:
            client.transmit_log_entry_message(session, payload, dests, headers=headers)
    return rows


def test_headers_reach_the_sinks_receive_queue(sites: Sites) -> None:
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"])
    rows = transmit(sites.store("a"), "a", ["b"], 10)
    sink = sites.store("b")
    wait_for(lambda: received(sink, "a") == rows)


def test_a_branch_relays_headers_to_its_leaf(sites: Sites) -> None:
    for node in ("c3", "c2", "c1"):
        sites.start_node(CHAIN, node)
    rows = transmit(sites.store("c1"), "c1", ["c2", "c3"], 10)
    leaf, branch = sites.store("c3"), sites.store("c2")
    wait_for(lambda: received(branch, "c1") == rows, timeout=scaled(60))
    wait_for(lambda: received(leaf, "c1") == rows, timeout=scaled(60))


def test_entries_with_headers_wait_for_a_sink_that_speaks_version_6(
    sites: Sites, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink of version 5 would drop the headers unseen: the source stops the stream
    with an error naming both versions before the batch goes, sends the entries before
    it, and sends the rest once the sink speaks 6 (nothing lost, nothing skipped)."""
    monkeypatch.setattr(protocol, "PROTOCOL_VERSION", 5)  # both sites, as of the old release
    sites.start("b", sources=["a"])
    server = sites.start("a", dests=["b"])
    src, sink = sites.store("a"), sites.store("b")
    client = RoutingQueueClient(src, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    with Session(src.engine) as session, session.begin():
        client.transmit_log_entry_message(session, b"plain", ["b"])
    wait_for(lambda: received(sink, "a") == [(b"plain", {})])
    with Session(src.engine) as session, session.begin():
        client.transmit_log_entry_message(session, b"with", ["b"], headers={"a": "1"})
        client.transmit_log_entry_message(session, b"after", ["b"])
    session_b = server.sessions["b"]
    wait_for(lambda: "speaks wire protocol 5" in session_b.last_error)
    assert "entries with headers need 6 or newer" in session_b.last_error
    assert received(sink, "a") == [(b"plain", {})]  # neither sent, nor the one after it
    monkeypatch.setattr(protocol, "PROTOCOL_VERSION", 6)  # the sink is upgraded
    wait_for(
        lambda: received(sink, "a") == [(b"plain", {}), (b"with", {"a": "1"}), (b"after", {})],
        timeout=scaled(60),
    )
