"""End-to-end encryption: sealed at transmit in the source application, opened in the
sink's subscriber; real gRPC on loopback between in-process sites, on both backends.

The databases are read as an attacker with a backup would: every column of every
table of the source, the relay and the sink, looking for a known plaintext marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Sequence

import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SAWarning
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from lr_client import (
    ConfigError,
    DecryptionError,
    Keyring,
    KeyUnavailableError,
    RoutingQueueClient,
    RoutingQueueListener,
    RoutingQueueSubscriber,
    SnapshotContext,
    SnapshotProviderRunner,
)
from lr_client.aio import AsyncRoutingQueueClient, AsyncRoutingQueueSubscriber
from lr_client.encryption import is_sealed, key_ids
from lr_client.errors import InvalidHeadersError
from lr_client.keys import generate_key
from lr_client.listener import RoutingQueueMessage
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.schema import tables as s
from tests.kit.aio import AsAsync, async_engine
from tests.kit.sites import CHAIN, Sites
from tests.kit.wait import scaled, wait_for

pytestmark = pytest.mark.stop_calls_at_once

MARKER = b"PLAINTEXT-MARKER-5c1e"
K1, K2 = generate_key(), generate_key()


class Applied(RoutingQueueListener):
    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.snapshot: list[bytes] = []
        self.errors: list[BaseException] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.payloads += [m.payload for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.snapshot += [m.payload for m in messages]
        return True

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


def _payload(i: int) -> bytes:
    return b'{"n": %d, "card": "%s"}' % (i, MARKER)


def _scan(store: SQLAlchemyQueueStore, conn: Connection | None = None) -> list[str]:
    """Every table.column of ``store``'s database that holds the marker (read on ``conn``,
    which sees its transaction's own writes, if given)."""
    meta = MetaData()
    with warnings.catch_warnings():  # PostgreSQL's xid8 has no SQLAlchemy type: read as text
        warnings.simplefilter("ignore", SAWarning)
        meta.reflect(store.engine)
    assert len(meta.tables) > 10  # the whole schema, not an empty one
    found = []
    with contextlib.ExitStack() as stack:
        reader = conn if conn is not None else stack.enter_context(store.engine.connect())
        for table in meta.sorted_tables:
            for row in reader.execute(select(table)):
                for column, value in zip(table.columns, row, strict=True):
                    raw = value if isinstance(value, bytes) else str(value).encode()
                    if MARKER in raw:
                        found.append(f"{table.name}.{column.name}")
    return found


def _transmit(store: SQLAlchemyQueueStore, ring: Keyring, dests: list[str], n: range) -> None:
    client = RoutingQueueClient(store, "a", "policy", keyring=ring)
    with store.write() as conn:
        for i in n:
            client.transmit_log_entry_message(conn, _payload(i), dests)


def _stored(store: SQLAlchemyQueueStore) -> list[bytes]:
    with store.read() as conn:
        rows = conn.execute(select(s.recv_entries.c.payload).order_by(s.recv_entries.c.seq))
        return [bytes(p) for (p,) in rows]


def _pair(sites: Sites) -> tuple[SQLAlchemyQueueStore, SQLAlchemyQueueStore]:
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"])
    return sites.store("a"), sites.store("b")


def _drain(sub: RoutingQueueSubscriber) -> int:
    total = 0
    while n := sub.poll_once():
        total += n
    return total


def test_payloads_travel_and_rest_encrypted_and_reach_the_listener_in_clear(sites: Sites) -> None:
    src, sink = _pair(sites)
    client = RoutingQueueClient(src, "a", "policy", keyring=Keyring({"k1": K1}))
    with src.write() as conn:
        for i in range(10):
            client.transmit_log_entry_message(conn, _payload(i), ["b"])
        # Sealed as written (read in the writing transaction: once acknowledged, the
        # entries may be trimmed before a later scan).
        assert _scan(src, conn) == []
    wait_for(lambda: len(_stored(sink)) >= 10, scaled(30))
    assert all(is_sealed(p) for p in _stored(sink))
    listener = Applied()
    with RoutingQueueSubscriber(sink, "policy", listener, keyring=Keyring({"k1": K1})) as sub:
        assert _drain(sub) == 10
    assert listener.payloads == [_payload(i) for i in range(10)]
    assert _scan(src) == [] and _scan(sink) == []


def test_the_async_client_and_subscriber_seal_and_open(sites: Sites) -> None:
    src, sink = _pair(sites)
    ring = Keyring({"k1": K1})

    async def scenario() -> list[bytes]:
        engine = async_engine(sites.url("a"))
        try:
            client = AsyncRoutingQueueClient(src, "a", "policy", keyring=ring)
            async with AsyncSession(engine) as session, session.begin():
                for i in range(5):
                    await client.transmit_log_entry_message(session, _payload(i), ["b"])
        finally:
            await engine.dispose()
        await asyncio.to_thread(wait_for, lambda: len(_stored(sink)) >= 5, scaled(30))
        listener, sink_engine = Applied(), async_engine(sites.url("b"))
        sub = AsyncRoutingQueueSubscriber(sink_engine, "policy", AsAsync(listener), keyring=ring)
        try:
            async with sub:
                while await sub.poll_once():
                    pass
        finally:
            await sink_engine.dispose()
        return listener.payloads

    assert asyncio.run(scenario()) == [_payload(i) for i in range(5)]
    assert _scan(src) == [] and _scan(sink) == []


def test_a_missing_key_then_a_wrong_one_block_the_queue_until_the_key_is_supplied(
    sites: Sites,
) -> None:
    """Rotation: entries under k1, then under k2; the sink holds k2 alone, then a wrong
    k1, then the right one: nothing is applied until it opens, nothing lost or twice."""
    src, sink = _pair(sites)
    _transmit(src, Keyring({"k1": K1}), ["b"], range(3))
    _transmit(src, Keyring({"k1": K1, "k2": K2}, current="k2"), ["b"], range(3, 6))
    wait_for(lambda: len(_stored(sink)) >= 6, scaled(30))
    assert [key_ids(p) for p in _stored(sink)] == [["k1"]] * 3 + [["k2"]] * 3
    listener = Applied()
    sub = RoutingQueueSubscriber(
        sink, "policy", listener, keyring=Keyring({"k2": K2}), retry_initial=0.0, retry_jitter=0
    )
    with sub:
        assert _drain(sub) == 0
        assert isinstance(listener.errors[-1], KeyUnavailableError)
        assert "sealed under k1; the keyring holds k2" in str(listener.errors[-1])
        (blocked,) = sub.failing.values()
        assert isinstance(blocked, KeyUnavailableError)
        sub.keyring = Keyring({"k1": K2, "k2": K2})  # a wrong key under the right id
        assert _drain(sub) == 0
        assert isinstance(listener.errors[-1], DecryptionError)
        assert listener.payloads == [] and len(_stored(sink)) == 6
        sub.keyring = Keyring({"k1": K1, "k2": K2})
        assert _drain(sub) == 6
        assert sub.failing == {}
    assert listener.payloads == [_payload(i) for i in range(6)]


def test_a_plaintext_entry_blocks_a_subscriber_that_requires_encryption(sites: Sites) -> None:
    src, sink = _pair(sites)
    with src.write() as conn:
        client = RoutingQueueClient(src, "a", "policy")  # no keyring: sent in clear
        client.transmit_log_entry_message(conn, _payload(0), ["b"])
        # The scan finds a plaintext (what the other tests' empty scans mean); read in
        # the writing transaction: once acknowledged, the entry may be trimmed at once.
        assert _scan(src, conn)
    wait_for(lambda: len(_stored(sink)) >= 1, scaled(30))
    listener = Applied()
    with RoutingQueueSubscriber(sink, "policy", listener, keyring=Keyring({"k1": K1})) as sub:
        assert _drain(sub) == 0
    assert "not encrypted" in str(listener.errors[-1]) and listener.payloads == []
    assert _scan(sink)  # kept in the receive queue: its delivery is blocked


def test_a_relay_forwards_ciphertext_it_cannot_read(sites: Sites) -> None:
    """c1 -> c2 -> c3: c2 relays without a key; only c3's subscriber opens the entries."""
    for node in ("c3", "c2", "c1"):
        sites.start_node(CHAIN, node)
    stores = {n: sites.store(n) for n in ("c1", "c2", "c3")}
    ring = Keyring({"leaf": K2})
    client = RoutingQueueClient(stores["c1"], "c1", "policy", keyring=ring)
    client.register_destinations(["c3"])  # a node of the set below c2: sealed for it too
    with stores["c1"].write() as conn:
        for i in range(5):
            client.transmit_log_entry_message(conn, _payload(i), ["c2", "c3"])
    wait_for(lambda: len(_stored(stores["c3"])) >= 5, scaled(60))
    listener = Applied()
    with RoutingQueueSubscriber(stores["c3"], "policy", listener, keyring=ring) as sub:
        wait_for(lambda: _drain(sub) >= 0 and len(listener.payloads) >= 5, scaled(30))
    assert listener.payloads == [_payload(i) for i in range(5)]
    assert {n: _scan(st) for n, st in stores.items()} == {"c1": [], "c2": [], "c3": []}


def test_delivery_by_partition_blocks_without_the_key_and_resumes_with_it(sites: Sites) -> None:
    src, sink = _pair(sites)
    client = RoutingQueueClient(src, "a", "policy", keyring=Keyring({"k1": K1}))
    with src.write() as conn:
        for i in range(8):
            client.transmit_log_entry_message(conn, _payload(i), ["b"], key=f"k{i % 4}")
    wait_for(lambda: len(_stored(sink)) >= 8, scaled(30))
    listener = Applied()
    sub = RoutingQueueSubscriber(
        sink,
        "policy",
        listener,
        partitions=2,
        keyring=Keyring({"k2": K2}),
        retry_initial=0.0,
        retry_jitter=0,
    )
    with sub:
        assert sub.poll_once() == 0
        assert sub.failing and all(isinstance(e, KeyUnavailableError) for e in sub.failing.values())
        sub.keyring = Keyring({"k1": K1})
        wait_for(lambda: sub.poll_once() >= 0 and len(listener.payloads) >= 8, scaled(30))
        assert sub.failing == {}
    assert sorted(listener.payloads) == sorted(_payload(i) for i in range(8))


def test_the_async_subscriber_blocks_without_the_key_and_resumes_with_it(sites: Sites) -> None:
    src, sink = _pair(sites)
    _transmit(src, Keyring({"k1": K1}), ["b"], range(4))
    wait_for(lambda: len(_stored(sink)) >= 4, scaled(30))

    async def scenario() -> tuple[int, list[BaseException], list[bytes]]:
        listener, engine = Applied(), async_engine(sites.url("b"))
        sub = AsyncRoutingQueueSubscriber(
            engine, "policy", AsAsync(listener), keyring=Keyring({"k2": K2}), retry_initial=0.0
        )
        try:
            async with sub:
                blocked = await sub.poll_once()
                errors = list(sub.failing.values())
                sub.keyring = Keyring({"k1": K1})
                while await sub.poll_once():
                    pass
                assert sub.failing == {}
        finally:
            await engine.dispose()
        return blocked, errors, listener.payloads

    blocked, errors, payloads = asyncio.run(scenario())
    assert blocked == 0 and [type(e) for e in errors] == [KeyUnavailableError]
    assert payloads == [_payload(i) for i in range(4)]


def test_a_full_sync_written_by_a_provider_with_a_keyring_is_sealed(sites: Sites) -> None:
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app")  # first contact: a full sync
    src, sink = sites.store("a"), sites.store("b")
    ring = Keyring({"k1": K1, "kc": K2}, destinations={"c": "kc"})

    def provide(ctx: SnapshotContext) -> None:
        ctx.transmit([_payload(i) for i in range(5)])

    runner = SnapshotProviderRunner(src, "policy", provide, keyring=ring, source_id="a")
    wait_for(lambda: runner.poll_once() > 0, scaled(30))
    wait_for(lambda: len(_stored(sink)) >= 6, scaled(30))  # 5 rows and the end marker
    assert all(key_ids(p) == ["k1", "kc"] for p in _stored(sink)[:5])
    listener = Applied()
    with RoutingQueueSubscriber(sink, "policy", listener, keyring=Keyring({"kc": K2})) as sub:
        _drain(sub)
    assert listener.snapshot == [_payload(i) for i in range(5)]
    assert _scan(src) == [] and _scan(sink) == []


class WithHeaders(Applied):
    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, str]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.headers += [dict(m.headers) for m in messages]
        return super().process_log_entries(session, source_id, messages)


def test_headers_the_keyring_names_travel_sealed_and_reach_the_listener_as_given(
    sites: Sites,
) -> None:
    src, sink = _pair(sites)
    ring = Keyring({"k1": K1}, sealed_headers=["tenant"])
    given = {"tenant": MARKER.decode(), "content-type": "application/json"}
    client = RoutingQueueClient(src, "a", "policy", keyring=ring)
    with src.write() as conn:
        for i in range(3):
            client.transmit_log_entry_message(conn, _payload(i), ["b"], headers=given)
        assert _scan(src, conn) == []  # sealed as written
    wait_for(lambda: len(_stored(sink)) >= 3, scaled(30))
    assert _scan(src) == [] and _scan(sink) == []  # the tenant is sealed at rest, both ends
    listener = WithHeaders()
    with RoutingQueueSubscriber(sink, "policy", listener, keyring=Keyring({"k1": K1})) as sub:
        assert _drain(sub) == 3
    assert listener.headers == [given] * 3
    assert listener.payloads == [_payload(i) for i in range(3)]


def test_sealed_headers_too_large_for_a_header_are_refused_and_nothing_is_written(
    sites: Sites,
) -> None:
    src, _ = _pair(sites)
    ring = Keyring({"k1": K1}, sealed_headers=["tenant"])
    client = RoutingQueueClient(src, "a", "policy", keyring=ring)
    with pytest.raises(InvalidHeadersError, match="lr-sealed"), src.write() as conn:
        client.transmit_log_entry_message(conn, b"x", ["b"], headers={"tenant": "t" * 1000})
    with src.read() as conn:
        assert conn.execute(select(s.send_log_entries.c.position)).first() is None


def test_sealed_headers_come_from_the_config_and_must_be_a_list_of_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LR_TEST_KEYS", f"k1:{K1}")
    ring = Keyring.from_config({"env": "LR_TEST_KEYS", "sealed_headers": ["tenant"]})
    assert ring.sealed_headers == {"tenant"}
    with pytest.raises(ConfigError, match="sealed_headers"):
        Keyring({"k1": K1}, sealed_headers="tenant")
