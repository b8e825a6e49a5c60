"""``lr replay``: a range of a stream shipped again to one destination, flagged replayed.

A source store and two sink stores (destinations b and c) on each backend, the
sessions driven step by step in-process (no timing involved); real stores, the
session's and receiver's own code.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client._proto import replication_pb2 as pb
from lr_client.aio import AsyncRoutingQueueListener, AsyncRoutingQueueSubscriber
from lr_client.errors import ProtocolError
from lr_client.listener import RoutingQueueListener, RoutingQueueMessage
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server import admin, load_config, parse_config
from lr_server.config import ClientConfig, ReplicationConfig, SiteConfig
from lr_server.protocol import versions as protocol
from lr_server.receiving.receiver import Receiver
from lr_server.sending.session import SenderSession
from lr_server.sending.streams import ClientStream
from lr_server.transport.base import BatchStream
from lr_server.transport.inproc import InProcessTransport
from tests.kit.aio import DRIVER_PARAMS, aio_site
from tests.kit.positions import new_slot
from tests.kit.sites import Sites, wait_for

CLIENTS = ("policy", "other")


class Seen(RoutingQueueListener):
    """Records (position, replayed) of every log entry delivered."""

    def __init__(self) -> None:
        self.log: list[tuple[int, bool]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.log += [(m.source_position, m.replayed) for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        raise AssertionError("no full sync here")


class Link:
    """One destination: its sink store, receiver and the source's session to it."""

    def __init__(self, src: SQLAlchemyQueueStore, dest: str, url: str, batch: int) -> None:
        self.sink = open_store(url)
        self.sink.create_schema()
        self.receiver = Receiver(self.sink, dest, ["a"])
        self.transport = InProcessTransport(self.receiver, "a")
        self.session = SenderSession(
            src,
            "a",
            dest,
            [ClientConfig(c) for c in CLIENTS],
            lambda: self.transport,
            ReplicationConfig(batch_max_entries=batch, poll_interval=0.01),
        )
        self.streams: dict[str, ClientStream] = {}
        self.stream: BatchStream | None = None

    def connect(self) -> None:
        request = pb.NegotiateRequest(
            source_id="a", clients=list(CLIENTS), protocol_version=protocol.PROTOCOL_VERSION
        )
        response = self.transport.negotiate(request, 10.0)
        self.streams = self.session._plan(response)
        self.session.replays.connected(response.protocol_version)
        self.session.window.clear()
        self.stream = self.transport.open_stream()

    def step(self) -> None:
        """One request check and one pump round, acknowledgements taken."""
        assert self.stream is not None
        self.session._check_requests(self.streams)
        self.session._ship(self.stream, self.streams)
        self.session.acks.wait(threading.Event(), self.stream, self.streams, 0.0)

    def run_until(self, done: Callable[[], bool]) -> None:
        def stepped() -> bool:
            self.step()
            return done()

        wait_for(stepped, timeout=30, interval=0.01)

    def deliver(self, client: str = "policy") -> list[tuple[int, bool]]:
        seen = Seen()
        with RoutingQueueSubscriber(self.sink, client, seen) as sub:
            while sub.poll_once():
                pass
        return seen.log


def config(url: str) -> SiteConfig:
    return parse_config(
        {
            "site": {"id": "a", "database_url": url},
            "security": {"transport": "plaintext", "client_auth": "token", "token": "t"},
            "clients": [{"name": c} for c in CLIENTS],
            "destinations": [
                {"id": "b", "address": "127.0.0.1:7001"},
                {"id": "c", "address": "127.0.0.1:7002"},
            ],
        }
    )


@pytest.fixture
def links(
    store: SQLAlchemyQueueStore, db_url_factory: Callable[[str], str]
) -> Iterator[dict[str, Link]]:
    store.sites.register_sites(["b", "c"])
    made = {d: Link(store, d, db_url_factory(d), batch=2) for d in ("b", "c")}
    try:
        yield made
    finally:
        for link in made.values():
            link.sink.engine.dispose()


def transmit(store: SQLAlchemyQueueStore, client: str, n: int, dests: list[str]) -> None:
    sender = RoutingQueueClient(store, source_id="a", client_name=client)
    for i in range(n):
        new_slot(store)
        with store.engine.begin() as conn:
            sender.transmit_log_entry_message(conn, b"%d" % i, dests)


def shipped(store: SQLAlchemyQueueStore, links: dict[str, Link]) -> list[int]:
    """Transmit policy to b and c, other to b; ship it all; deliver it once; policy's
    positions."""
    transmit(store, "policy", 5, ["b", "c"])
    last = {"policy": store.send.head_position()}
    transmit(store, "other", 2, ["b"])
    last["other"] = store.send.head_position()
    wanted = {"b": last, "c": {"policy": last["policy"]}}
    for dest, link in links.items():
        link.connect()
        link.run_until(
            lambda d=dest: all(  # type: ignore[misc]
                store.shipping.get_cursor(d, c).position >= p for c, p in wanted[d].items()
            )
        )
    policy = [p for p, _ in links["b"].deliver("policy")]
    assert policy == [p for p, _ in links["c"].deliver("policy")] and len(policy) == 5
    assert len(links["b"].deliver("other")) == 2
    return policy


def test_a_replay_delivers_exactly_its_range_again_flagged_and_nothing_else(
    store: SQLAlchemyQueueStore, db_url: str, links: dict[str, Link]
) -> None:
    policy = shipped(store, links)
    b, c = links["b"], links["c"]
    cursor_c = store.shipping.get_cursor("c", "policy").position
    request = admin.replay(config(db_url), store, "b", "policy", policy[2])
    assert (request.status, request.from_position) == ("pending", policy[2])
    assert [r.replay_id for r in admin.list_replays(store)] == [request.replay_id]  # lr status
    b.run_until(lambda: not admin.list_replays(store))
    done = store.replays.list_replays()[0]
    assert (done.status, done.through_position, done.shipped_through) == (
        "done",
        policy[-1],
        policy[-1],
    )
    # exactly positions policy[2:] again (from inclusive), flagged; nothing else
    assert b.deliver("policy") == [(p, True) for p in policy[2:]]
    assert b.deliver("other") == []
    assert c.deliver("policy") == []
    assert store.shipping.get_cursor("c", "policy").position == cursor_c
    assert (
        store.shipping.get_cursor("b", "policy").position == policy[-1]
    )  # the cursor never moved back
    # exactly-once holds again after the replay: new entries once, not flagged
    transmit(store, "policy", 1, ["b"])
    b.run_until(lambda: store.shipping.get_cursor("b", "policy").position > policy[-1])
    assert b.deliver("policy") == [(store.send.head_position(), False)]


def test_a_read_of_requests_begun_before_the_replay_ended_does_not_start_it_again(
    store: SQLAlchemyQueueStore, db_url: str, links: dict[str, Link]
) -> None:
    """The sessions share their reads of requests (request_board.py); one begun before
    this session finished a replay still shows it open, and must not run it twice."""
    policy = shipped(store, links)
    b = links["b"]
    admin.replay(config(db_url), store, "b", "policy", policy[2])
    stale = b.session.board.read()
    assert [r.status for r in stale.replays_of("b")] == ["pending"]
    b.run_until(lambda: not admin.list_replays(store))
    b.session.replays.check(b.streams, b.session.cascade, stale)
    assert not b.session.replays.runs
    assert store.replays.list_replays()[0].status == "done"


def test_a_replay_cut_by_a_lost_connection_resumes_after_what_was_acknowledged(
    store: SQLAlchemyQueueStore, db_url: str, links: dict[str, Link]
) -> None:
    policy = shipped(store, links)
    b = links["b"]
    admin.replay(config(db_url), store, "b", "policy", policy[0])
    b.step()  # picked up, its first batch (2 entries) shipped and acknowledged
    assert store.replays.list_replays()[0].shipped_through == policy[1]
    b.connect()  # a new connection (as after a restart): the request is picked up again
    b.run_until(lambda: not admin.list_replays(store))
    assert b.deliver("policy") == [(p, True) for p in policy]


def test_a_replay_below_the_trim_point_is_refused_with_a_full_sync_hint(
    store: SQLAlchemyQueueStore, db_url: str, links: dict[str, Link]
) -> None:
    policy = shipped(store, links)
    admin.trim(config(db_url), store)
    assert store.retention.trimmed_through("b", "policy") >= policy[0]
    with pytest.raises(admin.FullSyncNeededError, match="lr snapshot request") as refused:
        admin.replay(config(db_url), store, "b", "policy", policy[0])
    assert "full sync is needed" in str(refused.value)
    assert store.replays.list_replays() == []
    with pytest.raises(admin.AdminInputError, match="shipped to it in their turn"):
        admin.replay(config(db_url), store, "b", "policy", policy[-1] + 1)
    with pytest.raises(admin.AdminInputError, match="not a destination"):
        admin.replay(config(db_url), store, "z", "policy", 1)


def test_a_replay_to_a_version_5_sink_is_refused(
    store: SQLAlchemyQueueStore,
    db_url: str,
    links: dict[str, Link],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = shipped(store, links)
    b = links["b"]
    real = b.receiver.negotiate

    def old_sink(source_id: str, request: pb.NegotiateRequest) -> pb.NegotiateResponse:
        response = real(source_id, request)
        response.protocol_version = 5  # as a sink of the previous release answers
        return response

    monkeypatch.setattr(b.receiver, "negotiate", old_sink)
    b.connect()
    admin.replay(config(db_url), store, "b", "policy", policy[0])
    b.step()
    refused = store.replays.list_replays()[0]
    assert refused.status == "refused"
    assert "sink 'b' speaks wire protocol 5; replay needs 6 or newer" in refused.error
    assert b.deliver("policy") == []


def test_a_sink_refuses_a_replayed_batch_from_a_version_5_source(
    links: dict[str, Link],
) -> None:
    receiver = links["b"].receiver
    request = pb.NegotiateRequest(source_id="a", clients=["policy"], protocol_version=5)
    receiver.negotiate("a", request)
    batch = pb.ReplicationBatch(
        batch_id=1,
        client_name="policy",
        kind=pb.BATCH_LOG_ENTRY,
        replay=True,
        entries=[pb.RoutingTableEntryMsg(type=pb.LOG_ENTRY_SYNC, position=1, opaque_payload=b"x")],
    )
    with pytest.raises(ProtocolError, match="negotiated a protocol without replay"):
        receiver.apply("a", batch)
    # a replayed entry the sink does not hold yet is left out: it comes in its turn, once
    receiver.negotiate("a", pb.NegotiateRequest(source_id="a", clients=["policy"]))
    request.protocol_version = protocol.PROTOCOL_VERSION
    receiver.negotiate("a", request)
    assert receiver.apply("a", batch).duplicate
    links["b"].sink.recv.apply_log_batch(
        "a", "policy", [WireEntry(1, ReplicationType.LOG_ENTRY_SYNC, b"x")]
    )
    assert not receiver.apply("a", batch).duplicate
    assert links["b"].deliver("policy") == [(1, False), (1, True)]


class AsyncSeen(AsyncRoutingQueueListener):
    def __init__(self) -> None:
        self.log: list[tuple[int, bool, str]] = []

    async def process_log_entries(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.log += [(m.source_position, m.replayed, m.snapshot_id) for m in messages]
        return True

    async def process_full_sync(
        self, session: AsyncSession, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        raise AssertionError("no full sync here")


@pytest.mark.parametrize("driver", DRIVER_PARAMS)
def test_the_async_listener_sees_replayed_entries_flagged(driver: str, tmp_path: Path) -> None:
    log = ReplicationType.LOG_ENTRY_SYNC
    with aio_site(driver, tmp_path) as site:
        site.store.recv.apply_log_batch("a", "policy", [WireEntry(p, log, b"x") for p in (1, 2)])
        site.store.replays.apply_replay_batch("a", "policy", [WireEntry(2, log, b"x")])
        listener = AsyncSeen()

        async def main() -> int:
            engine = site.engine()
            sub = AsyncRoutingQueueSubscriber(engine, "policy", listener)
            try:
                return await sub.poll_once()
            finally:
                await sub.close()
                await engine.dispose()

        asyncio.run(main())
    assert listener.log == [(1, False, ""), (2, False, ""), (2, True, "")]


def test_a_sink_rewind_delivers_again_what_its_queue_still_holds(
    store: SQLAlchemyQueueStore,
) -> None:
    log = ReplicationType.LOG_ENTRY_SYNC
    for source in ("a", "x"):
        store.recv.apply_log_batch(source, "policy", [WireEntry(p, log, b"x") for p in (2, 4, 6)])
    store.recv.apply_log_batch("a", "other", [WireEntry(p, log, b"x") for p in (3, 5)])
    for client in CLIENTS:
        with RoutingQueueSubscriber(store, client, Seen()) as sub:
            while sub.poll_once():
                pass
    sink = parse_config(
        {
            "site": {"id": "b", "database_url": "sqlite://", "listen": "127.0.0.1:7001"},
            "security": {"transport": "plaintext"},
            "sources": [{"id": "a"}, {"id": "x"}],
        }
    )
    with pytest.raises(admin.AdminInputError, match="not a source"):
        admin.rewind(sink, store, "z", "policy", 3)
    if not store.core.keeps_delivered:  # SQLite deleted them as it delivered them
        with pytest.raises(admin.StateError, match="holds no delivered entry at or after 3"):
            admin.rewind(sink, store, "a", "policy", 3)
        return
    with pytest.raises(admin.StateError, match="lr replay"):
        admin.rewind(sink, store, "a", "policy", 7)
    done = admin.rewind(sink, store, "a", "policy", 3)
    assert (done.entries, done.first_position, done.last_position) == (2, 4, 6)
    seen = Seen()
    with RoutingQueueSubscriber(store, "policy", seen) as sub:
        while sub.poll_once():
            pass
    assert seen.log == [(4, True), (6, True)]  # source x's queue and client other untouched
    assert store.inspection.queue_depths() == {}


def test_a_replay_requested_while_the_source_is_down_runs_once_it_is_up(
    sites: Sites, tmp_path: Path
) -> None:
    """Real servers over gRPC on loopback: the request is a row the restarted server
    picks up."""
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"])
    src = sites.store("a")
    transmit(src, "policy", 3, ["b"])
    last = src.send.head_position()
    wait_for(lambda: src.shipping.get_cursor("b", "policy").position == last, timeout=30)
    sites.stop("a")
    request = admin.replay(load_config(tmp_path / "a.toml"), src, "b", "policy", last - 1)
    sites.start("a", dests=["b"])
    wait_for(lambda: src.replays.list_replays()[0].status == "done", timeout=30)
    assert src.replays.list_replays()[0].replay_id == request.replay_id
    seen = Seen()
    with RoutingQueueSubscriber(sites.store("b"), "policy", seen) as sub:
        while sub.poll_once():
            pass
    once = [(p, False) for p in range(last - 2, last + 1)]
    assert seen.log == [*once, (last - 1, True), (last, True)]
