"""One destination over several gRPC streams (``streams_per_destination``), on loopback.

Keyed and unkeyed entries are shipped over three lanes, each its own connection
(through a TCP proxy that counts and resets them). At the sink every entry
arrives once, the entries of a key in order, and an entry without a key after
every entry before it and before every entry after it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.sites import Sites, wait_for
from tests.kit.tcp_proxy import FaultProxy

LANES = "streams_per_destination = 3\nbatch_max_entries = 20\nwindow_batches = 2"


def key_of(i: int) -> bytes | None:
    return None if i % 9 == 0 else b"k%d" % (i % 5)


class Writer:
    """Transmits entries i = 0, 1, ... in small transactions, keyed or not by ``key_of``."""

    def __init__(self, store: SQLAlchemyQueueStore) -> None:
        self.client = RoutingQueueClient(store, source_id="a", client_name="policy")
        self.client.register_destinations(["b"])
        self.store = store
        self.sent = 0

    def write(self, n: int, per_tx: int = 7) -> None:
        end = self.sent + n
        while self.sent < end:
            with Session(self.store.engine) as session, session.begin():
                for i in range(self.sent, min(self.sent + per_tx, end)):
                    self.client.transmit_log_entry_message(
                        session, b"p%d" % i, ["b"], key=key_of(i)
                    )
            self.sent = min(self.sent + per_tx, end)


def received(sink: SQLAlchemyQueueStore) -> list[tuple[int, bytes, bytes | None]]:
    queues = sink.queues.list_queues("policy")
    if not queues:
        return []
    with sink.read() as conn:
        rows = sink.queues.read_queue(conn, queues[0].queue_id, 1_000_000)
    return [(e.source_position, e.payload, e.key) for e in rows]


def check(rows: list[tuple[int, bytes, bytes | None]], sent: int) -> None:
    """Every entry once; per key in order; an unkeyed entry a barrier."""
    payloads = [p for _, p, _ in rows]
    assert sorted(payloads) == sorted(b"p%d" % i for i in range(sent))  # none lost, none twice
    last: dict[bytes | None, int] = {}
    for pos, _, key in rows:
        assert pos > last.get(key, 0), f"key {key!r} out of order at {pos}"
        last[key] = pos
    for i, (pos, _, key) in enumerate(rows):
        if key is None:
            assert all(p < pos for p, _, _ in rows[:i]), f"unkeyed {pos} overtaken"
            assert all(p > pos for p, _, _ in rows[i + 1 :]), f"unkeyed {pos} overtook"


@pytest.fixture
def proxied(sites: Sites) -> Iterator[FaultProxy]:
    """Site b (the sink), reached by a through a proxy."""
    sites.start("b", sources=["a"])
    with FaultProxy("127.0.0.1", sites.port("b")) as proxy:
        real = sites.ports["b"]
        sites.ports["b"] = proxy.port  # a's destination address
        yield proxy
        sites.ports["b"] = real


def test_three_lanes_ship_keyed_and_unkeyed_entries_once_in_order(
    sites: Sites, proxied: FaultProxy
) -> None:
    sites.start("a", dests=["b"], replication=LANES)
    writer, sink = Writer(sites.store("a")), sites.store("b")
    writer.write(300)
    wait_for(lambda: len(received(sink)) >= writer.sent, timeout=60)
    check(received(sink), writer.sent)
    assert proxied.connections_total == 3  # one connection per lane


def test_one_lanes_connection_reset_mid_run_loses_and_repeats_nothing(
    sites: Sites, proxied: FaultProxy
) -> None:
    sites.start("a", dests=["b"], replication=LANES)
    writer, sink = Writer(sites.store("a")), sites.store("b")
    done = threading.Event()

    def write() -> None:
        writer.write(400, per_tx=5)
        done.set()

    t = threading.Thread(target=write)
    t.start()
    wait_for(lambda: len(received(sink)) >= 100, timeout=60)
    assert proxied.reset_one()
    t.join()
    wait_for(lambda: len(received(sink)) >= writer.sent, timeout=60)
    check(received(sink), writer.sent)
    assert proxied.connections_total > 3  # the session connected again


def test_a_sender_restart_resumes_without_a_full_sync(sites: Sites, proxied: FaultProxy) -> None:
    sites.start("a", dests=["b"], replication=LANES)
    writer, sink = Writer(sites.store("a")), sites.store("b")
    writer.write(200)
    wait_for(lambda: len(received(sink)) >= 50, timeout=60)
    sites.stop("a")
    writer.write(200)
    sites.start("a", dests=["b"], replication=LANES)
    wait_for(lambda: len(received(sink)) >= writer.sent, timeout=60)
    check(received(sink), writer.sent)
    assert sink.recv.list_sink_drops() == []
    assert not [e for e in received(sink) if not e[1].startswith(b"p")]  # no snapshot


def test_a_first_contact_snapshot_then_keyed_and_unkeyed_entries_over_lanes(
    sites: Sites,
) -> None:
    """The snapshot travels on the first stream; log entries follow over three lanes,
    those of each row in order: the sink's table ends equal to the source's."""
    from lr_client.snapshot import SnapshotProviderRunner
    from tests.integration.test_full_sync import running, sink_app, source_app
    from tests.kit import kvapp

    src, client = source_app(sites, "a", ["b"])
    for i in range(40):
        kvapp.write(src.engine, client, {f"k{i}": i}, ["b"], keyed=True)
    sink, sub, listener = sink_app(sites, "b")
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app", replication=LANES)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    with running(runner, sub):
        for i in range(200):
            kvapp.write(src.engine, client, {f"k{i % 60}": 1000 + i}, ["b"], keyed=i % 10 != 0)
        wait_for(lambda: kvapp.table(sink.engine) == kvapp.table(src.engine), timeout=60)
    assert len(listener.full_syncs) == 1
    assert listener.errors == []


def test_a_restart_with_another_stream_count_applies_nothing_twice(
    sites: Sites, proxied: FaultProxy
) -> None:
    """Entries the sink holds past its position under 3 lanes are skipped when sent
    again over 2 (the sink finds each entry's lane under the old count from its key)."""
    sites.start("a", dests=["b"], replication=LANES)
    writer, sink = Writer(sites.store("a")), sites.store("b")
    writer.write(500, per_tx=50)
    wait_for(lambda: len(received(sink)) >= 100, timeout=60)
    sites.stop("a")
    # The sink holds entries past its position, known only by their lanes' progress.
    held = max(pos for pos, _, _ in received(sink))
    assert held > sink.recv.sink_progress("a", "policy").last_position
    writer.write(100)
    sites.start("a", dests=["b"], replication=LANES.replace("= 3", "= 2"))
    wait_for(lambda: len(received(sink)) >= writer.sent, timeout=60)
    check(received(sink), writer.sent)
