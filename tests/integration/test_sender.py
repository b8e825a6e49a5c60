"""The transactional sender API and its bad-input rules (I4, I7), on both backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.orm import Session

import lr_client.sending as sending_module
from lr_client import (
    Backpressure,
    CascadeRouteError,
    InvalidDestinationsError,
    InvalidInputError,
    InvalidNameError,
    InvalidPayloadError,
    InvalidSessionError,
    LRMessageWithDestinations,
    PayloadTooLargeError,
    RoutingQueueClient,
    UnknownDestinationError,
)
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from tests.kit.apps import App, Tx, every_flavour

app_meta = MetaData()
orders = Table(
    "app_orders", app_meta, Column("id", Integer, primary_key=True), Column("name", String(50))
)


@pytest.fixture
def client(store: SQLAlchemyQueueStore) -> Iterator[RoutingQueueClient]:
    app_meta.create_all(store.engine)
    c = RoutingQueueClient(store, source_id="site-a", client_name="policy", max_payload_bytes=1024)
    c.register_destinations(["site-b", "site-c"])
    yield c


@pytest.fixture
def app(store: SQLAlchemyQueueStore, make_app: Callable[..., App]) -> App:
    """The application of the test's flavour (sync, or async on a driver), as ``client``."""
    app_meta.create_all(store.engine)
    store.sites.register_sites(["site-b", "site-c"])
    return make_app(store, max_payload_bytes=1024)


def counts(store: SQLAlchemyQueueStore) -> tuple[int, int]:
    store.send.sequence()  # PostgreSQL: the send log shows entries once sequenced
    with store.read() as conn:
        entries = conn.execute(select(func.count()).select_from(s.send_log_entries)).scalar_one()
        apps = conn.execute(select(func.count()).select_from(orders)).scalar_one()
    return int(entries), int(apps)


@every_flavour()
def test_commits_with_the_application(app: App) -> None:
    store = app.store
    with app.transaction() as tx:
        tx.execute(insert(orders).values(name="o1"))
        tx.transmit(b"o1", ["site-b", "site-c"])
        tx.transmit_many(
            [
                LRMessageWithDestinations(b"o2", ["site-b"]),
                LRMessageWithDestinations(b"o3", ["site-c"], key=b"k"),
            ],
        )
    assert counts(store) == (3, 1)
    assert [e.payload for e in store.shipping.read_log_entries("site-b", "policy", 0, 9)] == [
        b"o1",
        b"o2",
    ]
    read_c = store.shipping.read_log_entries("site-c", "policy", 0, 9)
    assert [(e.payload, e.key) for e in read_c] == [(b"o1", None), (b"o3", b"k")]


@every_flavour()
def test_a_batch_routes_each_message_by_its_own_list(app: App) -> None:
    """One list object shared by several messages, others between them: each entry
    goes where its own message says (the batch resolves and encodes a list once)."""
    shared, other = ["site-b"], ["site-c"]
    batch = [
        LRMessageWithDestinations(b"1", shared),
        LRMessageWithDestinations(b"2", shared),
        LRMessageWithDestinations(b"3", other),
        LRMessageWithDestinations(b"4", shared, key=b"k"),
        LRMessageWithDestinations(b"5", ["site-b", "site-c"]),
    ]
    with app.transaction() as tx:
        tx.transmit_many(batch)
    read = app.store.shipping.read_log_entries
    assert [(e.payload, e.key) for e in read("site-b", "policy", 0, 9)] == [
        (b"1", None),
        (b"2", None),
        (b"4", b"k"),
        (b"5", None),
    ]
    assert [e.payload for e in read("site-c", "policy", 0, 9)] == [b"3", b"5"]


@every_flavour()
def test_rolls_back_with_the_application(app: App) -> None:
    with pytest.raises(RuntimeError), app.transaction() as tx:
        tx.execute(insert(orders).values(name="o1"))
        tx.transmit(b"o1", ["site-b"])
        tx.transmit_many([LRMessageWithDestinations(b"o2", ["site-b"])])
        raise RuntimeError("application failure")
    assert counts(app.store) == (0, 0)


@every_flavour()
def test_accepts_a_connection(app: App) -> None:
    with app.transaction("connection") as tx:
        tx.transmit(b"x", ["site-b"])
    assert counts(app.store) == (1, 0)


@every_flavour()
@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_a_connection_without_begin_commits_what_it_transmitted(app: App, batch: bool) -> None:
    # The first statement of a connection begins its transaction (autobegin);
    # a transmit that is that first statement must too, or commit() drops it.
    tx = app.open("connection", begin=False)
    try:
        if batch:
            tx.transmit_many([LRMessageWithDestinations(b"x", ["site-b"])])
        else:
            tx.transmit(b"x", ["site-b"])
        tx.commit()
    finally:
        tx.close()
    got = app.store.shipping.read_log_entries("site-b", "policy", 0, 9)
    assert [e.payload for e in got] == [b"x"]


@every_flavour()
def test_anything_but_a_session_or_connection_is_refused(app: App) -> None:
    for handle in (None, app.store.engine, "conn"):
        with pytest.raises(InvalidSessionError):
            Tx(app, handle, app.run if app.is_async else None).transmit(b"x", ["site-b"])
    assert counts(app.store) == (0, 0)


BAD: list[tuple[object, object, type[Exception]]] = [
    (b"x", [], InvalidDestinationsError),
    (b"x", "site-b", InvalidDestinationsError),
    (b"x", ["site-b", "site-b"], InvalidDestinationsError),
    (b"x", ["site-a"], InvalidDestinationsError),
    (b"x", ["Site_B"], InvalidNameError),
    (b"x", ["site-b'; drop table lrq_send_log_entries; --"], InvalidNameError),
    (b"x", ["site-z"], UnknownDestinationError),
    (b"x", [None], InvalidNameError),
    ("text", ["site-b"], InvalidPayloadError),
    (None, ["site-b"], InvalidPayloadError),
    (12, ["site-b"], InvalidPayloadError),
    (b"x" * 1025, ["site-b"], PayloadTooLargeError),
]


@every_flavour()
@pytest.mark.parametrize(("payload", "dests", "error"), BAD)
def test_bad_input_is_typed_and_changes_nothing(
    app: App, payload: object, dests: object, error: type[Exception]
) -> None:
    with app.transaction() as tx:
        tx.execute(insert(orders).values(name="before"))
        tx.transmit(b"ok", ["site-b"])
    before = counts(app.store)
    with pytest.raises(error), app.transaction() as tx:
        tx.transmit(payload, dests)
    with pytest.raises(error), app.transaction() as tx:  # in a batch, after a good message
        tx.transmit_many([LRMessageWithDestinations(b"ok", ["site-b"]), _unchecked(payload, dests)])
    assert counts(app.store) == before


def _unchecked(payload: object, dests: object) -> LRMessageWithDestinations:
    """A message as a caller may build it, with whatever it holds."""
    return LRMessageWithDestinations(payload, dests)  # type: ignore[arg-type]


def test_validated_destination_lists_are_remembered_but_never_trusted_blindly(
    client: RoutingQueueClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client.store.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"1", ["site-b", "site-c"])
        # A list seen before is not validated again (the hot path of a transmitting app)...
        monkeypatch.setattr(sending_module, "validate_name", _must_not_run)
        client.transmit_log_entry_message(conn, b"2", ("site-b", "site-c"))
        monkeypatch.undo()
        # ...but any other list is, whatever was remembered.
        for dests, error in [
            (["site-b", "site-b"], InvalidDestinationsError),
            (["site-b", "site-a"], InvalidDestinationsError),
            (["site-b", "Site_C"], InvalidNameError),
            (["site-b", ["site-c"]], InvalidNameError),
            (["site-z"], UnknownDestinationError),
        ]:
            with pytest.raises(error):
                client.transmit_log_entry_message(conn, b"x", dests)
    client.register_destinations(["site-z"])  # now known: the refusal was not remembered
    with client.store.engine.begin() as conn:
        client.transmit_log_entry_message(conn, b"3", ["site-z"])
    assert [
        e.payload for e in client.store.shipping.read_log_entries("site-c", "policy", 0, 9)
    ] == [
        b"1",
        b"2",
    ]
    assert [
        e.payload for e in client.store.shipping.read_log_entries("site-z", "policy", 0, 9)
    ] == [b"3"]


def test_the_remembered_destination_lists_are_bounded(client: RoutingQueueClient) -> None:
    sites = [f"s{i}" for i in range(50)]
    client.register_destinations(sites)
    pairs = [[a, b] for i, a in enumerate(sites) for b in sites[i + 1 :]]  # 1,225 lists
    assert len(pairs) > sending_module.RESOLVED_CACHE_SIZE
    with client.store.engine.begin() as conn:
        for dests in pairs:
            client.transmit_log_entry_message(conn, b"x", dests)
    assert len(client.rules.resolved) == sending_module.RESOLVED_CACHE_SIZE
    # Lists past the bound still work, validated each time.
    assert client.store.shipping.backlog("s49", "policy").entries == 49


def _must_not_run(*_args: object) -> str:
    raise AssertionError("validated again")


@every_flavour()
def test_one_bad_message_rejects_the_whole_batch(app: App) -> None:
    batch = [LRMessageWithDestinations(b"ok", ["site-b"]), LRMessageWithDestinations(b"x", [])]
    with pytest.raises(InvalidDestinationsError), app.transaction() as tx:
        tx.transmit_many(batch)
    with pytest.raises(InvalidPayloadError), app.transaction() as tx:
        tx.transmit_many([LRMessageWithDestinations(b"ok", ["site-b"]), b"x"])  # type: ignore[list-item]
    assert counts(app.store) == (0, 0)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the names alone: no database read
@pytest.mark.parametrize("name", ["", "A", "a_b", "x" * 70])
def test_client_names_are_validated(store: SQLAlchemyQueueStore, name: str) -> None:
    with pytest.raises(InvalidNameError):
        RoutingQueueClient(store, source_id="site-a", client_name=name)
    with pytest.raises(InvalidNameError):
        RoutingQueueClient(store, source_id=name, client_name="policy")


@settings(
    max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(
    payload=st.one_of(st.binary(max_size=2048), st.text(max_size=5), st.integers(), st.none()),
    dests=st.one_of(
        st.lists(st.sampled_from(["site-b", "site-c", "site-a", "x_y", "", "site-q"]), max_size=4),
        st.text(max_size=5),
        st.none(),
    ),
)
def test_fuzzed_input_either_succeeds_or_changes_nothing(
    client: RoutingQueueClient, payload: object, dests: object
) -> None:
    before = counts(client.store)
    try:
        with Session(client.store.engine) as session, session.begin():
            client.transmit_log_entry_message(session, payload, dests)  # type: ignore[arg-type]
    except InvalidInputError:
        assert counts(client.store) == before
    else:
        assert counts(client.store) == (before[0] + 1, before[1])


@pytest.mark.parametrize("mode", ["raise", "wait", "ignore", *Backpressure])
def test_backpressure_modes_are_an_enum(store: SQLAlchemyQueueStore, mode: str) -> None:
    client = RoutingQueueClient(store, "site-a", "policy", backpressure=mode)
    assert client.backpressure is Backpressure(mode)


def test_an_unknown_backpressure_mode_is_refused(store: SQLAlchemyQueueStore) -> None:
    with pytest.raises(ValueError, match="'raise', 'wait' or 'ignore'"):
        RoutingQueueClient(store, "site-a", "policy", backpressure="drop")


# -- cascaded clients (docs/cascading.md) ------------------------------------------------
@pytest.fixture
def root_client(store: SQLAlchemyQueueStore) -> RoutingQueueClient:
    """s1, the root of cascaded client ``policy`` (s2, s3 below it, s4 below s3), as
    ``lr server`` applies it; ``x`` is a registered site outside the set."""
    app_meta.create_all(store.engine)
    store.cascade.apply_cascade_config(
        "policy", "s1", "root", "", ("s2", "s3"), nodes=("s2", "s3", "s4")
    )
    c = RoutingQueueClient(store, source_id="s1", client_name="policy", flow_check_interval=60.0)
    c.register_destinations(["s2", "s3", "s4", "x"])
    return c


@every_flavour()
def test_a_cascaded_client_goes_to_nodes_of_its_set_only(
    root_client: RoutingQueueClient, make_app: Callable[..., App]
) -> None:
    store = root_client.store
    assert isinstance(store, SQLAlchemyQueueStore)
    app = make_app(store, source_id="s1", flow_check_interval=60.0)
    with app.transaction() as tx:
        tx.execute(insert(orders).values(name="ok"))
        tx.transmit(b"1", ["s2", "s3", "s4"])  # every node
        tx.transmit(b"2", ["s2", "s3"])  # the children
    assert counts(store) == (2, 1)
    tx = app.open()
    try:
        tx.execute(insert(orders).values(name="not-sent"))
        with pytest.raises(CascadeRouteError, match=r"^x: not a node of the set of 'policy'"):
            tx.transmit(b"3", ["s2", "x"])
        with pytest.raises(CascadeRouteError, match="x: not a node"):
            tx.transmit_many(
                [LRMessageWithDestinations(b"4", ["s2"]), LRMessageWithDestinations(b"5", ["x"])],
            )
        tx.rollback()
    finally:
        tx.close()
    assert counts(store) == (2, 1)  # nothing of the refused calls was written
    assert isinstance(CascadeRouteError(), InvalidInputError)


def test_a_cascaded_client_is_transmitted_at_its_root_only(store: SQLAlchemyQueueStore) -> None:
    store.cascade.apply_cascade_config(
        "policy", "s1", "branch", "s1", ("s4",), nodes=("s2", "s3", "s4")
    )
    branch = RoutingQueueClient(store, source_id="s3", client_name="policy")
    branch.register_destinations(["s4"])
    refused = pytest.raises(CascadeRouteError, match=r"cascaded from its root s1: only the root")
    with store.engine.begin() as conn, refused:
        branch.transmit_log_entry_message(conn, b"x", ["s4"])
    # Another client of the same site is not cascaded: it transmits as ever.
    other = RoutingQueueClient(store, source_id="s3", client_name="inventory")
    with store.engine.begin() as conn:
        other.transmit_log_entry_message(conn, b"y", ["s4"])
    store.send.sequence()
    assert [e.payload for e in store.shipping.read_client_log("policy", 0, 10)] == []
    assert [e.payload for e in store.shipping.read_client_log("inventory", 0, 10)] == [b"y"]


def test_a_cached_route_is_confirmed_before_a_refusal(root_client: RoutingQueueClient) -> None:
    store = root_client.store
    assert isinstance(store, SQLAlchemyQueueStore)
    with store.engine.begin() as conn:
        root_client.transmit_log_entry_message(conn, b"1", ["s2"])  # the route is cached
    # The set grows (the configuration applied again at a restart): x is now a node.
    store.cascade.apply_cascade_config(
        "policy", "s1", "root", "", ("s2", "s3"), nodes=("s2", "s3", "x")
    )
    with store.engine.begin() as conn:
        root_client.transmit_log_entry_message(conn, b"2", ["x"])
    assert counts(store)[0] == 2


def test_threads_transmitting_while_the_state_is_read_again_do_not_read_it_too(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backpressure state is read again by one thread at a time: the others
    transmit on the last reading meanwhile, instead of each querying it."""
    app_meta.create_all(store.engine)
    c = RoutingQueueClient(store, "site-a", "policy", flow_check_interval=0.05)
    c.register_destinations(["site-b"])
    real = store.send.flow_state
    reads: list[str] = []
    inside, hold = threading.Event(), threading.Event()

    def flow_state(client_name: str) -> tuple[bool, list[str]]:
        reads.append(client_name)
        if len(reads) == 2:  # the reading again: held while the others transmit
            inside.set()
            assert hold.wait(60), "the test never let the reading finish"
        return real(client_name)

    monkeypatch.setattr(store.send, "flow_state", flow_state)

    def transmit(payload: bytes) -> None:
        with store.engine.connect() as conn:  # begins at its first write, after the checks
            c.transmit_log_entry_message(conn, payload, ["site-b"])
            conn.commit()

    transmit(b"first")  # the first reading
    time.sleep(0.1)  # the reading is older than flow_check_interval now
    refresher = threading.Thread(target=transmit, args=(b"refresher",))
    refresher.start()
    try:
        assert inside.wait(60)
        for i in range(10):
            transmit(b"%d" % i)
        assert len(reads) == 2
    finally:
        hold.set()
        refresher.join(60)
    assert not refresher.is_alive()
    assert counts(store)[0] == 12
