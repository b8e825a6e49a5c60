"""What the store backends keep in their tables: rows and schema internals.

The behaviour of the store, through its public methods, is the contract
suite's (``tests/contract``); this module checks what only the tables show.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from lr_client.errors import SchemaError
from lr_client.store import SQLAlchemyQueueStore, lifecycle
from lr_client.store import schema as s


def test_a_schema_of_a_newer_release_is_refused(store: SQLAlchemyQueueStore) -> None:
    store.check_schema()
    with store.write() as conn:  # as a newer release would leave it
        conn.execute(text(f"UPDATE {lifecycle.VERSION_TABLE} SET version_num = 'ffff'"))
    with pytest.raises(SchemaError, match="revision ffff is newer than this release"):
        store.check_schema()


def test_payload_stored_once_whatever_the_destinations(store: SQLAlchemyQueueStore) -> None:
    dests = [f"s{i}" for i in range(8)]
    nums = store.register_sites(dests)
    with store.write() as conn:
        store.append_log_entries(conn, "policy", [(b"x" * 1024, [nums[d] for d in dests])])
    assert store.sequence() == (1 if store.dialect == "postgresql" else 0)
    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(s.send_log_entries)).scalar() == 1
    for d in dests:
        assert [e.payload for e in store.read_log_entries(d, "policy", 0, 10)] == [b"x" * 1024]
