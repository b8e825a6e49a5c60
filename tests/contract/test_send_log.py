"""SendLog: appending to the send queue in the caller's transaction, its head, flow state."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from sqlalchemy.engine import Connection

from lr_client.records import EntryRef
from lr_client.store.contract import QueueStore
from lr_client.store.schema.lifecycle import SchemaState
from tests.contract.calls import (
    across_outage,
    append,
    positions,
    refused_for_no_schema,
    rolled_back,
)
from tests.contract.outage import Outage

Begin = Callable[[], AbstractContextManager[Connection]]


def test_positions_increase_in_append_order(store: QueueStore) -> None:
    assert store.send.head_position() == 0
    p = append(store, "policy", (b"1", ["b", "c"]), (b"2", ["b"]), (b"3", ["c"]), (b"4", ["d"]))
    assert p == sorted(p) and len(set(p)) == 4
    assert store.send.head_position() == p[-1]
    q = append(store, "other", (b"5", ["b"]))
    assert q[0] > p[-1] and store.send.head_position() == q[0]
    read = store.shipping.read_client_log("policy", 0, 10)
    assert [(e.position, e.payload) for e in read] == list(
        zip(p, [b"1", b"2", b"3", b"4"], strict=True)
    )


def test_an_empty_append_assigns_nothing(store: QueueStore, app_transaction: Begin) -> None:
    store.sites.register_sites(["b"])
    with app_transaction() as conn:
        assert store.send.append_log_entries(conn, "policy", []) == []
    assert store.send.head_position() == 0


def test_head_position_in_the_callers_transaction(
    store: QueueStore, app_transaction: Begin
) -> None:
    nums = store.sites.register_sites(["b"])
    with app_transaction() as conn:
        assert store.send.head_position(conn) == 0  # nothing transmitted yet
    with app_transaction() as conn:
        (ref,) = store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])])
    (pos,) = positions(store, [ref])
    with app_transaction() as conn:
        assert store.send.head_position(conn) == pos
        (later,) = store.send.append_log_entries(conn, "policy", [(b"y", [nums["b"]])])
        # Not yet committed: no position above it is given, whatever the backend says of ``later``.
        assert store.send.head_position(conn) in (pos, later.position)
    assert store.send.head_position() == positions(store, [later])[0] > pos


def test_refs_name_each_entry_until_its_position_is_known(
    store: QueueStore, app_transaction: Begin
) -> None:
    nums = store.sites.register_sites(["b", "c"])
    with app_transaction() as conn:
        refs = store.send.append_log_entries(
            conn, "policy", [(b"1", [nums["b"]]), (b"2", [nums["c"]]), (b"3", [nums["b"]])]
        )
        more = store.send.append_log_entries(conn, "other", [(b"4", [nums["b"]])])
    assert len({(r.txid, r.ord) for r in [*refs, *more]}) == 4
    got = positions(store, [*refs, *more])
    assert got == sorted(got) and len(set(got)) == 4  # one transaction: its order
    assert store.send.positions_of(list(reversed(refs))) == list(reversed(got[:3]))
    read = store.shipping.read_client_log("policy", 0, 10)
    assert [(e.position, e.payload) for e in read] == list(
        zip(got[:3], [b"1", b"2", b"3"], strict=True)
    )
    assert store.send.sequence() == 0  # nothing new committed since


def test_a_rolled_back_entry_never_gets_a_position(store: QueueStore) -> None:
    nums = store.sites.register_sites(["b"])
    with rolled_back(store) as conn:
        (lost,) = store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])])
    kept = append(store, "policy", (b"kept", ["b"]))
    assert store.send.positions_of([lost]) == [None] or lost.position is not None
    assert store.send.head_position() == kept[0]


def test_rollback_leaves_nothing(store: QueueStore) -> None:
    nums = store.sites.register_sites(["b"])
    kept = append(store, "policy", (b"kept", ["b"]))
    with rolled_back(store) as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])])
    assert [e.payload for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == [b"kept"]
    assert [e.position for e in store.shipping.read_client_log("policy", 0, 10)] == kept


def test_an_exception_in_the_callers_transaction_rolls_the_append_back(
    store: QueueStore, app_transaction: Begin
) -> None:
    nums = store.sites.register_sites(["b"])
    with pytest.raises(RuntimeError), app_transaction() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])])
        raise RuntimeError("the application failed")
    assert store.shipping.read_log_entries("b", "policy", 0, 10) == []
    assert store.shipping.read_client_log("policy", 0, 10) == []


def test_flow_state_is_what_retention_set(store: QueueStore) -> None:
    assert store.send.flow_state("policy") == (False, [])
    store.retention.set_flow_state("policy", True, ["d", "b"])
    assert store.send.flow_state("policy") == (True, ["b", "d"])
    assert store.send.flow_state("other") == (False, [])
    store.retention.set_flow_state("policy", False, [])
    assert store.send.flow_state("policy") == (False, [])


def test_a_send_log_method_on_an_empty_database_is_a_schema_error(
    bare_store: QueueStore,
) -> None:
    refused_for_no_schema(bare_store, bare_store.send.head_position)
    refused_for_no_schema(bare_store, lambda: bare_store.send.flow_state("policy"))


def test_a_lost_connection_is_transient(store: QueueStore, outage: Outage) -> None:
    p = append(store, "policy", (b"1", ["b"]))
    store.retention.set_flow_state("policy", True, ["b"])
    assert across_outage(outage, store.send.head_position) == p[0]
    assert across_outage(outage, lambda: store.send.flow_state("policy")) == (True, ["b"])


@pytest.mark.parametrize("n", [1, 3])
def test_an_append_on_an_empty_database_is_a_schema_error(bare_store: QueueStore, n: int) -> None:
    def transmit() -> list[EntryRef]:
        with bare_store.write() as conn:
            return bare_store.send.append_log_entries(conn, "policy", [(b"x", [1])] * n)

    refused_for_no_schema(bare_store, transmit)


@pytest.mark.parametrize("n", [1, 3])
def test_an_append_survives_a_lost_connection(store: QueueStore, outage: Outage, n: int) -> None:
    nums = store.sites.register_sites(["b"])

    def transmit() -> list[EntryRef]:
        with store.write() as conn:
            return store.send.append_log_entries(conn, "policy", [(b"x", [nums["b"]])] * n)

    pos = positions(store, across_outage(outage, transmit))
    assert [e.position for e in store.shipping.read_log_entries("b", "policy", 0, 10)][-n:] == pos
    assert store.send.head_position() == pos[-1]


def test_the_transmit_route_of_a_cascaded_client_is_what_its_node_applied(
    store: QueueStore,
) -> None:
    assert store.send.transmit_route("policy") is None  # not cascaded here
    store.cascade.apply_cascade_config(
        "policy", "s1", "root", "", ("s2", "s3"), nodes=("s3", "s2", "s4")
    )
    route = store.send.transmit_route("policy")
    assert route is not None
    assert (route.origin_id, route.role, route.nodes) == ("s1", "root", ("s2", "s3", "s4"))
    # Another client's nodes are kept apart; new nodes replace the client's own.
    store.cascade.apply_cascade_config("orders", "s1", "root", "", ("s5",), nodes=("s5",))
    store.cascade.apply_cascade_config("policy", "s1", "root", "", (), nodes=("s2", "s3"))
    store.cascade.apply_cascade_config("policy", "s1", "root", "")  # without nodes: they stay
    assert store.send.transmit_route("policy").nodes == ("s2", "s3")  # type: ignore[union-attr]
    assert store.send.transmit_route("orders").nodes == ("s5",)  # type: ignore[union-attr]
    # Applied without nodes (an older server): the route says it does not know them.
    store.cascade.apply_cascade_config("billing", "s1", "branch", "s1")
    billing = store.send.transmit_route("billing")
    assert billing is not None and (billing.role, billing.nodes) == ("branch", None)


def test_analyze_changes_no_data(store: QueueStore) -> None:
    p = append(store, "policy", (b"1", ["b"]), (b"2", ["b", "c"]))
    store.send.analyze()
    assert [e.position for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == p
    assert [e.position for e in store.shipping.read_log_entries("c", "policy", 0, 10)] == p[1:]
    store.check_schema()


def test_analyze_on_an_empty_database(bare_store: QueueStore) -> None:
    if bare_store.dialect == "sqlite":  # no statistics to refresh: nothing is read
        bare_store.send.analyze()
        assert bare_store.schema_status().state is SchemaState.EMPTY
    else:
        refused_for_no_schema(bare_store, bare_store.send.analyze)


def test_analyze_survives_a_lost_connection(store: QueueStore, outage: Outage) -> None:
    p = append(store, "policy", (b"1", ["b"]))
    if store.dialect != "sqlite":  # SQLite: a no-op, it touches no connection
        across_outage(outage, store.send.analyze)
    unknown = store.sites.site_numbers()["b"] + 1  # not cached: read from the database
    assert across_outage(outage, lambda: store.sites.site_name(unknown)) == f"#{unknown}"
    assert [e.position for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == p
