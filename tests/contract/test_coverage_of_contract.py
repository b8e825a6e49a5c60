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
    contract.Snapshots: "test_snapshots.py",
    contract.Retention: "test_retention.py",
    contract.Receiving: "test_receiving.py",
    contract.SubscriberQueues: "test_subscriber_queues.py",
    contract.Inspection: "test_inspection.py",
    contract.Members: "test_members.py",
    contract.CascadeReports: "test_cascade_reports.py",
    contract.Cascading: "test_cascading.py",
    contract.Transactions: "test_subscriber_queues.py",
}


def members(role: type) -> dict[str, bool]:
    """{public member: whether it is a method} that a protocol declares itself."""
    found = {name: False for name in inspect.get_annotations(role) if not name.startswith("_")}
    for name, value in vars(role).items():
        if not name.startswith("_") and inspect.isfunction(value):
            found[name] = True
    return found


def test_every_role_of_the_store_has_a_contract_module() -> None:
    roles = {b for b in contract.QueueStore.__bases__ if b.__module__ == contract.__name__}
    assert roles | {contract.Transactions} == set(ROLES)
    assert set(contract.__all__) == {r.__name__ for r in ROLES} | {"QueueStore"}
    assert members(contract.QueueStore) == {}  # it only combines the roles


def test_the_members_are_found() -> None:
    assert members(contract.Sites) == {
        "dialect": False,
        "create_schema": True,
        "check_schema": True,
        "schema_status": True,
        "register_sites": True,
        "site_numbers": True,
        "site_name": True,
        "analyze": True,
        "close": True,
    }
    assert members(contract.Transactions) == {
        "write": True,
        "read": True,
        "read_statements": True,
        "late_write": True,
        "pinned": True,
    }
    assert "write_snapshot_part" in members(contract.Snapshots)
    assert "write" not in members(contract.Snapshots)  # Transactions' own


@pytest.mark.parametrize("role", list(ROLES), ids=lambda r: r.__name__)
def test_every_member_of_a_role_is_called_by_its_contract_tests(role: type) -> None:
    source = (HERE / ROLES[role]).read_text()
    missing = [
        name
        for name, is_method in members(role).items()
        if not re.search(rf"\.{name}\(" if is_method else rf"\.{name}\b", source)
    ]
    assert missing == [], f"{ROLES[role]} calls no {role.__name__}.{', '.join(missing)}"
