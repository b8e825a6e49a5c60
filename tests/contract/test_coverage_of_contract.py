"""Every member of every role protocol is exercised by that role's contract module.

A method added to a protocol in :mod:`lr_client.store.contract` without a
contract test fails here: each public member a protocol declares must be
called as ``.name(`` (an attribute: read as ``.name``) in the contract module
of its role, ``tests/contract/test_<role>.py``. :class:`Transactions`, which
the roles with ``conn`` methods extend, is exercised where a subscriber
delivers in the store's transactions.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from lr_client.store import contract

HERE = Path(__file__).parent

#: Each role protocol and the module of its contract tests.
ROLES: dict[type, str] = {
    contract.Sites: "test_sites.py",
    contract.SendLog: "test_send_log.py",
    contract.Shipping: "test_shipping.py",
    contract.SnapshotRequests: "test_snapshots.py",
    contract.SnapshotEntries: "test_snapshots.py",
    contract.Retention: "test_retention.py",
    contract.Receiving: "test_receiving.py",
    contract.Replays: "test_replays.py",
    contract.SubscriberQueues: "test_subscriber_queues.py",
    contract.QueueHeads: "test_subscriber_queues.py",
    contract.QueuePartitions: "test_subscriber_queues.py",
    contract.Inspection: "test_inspection.py",
    contract.Members: "test_members.py",
    contract.CascadeReports: "test_cascade_reports.py",
    contract.Cascading: "test_cascading.py",
    contract.Transactions: "test_subscriber_queues.py",
    contract.StageLatencies: "test_stage_latency.py",
    contract.QueueStore: "test_sites.py",
}
#: The store's role attributes and the protocol of each.
ROLE_ATTRIBUTES = {
    "sites": contract.Sites,
    "send": contract.SendLog,
    "shipping": contract.Shipping,
    "retention": contract.Retention,
    "snapshots": contract.SnapshotRequests,
    "snapshot_entries": contract.SnapshotEntries,
    "recv": contract.Receiving,
    "replays": contract.Replays,
    "queues": contract.SubscriberQueues,
    "heads": contract.QueueHeads,
    "partitions": contract.QueuePartitions,
    "inspection": contract.Inspection,
    "members": contract.Members,
    "cascade_reports": contract.CascadeReports,
    "cascade": contract.Cascading,
    "latency": contract.StageLatencies,
}


def members(role: type) -> dict[str, bool]:
    """{public member: whether it is a method} that a protocol declares itself."""
    found = {name: False for name in inspect.get_annotations(role) if not name.startswith("_")}
    for name, value in vars(role).items():
        if not name.startswith("_") and inspect.isfunction(value):
            found[name] = True
        elif not name.startswith("_") and isinstance(value, property):
            found[name] = False
    return found


def test_the_store_has_each_role_as_an_object_of_its_own() -> None:
    """The store *has* its roles (one protocol each, at most 12 methods), it is not them."""
    store_members = members(contract.QueueStore)
    assert {n for n, method in store_members.items() if not method} == set(ROLE_ATTRIBUTES) | {
        "dialect",
        "single_writer",
    }
    hints = inspect.get_annotations(contract.QueueStore, eval_str=True)
    for name, role in ROLE_ATTRIBUTES.items():
        assert hints[name] is role, name
    assert {r for r in ROLES if r is not contract.QueueStore} == set(ROLE_ATTRIBUTES.values()) | {
        contract.Transactions
    }
    for role in ROLES:
        methods = [n for n, method in members(role).items() if method]
        assert len(methods) <= 12, f"{role.__name__} has {len(methods)} methods"


def test_the_members_are_found() -> None:
    assert members(contract.Sites) == {
        "register_sites": True,
        "site_numbers": True,
        "site_name": True,
    }
    assert members(contract.Transactions) == {
        "write": True,
        "read": True,
        "read_statements": True,
        "late_write": True,
        "pinned": True,
    }
    assert "write_snapshot_part" in members(contract.SnapshotEntries)
    assert "write" not in members(contract.SnapshotRequests)  # Transactions' own
    assert {"create_schema", "check_schema", "schema_status", "close"} <= set(
        members(contract.QueueStore)
    )


@pytest.mark.parametrize("role", list(ROLES), ids=lambda r: r.__name__)
def test_every_member_of_a_role_is_called_by_its_contract_tests(role: type) -> None:
    source = (HERE / ROLES[role]).read_text()
    missing = [
        name
        for name, is_method in members(role).items()
        if not re.search(rf"\.{name}\(" if is_method else rf"\.{name}\b", source)
    ]
    assert missing == [], f"{ROLES[role]} calls no {role.__name__}.{', '.join(missing)}"
