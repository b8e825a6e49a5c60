"""Partition keys from transmit to the sink's receive queue, on both backends."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from lr_client import (
    InvalidInputError,
    InvalidPartitionKeyError,
    LRMessageWithDestinations,
    RoutingQueueClient,
)
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.sites import Sites, wait_for


@pytest.fixture
def client(store: SQLAlchemyQueueStore) -> RoutingQueueClient:
    c = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    c.register_destinations(["site-b"])
    return c


def stored(store: SQLAlchemyQueueStore) -> list[tuple[bytes, bytes | None]]:
    return [(e.payload, e.key) for e in store.shipping.read_client_log("policy", 0, 100)]


def test_a_key_is_stored_with_its_entry(client: RoutingQueueClient) -> None:
    store = client.store
    assert isinstance(store, SQLAlchemyQueueStore)
    with Session(store.engine) as session, session.begin():
        client.transmit_log_entry_message(session, b"1", ["site-b"], key=b"\x00k")
        client.transmit_log_entry_message(session, b"2", ["site-b"], key="clé")
        client.transmit_log_entry_message(session, b"3", ["site-b"])
        client.transmit_log_entry_messages(
            session,
            [
                LRMessageWithDestinations(b"4", ["site-b"], key=b"x" * 256),
                LRMessageWithDestinations(b"5", ["site-b"]),
            ],
        )
    assert stored(store) == [
        (b"1", b"\x00k"),
        (b"2", "clé".encode()),
        (b"3", None),
        (b"4", b"x" * 256),
        (b"5", None),
    ]


@pytest.mark.parametrize("key", [b"", "", b"x" * 257, "é" * 129, 7, ["k"]])
def test_a_bad_key_is_refused_and_nothing_is_written(
    client: RoutingQueueClient, key: object
) -> None:
    store = client.store
    assert isinstance(store, SQLAlchemyQueueStore)
    with Session(store.engine) as session, session.begin():
        with pytest.raises(InvalidPartitionKeyError) as single:
            client.transmit_log_entry_message(session, b"1", ["site-b"], key=key)  # type: ignore[arg-type]
        with pytest.raises(InvalidPartitionKeyError):
            client.transmit_log_entry_messages(
                session,
                [
                    LRMessageWithDestinations(b"ok", ["site-b"], key=b"fine"),
                    LRMessageWithDestinations(b"bad", ["site-b"], key=key),  # type: ignore[arg-type]
                ],
            )
    assert isinstance(single.value, InvalidInputError)
    assert stored(store) == []  # all or none: the good message of the batch neither


def test_keys_reach_the_sinks_receive_queue(sites: Sites) -> None:
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"])
    src, sink = sites.store("a"), sites.store("b")
    client = RoutingQueueClient(src, source_id="a", client_name="policy")
    client.register_destinations(["b"])
    rows = [(b"p%d" % i, None if i % 3 == 0 else b"k%d" % (i % 4)) for i in range(30)]
    with Session(src.engine) as session, session.begin():
        for payload, key in rows:
            client.transmit_log_entry_message(session, payload, ["b"], key=key)

    def received() -> list[tuple[bytes, bytes | None]]:
        queues = sink.queues.list_queues("policy")
        if not queues:
            return []
        with sink.read() as conn:
            return [
                (e.payload, e.key) for e in sink.queues.read_queue(conn, queues[0].queue_id, 100)
            ]

    wait_for(lambda: received() == rows)


def test_snapshot_keys_reach_the_sinks_receive_queue(sites: Sites) -> None:
    """A snapshot's rows keep their keys over the wire, as log entries do."""
    src = sites.store("a")
    src.sites.register_sites(["b"])
    sid = src.snapshots.request_snapshot(None, "b", "policy", "test")
    assert src.snapshots.start_snapshot(sid) is not None
    rows = [(b"s%d" % i, None if i == 2 else b"k%d" % i) for i in range(5)]
    with src.write() as conn:
        src.snapshot_entries.write_snapshot_entries(
            conn, sid, 0, [p for p, _ in rows], keys=[k for _, k in rows]
        )
    src.snapshot_entries.finish_snapshot(sid)
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")  # the rows are written already
    sink = sites.store("b")

    def received() -> list[tuple[bytes, bytes | None]]:
        queues = sink.queues.list_queues("policy")
        if not queues:
            return []
        with sink.read() as conn:
            found = sink.queues.read_queue(conn, queues[0].queue_id, 100)
        return [(e.payload, e.key) for e in found if e.snapshot_id == sid][: len(rows)]

    wait_for(lambda: received() == rows)
