"""The upkeep of an idle site: retention waits for the send queue to move; trim does not."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore
from lr_server import parse_config
from lr_server.cluster import upkeep
from lr_server.cluster.retention import RetentionReport
from lr_server.cluster.upkeep import Upkeep


def _upkeep(store: SQLAlchemyQueueStore, db_url: str) -> tuple[Upkeep, list[RetentionReport]]:
    config = parse_config(
        {
            "site": {"id": "a", "database_url": db_url},
            "security": {"transport": "plaintext"},
            "clients": [{"name": "policy"}],
            "destinations": [{"id": "b", "address": "127.0.0.1:1"}],
        }
    )
    keeper = Upkeep(store, config, lambda: None, lambda: None)
    reports: list[RetentionReport] = []
    run_once = keeper.policy.run_once

    def counted() -> RetentionReport:
        reports.append(run_once())
        return reports[-1]

    keeper.policy.run_once = counted  # type: ignore[method-assign]
    return keeper, reports


def test_an_idle_send_queue_is_measured_again_once_it_moves_or_after_the_period(
    store: SQLAlchemyQueueStore, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.sites.register_sites(["b"])
    keeper, reports = _upkeep(store, db_url)
    fence = None  # one server: its writes unfenced
    keeper.round(fence)
    assert not keeper.round(fence)  # idle: nothing transmitted, every stream caught up
    assert len(reports) == 1 and keeper.quiet_head is not None
    client = RoutingQueueClient(store, "a", "policy")
    with Session(store.engine) as s, s.begin():
        client.transmit_log_entry_message(s, b"x", ["b"])
    assert keeper.round(fence)  # the head moved: measured, and behind (not acknowledged)
    assert len(reports) == 2 and keeper.quiet_head is None
    assert [h.backlog.entries for h in reports[-1].streams] == [1]
    assert keeper.round(fence)  # a stream behind is measured every round: busy
    assert len(reports) == 3
    store.shipping.set_cursor("b", "policy", store.send.head_position())
    assert keeper.round(fence)  # caught up, and its entry trimmed
    assert not keeper.round(fence)  # idle from here on: the next rounds come slower
    assert len(reports) == 4 and keeper.quiet_head is not None
    assert store.shipping.read_client_log("policy", 0, 10) == []  # trimmed all the same
    monkeypatch.setattr(upkeep, "IDLE_RETENTION_PERIOD", 0.0)
    keeper.round(fence)  # the period is over: measured again
    assert len(reports) == 5
