"""Sites: the schema, the registered sites and the store's dialect."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lr_client.errors import InvalidNameError, SchemaError
from lr_client.store import create_engine, open_store
from lr_client.store.contract import QueueStore
from lr_client.store.schema.lifecycle import SchemaState
from tests.contract.calls import across_outage, append, refused_for_no_schema
from tests.contract.outage import Outage


def test_the_schema_is_checked_and_created_idempotently(
    bare_store: QueueStore,
) -> None:
    with pytest.raises(SchemaError, match="no schema; `lr init-db` creates"):
        bare_store.check_schema()  # an empty database
    bare_store.create_schema()
    bare_store.check_schema()
    p = append(bare_store, "policy", (b"1", ["b"]))
    bare_store.create_schema()  # idempotent: what is there stays
    bare_store.check_schema()
    assert [e.position for e in bare_store.shipping.read_log_entries("b", "policy", 0, 10)] == p
    assert bare_store.sites.site_numbers(refresh=True) == {
        "b": bare_store.sites.site_numbers()["b"]
    }


def test_a_site_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(bare_store, lambda: bare_store.sites.register_sites(["b"]))
    refused_for_no_schema(bare_store, lambda: bare_store.sites.site_numbers(refresh=True))


def test_sites_get_distinct_stable_numbers(store: QueueStore) -> None:
    assert store.sites.site_numbers(refresh=True) == {}
    first = store.sites.register_sites(["b", "c"])
    assert sorted(first) == ["b", "c"] and first["b"] != first["c"]
    again = store.sites.register_sites(["c", "d", "d"])  # known ones keep their number
    assert again["b"] == first["b"] and again["c"] == first["c"]
    assert sorted(again) == ["b", "c", "d"]
    assert len({again["b"], again["c"], again["d"]}) == 3
    assert store.sites.site_numbers() == again
    assert {store.sites.site_name(n): n for n in again.values()} == again
    unknown = max(again.values()) + 1
    assert store.sites.site_name(unknown) == f"#{unknown}"


def test_sites_registered_elsewhere_are_seen_on_refresh(store: QueueStore, db_url: str) -> None:
    store.sites.register_sites(["b"])
    other = open_store(create_engine(db_url))
    try:
        nums = other.sites.register_sites(["c"])
    finally:
        other.close()
    assert store.sites.site_numbers(refresh=True) == nums
    assert store.sites.site_name(nums["c"]) == "c"


@pytest.mark.parametrize("bad", ["B", "", "-b", "b_c", "b" * 64, "b c"])
def test_a_bad_site_name_registers_nothing(store: QueueStore, bad: str) -> None:
    store.sites.register_sites(["a"])
    with pytest.raises(InvalidNameError):
        store.sites.register_sites(["c", bad])
    assert sorted(store.sites.site_numbers(refresh=True)) == ["a"]


def test_dialect_names_the_backend(store: QueueStore, db_url: str) -> None:
    assert store.dialect == ("sqlite" if db_url.startswith("sqlite") else "postgresql")


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    before = store.sites.register_sites(["b"])
    assert across_outage(outage, lambda: store.sites.register_sites(["b", "c"]))["b"] == before["b"]
    assert sorted(store.sites.site_numbers(refresh=True)) == ["b", "c"]
    store.check_schema()


def test_schema_status_says_where_the_schema_stands(bare_store: QueueStore) -> None:
    empty = bare_store.schema_status()
    assert (empty.state, empty.current) == (SchemaState.EMPTY, None)
    assert empty.pending and empty.pending[-1] == empty.expected
    assert bare_store.schema_status() == empty  # reading it changes nothing
    assert bare_store.create_schema() == empty  # the status before
    current = bare_store.schema_status()
    assert (current.state, current.current, current.pending) == (
        SchemaState.CURRENT,
        empty.expected,
        (),
    )
    assert current.expected == empty.expected
    assert bare_store.create_schema() == current


def test_close_gives_back_the_connections_and_a_later_call_reconnects(
    store: QueueStore, connections: Callable[..., int]
) -> None:
    p = append(store, "policy", (b"1", ["b"]))
    assert connections() >= 1
    store.close()
    assert connections(closing=True) == 0
    store.close()  # closing again is harmless
    assert [e.position for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == p
    assert store.sites.register_sites(["c"])["c"] != store.sites.site_numbers()["b"]
    store.check_schema()
    assert connections() >= 1
    store.close()
    assert connections(closing=True) == 0


def test_schema_status_on_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    assert across_outage(outage, store.schema_status).state is SchemaState.CURRENT
    across_outage(outage, store.check_schema)
    assert across_outage(outage, store.create_schema).state is SchemaState.CURRENT


def test_every_site_method_on_an_empty_database_is_a_schema_error(bare_store: QueueStore) -> None:
    refused_for_no_schema(bare_store, lambda: bare_store.sites.site_name(1))
    assert bare_store.schema_status().state is SchemaState.EMPTY
    bare_store.close()  # nothing to give back but the connections


def test_the_store_has_an_object_per_role(store: QueueStore, db_url: str) -> None:
    roles = (store.sites, store.send, store.shipping, store.retention, store.snapshots)
    roles += (store.snapshot_entries, store.recv, store.replays, store.queues, store.heads)
    roles += (store.partitions, store.inspection, store.members, store.cascade_reports)
    roles += (store.cascade, store.latency)
    assert len({id(r) for r in roles}) == 16  # distinct objects, not the store itself
    assert all(r is not store for r in roles)
    assert store.single_writer is db_url.startswith("sqlite")


def test_a_method_from_before_the_roles_is_forwarded_with_a_warning(store: QueueStore) -> None:
    """``store.register_sites`` (before the roles) still works for a release, and says where
    it went; a name no role has is an AttributeError, with no warning."""
    with pytest.warns(DeprecationWarning, match=r"store\.sites\.register_sites\(\) now"):
        numbers = store.register_sites(["moved"])  # type: ignore[attr-defined]
    assert numbers == store.sites.site_numbers()
    with pytest.warns(DeprecationWarning, match=r"store\.retention\.trim\(\)"):
        assert store.trim() == 0  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'no_such_method'"):
        store.no_such_method  # type: ignore[attr-defined]  # noqa: B018
