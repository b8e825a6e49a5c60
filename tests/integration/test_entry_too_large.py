"""An entry larger than its destination accepts stops its stream once, named; accept-loss
skips it. In-process sites over real gRPC on loopback, each backend."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from lr_client.subscriber import RoutingQueueSubscriber
from tests.kit.positions import new_slot
from tests.kit.sites import Sites, wait_for

#: The sink accepts gRPC messages of 300 000 bytes at most; the big entry is more.
SINK_LIMITS = "max_message_bytes = 300000\nbatch_max_bytes = 100000"
BIG = 400_000


class Events(RoutingQueueListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.events += [("log", m.source_position) for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        raise AssertionError("no full sync here")

    def on_stream_dropped(
        self, session: Session, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        self.events.append(("dropped", first_dropped_position))


def transmit(store: SQLAlchemyQueueStore, payload: bytes) -> int:
    sender = RoutingQueueClient(store, source_id="a", client_name="policy")
    new_slot(store)
    with store.engine.begin() as conn:
        sender.transmit_log_entry_message(conn, payload, ["b"])
    return store.send.head_position()


def stopped() -> float | None:
    return REGISTRY.get_sample_value("lr_stream_stopped", {"destination": "b", "client": "policy"})


def test_an_entry_too_large_for_its_destination_stops_its_stream_until_accept_loss(
    sites: Sites, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="lr.session")
    sites.start("b", sources=["a"], replication=SINK_LIMITS)
    src = sites.store("a")
    src.sites.register_sites(["b"])
    before, big, after = transmit(src, b"s"), transmit(src, b"x" * BIG), transmit(src, b"t")
    sites.start("a", dests=["b"])
    wait_for(lambda: src.retention.get_stream_stop("b", "policy") is not None, timeout=30)
    stop = src.retention.get_stream_stop("b", "policy")
    assert stop is not None and stop.resume_after == big
    for part in (f"policy@{big}", "300000 bytes", "b accepts", f"{BIG + 4352} bytes"):
        assert part in stop.reason
    assert stopped() == 1
    assert src.shipping.get_cursor("b", "policy").position == before  # what came before went
    sink = sites.store("b")
    r = s.recv_entries
    with sink.read() as conn:
        assert conn.execute(select(r.c.source_position)).scalars().all() == [before]
    named = [m for m in caplog.messages if f"policy@{big}" in m]
    assert len(named) == 1 and "lr accept-loss" in named[0]

    assert src.retention.accept_stream_loss("b", "policy") is not None
    wait_for(lambda: src.shipping.get_cursor("b", "policy").position == after, timeout=30)
    events = Events()
    with RoutingQueueSubscriber(sink, "policy", events) as sub:
        while sub.poll_once():
            pass
    assert events.events == [("log", before), ("dropped", big + 1), ("log", after)]
    assert stopped() == 0
    assert len([m for m in caplog.messages if f"policy@{big}" in m]) == 1  # once
