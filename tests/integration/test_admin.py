"""The operator's API (:mod:`lr_server.admin`) against real databases (SQLite and PostgreSQL).

What the ``lr`` commands do, called as Python: the records they return are what
``--json`` prints, the errors typed. The CLI tests check parsing and rendering.
"""

from __future__ import annotations

from typing import Any

import pytest

from lr_client import RoutingQueueClient
from lr_client.errors import InvalidInputError, LRError
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store.schema.lifecycle import SchemaState
from lr_server import admin, parse_config
from lr_server.config import SiteConfig
from tests.kit.positions import new_slot


def site_config(db_url: str, **extra: Any) -> SiteConfig:
    """Site-a: clients policy (spark) and inventory (no provider), destinations b and c."""
    raw: dict[str, Any] = {
        "site": {"id": "site-a", "database_url": db_url},
        "security": {"transport": "plaintext", "client_auth": "token", "token": "token-of-a"},
        "clients": [
            {"name": "policy", "snapshot": "spark", "spark_source": "csv:/data/policy.csv"},
            {"name": "inventory"},
        ],
        "destinations": [
            {"id": "site-b", "address": "127.0.0.1:7001"},
            {"id": "site-c", "address": "127.0.0.1:7002", "clients": ["policy"]},
        ],
        **extra,
    }
    return parse_config(raw)


@pytest.fixture
def config(db_url: str, store: SQLAlchemyQueueStore) -> SiteConfig:
    store.sites.register_sites(["site-b", "site-c"])
    return site_config(db_url)


def transmit(store: SQLAlchemyQueueStore, client: str, rows: list[tuple[bytes, list[str]]]) -> None:
    sender = RoutingQueueClient(store, source_id="site-a", client_name=client)
    for payload, dests in rows:
        new_slot(store)
        with store.engine.begin() as conn:
            sender.transmit_log_entry_message(conn, payload, dests)


def client_view(store: SQLAlchemyQueueStore, snapshot_id: str, destination: str) -> Any:
    """The record an application reads of a snapshot (``client.snapshot``)."""
    client = RoutingQueueClient(store, source_id="site-a", client_name="policy")
    return client.snapshot(snapshot_id, destination)


def test_status_and_trim(config: SiteConfig, store: SQLAlchemyQueueStore) -> None:
    transmit(store, "policy", [(b"a", ["site-b", "site-c"]), (b"b", ["site-b"])])
    report = admin.status(config, store)
    assert isinstance(report, admin.SiteStatus) and report.site == "site-a"
    lag = {(x.destination, x.client): x.lag_entries for x in report.send}
    assert lag[("site-b", "policy")] == 2 and lag[("site-c", "policy")] == 1
    assert report.to_dict()["head_position"] == 2

    assert admin.trim(config, store) == admin.TrimResult(0)
    store.shipping.set_cursor("site-b", "policy", 2)
    store.retention.rotation_period = 30.0
    assert admin.trim(config, store).to_dict() == {"entries": 1}
    assert store.retention.rotation_period == 30.0  # restored
    assert store.shipping.oldest_position() == 1  # site-c still needs it


def test_accept_loss(config: SiteConfig, store: SQLAlchemyQueueStore) -> None:
    with pytest.raises(admin.StateError, match="stream site-b/inventory is not stopped"):
        admin.accept_loss(config, store, "site-b", "inventory")
    store.retention.stop_stream("site-b", "inventory", "lost", 7)
    stop = admin.accept_loss(config, store, "site-b", "inventory")
    assert (stop.resume_after, stop.reason) == (7, "lost") and stop.accepted_at is not None
    with pytest.raises(admin.AdminInputError) as bad:
        admin.accept_loss(config, store, "site-z", "inventory")
    assert bad.value.option == "destination" and isinstance(bad.value, InvalidInputError)
    with pytest.raises(admin.AdminInputError) as bad:
        admin.accept_loss(config, store, "site-c", "inventory")  # site-c takes policy only
    assert bad.value.option == "client"


def test_snapshots_requested_listed_cancelled(
    config: SiteConfig, store: SQLAlchemyQueueStore
) -> None:
    first = admin.request_snapshot(config, store, "site-b", "policy")
    shared = admin.request_snapshot(config, store, "site-c", "policy", reason="for c")
    assert shared == first  # one snapshot for both
    views = admin.list_snapshots(store)
    assert sorted((x.snapshot_id, x.destination, x.state) for x in views) == [
        (first, "site-b", "requested"),
        (first, "site-c", "requested"),
    ]
    assert views[0] == client_view(store, first, views[0].destination)  # one record
    assert set(views[0].to_dict()) == {
        "snapshot_id", "destination", "client_name", "state", "base_position", "reason",
        "rows_written", "rows_total", "rows_shipped", "created_at", "updated_at",
    }  # fmt: skip
    assert len(admin.list_snapshots(store, limit=1)) == 1
    assert admin.list_snapshots(store, "site-b", "inventory") == []

    done = admin.cancel_snapshot(store, first[:10], destination="site-b")
    assert (done.snapshot_id, done.destination, done.state) == (first, "site-b", "cancelled")
    assert [x.destination for x in admin.list_snapshots(store, only_open=True)] == ["site-c"]
    with pytest.raises(admin.StateError, match="not open"):
        admin.cancel_snapshot(store, first, destination="site-b")
    with pytest.raises(admin.NotFoundError):  # a prefix is looked up among open ones only
        admin.cancel_snapshot(store, first[:10], destination="site-b")
    with pytest.raises(admin.NotFoundError, match="no snapshot ffff"):
        admin.cancel_snapshot(store, "ffffffff")
    with pytest.raises(admin.AdminInputError) as bad:
        admin.request_snapshot(config, store, "site-b", "inventory")
    assert bad.value.option is None and "no snapshot provider" in str(bad.value)


def test_snapshot_job_command() -> None:
    config = site_config("sqlite:///unused.db")  # no database is opened
    cmd = admin.snapshot_job_command(config, "site-b", "policy")
    assert cmd[cmd.index("--source") + 1] == "csv:/data/policy.csv"
    assert cmd[cmd.index("--destination") + 1] == "site-b"
    with pytest.raises(admin.AdminInputError) as bad:
        admin.snapshot_job_command(config, "site-b", "inventory")
    assert bad.value.option == "source"


def test_members_listed_weighted_removed(config: SiteConfig, store: SQLAlchemyQueueStore) -> None:
    assert admin.list_members(config, store) == []
    store.members.join_member("a-1", "i1", "127.0.0.1:7443", 1)
    store.members.join_member("a-2", "i2", "127.0.0.1:7444", 2)
    assert store.members.acquire_unit("stream/site-b/policy", "a-2", "i2", 5.0) is not None
    found = {m.member_id: m for m in admin.list_members(config, store)}
    assert found["a-2"].units == ["stream/site-b/policy"] and found["a-1"].units == []
    assert found["a-2"].alive and 0.0 <= found["a-2"].heartbeat_age < 60.0
    assert found["a-2"].to_dict()["address"] == "127.0.0.1:7444"

    admin.set_member_weight(store, "a-2", 0)
    assert {m.member_id: m.weight for m in admin.list_members(config, store)} == {
        "a-1": 1,
        "a-2": 0,
    }
    with pytest.raises(admin.NotFoundError, match="no member 'nobody'"):
        admin.set_member_weight(store, "nobody", 3)
    with pytest.raises(admin.AdminInputError):
        admin.set_member_weight(store, "a-1", -1)
    admin.remove_member(store, "a-2")
    assert [m.member_id for m in admin.list_members(config, store)] == ["a-1"]
    with pytest.raises(admin.NotFoundError):
        admin.remove_member(store, "a-2")
    assert all(x.owner is None for x in store.members.list_leases())


def test_browse_and_queues(config: SiteConfig, store: SQLAlchemyQueueStore) -> None:
    transmit(store, "policy", [(b"hello world", ["site-b"]), (b"\x00\x01", ["site-b", "site-c"])])
    queues = {q.queue: q for q in admin.list_queues(store)}
    assert queues["LRQ_Send_LogEntries"].entries == 2
    got = admin.browse(store, "LRQ_Send_LogEntries", tag="lrq_logentry_site-c")
    assert [(e.position, e.preview, e.size) for e in got] == [(2, "0x0001", 2)]
    with pytest.raises(InvalidInputError):
        admin.browse(store, "NoSuchQueue")


def test_a_switch_the_config_forbids_changes_nothing(
    config: SiteConfig, store: SQLAlchemyQueueStore
) -> None:
    with pytest.raises(admin.AdminInputError) as bad:
        admin.switch_provider(config, store, "policy", "site-b")
    assert bad.value.option == "client" and "not a cascaded client" in str(bad.value)
    assert store.cascade.cascade_node("policy") is None


def test_database_checked_then_initialised(db_url: str) -> None:
    config = site_config(db_url)
    store = open_store(create_engine(db_url))  # a database without our schema
    try:
        found = admin.check_database(config, store)
        assert (found.state, found.current, found.ready) == ("empty", None, False)
        assert found.unregistered_destinations == ["site-b", "site-c"]
        assert found.database.startswith(db_url.split(":")[0]) and found.pending
        before = admin.init_database(config, store)
        assert before.state is SchemaState.EMPTY
        after = admin.check_database(config, store)
        assert after.ready and after.to_dict() == {
            "database": found.database,
            "state": "current",
            "current": found.expected,
            "expected": found.expected,
            "pending": [],
            "unregistered_destinations": [],
        }
        assert admin.init_database(config, store).state is SchemaState.CURRENT  # again: no-op
    finally:
        store.close()


def test_every_admin_error_is_an_lr_error() -> None:
    for cls in (admin.AdminError, admin.AdminInputError, admin.NotFoundError, admin.StateError):
        assert issubclass(cls, LRError) and issubclass(cls, admin.AdminError)
