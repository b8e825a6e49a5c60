"""``lr_backpressure_events_total`` counts activations of backpressure, not refused transmits."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from lr_client import BackpressureError, RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as schema
from lr_server import metrics
from lr_server.cluster.retention import RetentionPolicy
from lr_server.config import RetentionConfig
from tests.integration.test_unconfigured import send, site_config


def events() -> float:
    value = REGISTRY.get_sample_value("lr_backpressure_events_total")
    return 0.0 if value is None else value


def test_the_help_text_says_what_is_counted() -> None:
    (family,) = metrics.BACKPRESSURE_EVENTS.describe()
    assert family.documentation == "Times retention turned backpressure on for a client"


def test_one_event_per_activation_whatever_the_transmits_refused(
    store: SQLAlchemyQueueStore,
) -> None:
    send(store, "policy", [(b"x", ["b", "c"])] * 3)  # b and c both past half of 4 entries
    policy = RetentionPolicy(
        store, site_config(store, RetentionConfig(max_entries=4, soft_fraction=0.5))
    )
    start = events()
    assert policy.run_once().backpressure == {"policy": True}
    assert events() == start + 1

    refused = RoutingQueueClient(store, source_id="a", client_name="policy", backpressure="raise")
    for _ in range(3):
        with store.engine.begin() as conn, pytest.raises(BackpressureError):
            refused.transmit_log_entry_message(conn, b"y", ["b"])
    assert policy.run_once().backpressure == {"policy": True}  # still on: no new event
    assert events() == start + 1

    store.shipping.set_cursor("b", "policy", 3)  # both caught up: backpressure lifts
    store.shipping.set_cursor("c", "policy", 3)
    assert policy.run_once().backpressure == {"policy": False}
    send(store, "policy", [(b"z", ["b", "c"])] * 3)
    assert policy.run_once().backpressure == {"policy": True}  # on again: a second event
    assert events() == start + 2


def test_a_round_writes_a_clients_flow_state_only_when_it_changes(
    store: SQLAlchemyQueueStore,
) -> None:
    """An idle site's retention rounds write nothing: the flow state is rewritten only
    when backpressure or the slow destinations change."""
    send(store, "policy", [(b"x", ["b", "c"])] * 3)
    policy = RetentionPolicy(
        store, site_config(store, RetentionConfig(max_entries=4, soft_fraction=0.5))
    )

    def written() -> object:
        with store.read() as conn:
            return conn.execute(select(schema.flow_control.c.updated_at)).scalar_one()

    policy.run_once()
    first = written()
    assert store.send.flow_state("policy") == (True, ["b", "c"])
    policy.run_once()
    assert written() == first  # unchanged: not written again
    store.shipping.set_cursor("c", "policy", 3)  # c caught up: only b is slow (still on)
    policy.run_once()
    assert store.send.flow_state("policy") == (False, ["b"])
    assert written() != first
