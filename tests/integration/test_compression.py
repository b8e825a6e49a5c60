"""Compression on the wire, end to end: real gRPC on loopback between in-process sites,
on both backends. The source compresses only what its sink accepted at negotiation."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient, RoutingQueueListener, RoutingQueueSubscriber
from lr_client._proto import replication_pb2 as pb
from lr_client.listener import RoutingQueueMessage
from lr_server.protocol import codecs
from lr_server.receiving.receiver import Receiver
from tests.kit.sites import Sites
from tests.kit.wait import scaled, wait_for

pytestmark = pytest.mark.stop_calls_at_once

N = 60


class Applied(RoutingQueueListener):
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.payloads += [m.payload for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def _payload(i: int) -> bytes:
    doc = {"id": i, "holder": f"policy holder {i}", "lines": [{"n": k} for k in range(40)]}
    return json.dumps(doc).encode()


#: The lane of every log batch with entries a receiver is given (see ``received``).
LANES: list[int] = []


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The codec of every log batch with entries a receiver is given, in order ('':
    uncompressed); their lanes in ``LANES``."""
    seen: list[str] = []
    LANES.clear()
    apply = Receiver.apply

    def recording(self: Receiver, source_id: str, batch: pb.ReplicationBatch) -> pb.ReplicationAck:
        if batch.kind == pb.BATCH_LOG_ENTRY and (batch.entries or batch.compressed):
            seen.append(batch.codec)
            LANES.append(batch.lane)
        return apply(self, source_id, batch)

    monkeypatch.setattr(Receiver, "apply", recording)
    yield seen


def _replicate(sites: Sites, codec: str, before_source: Callable[[], None] = lambda: None) -> None:
    """Start sink ``b`` and source ``a`` (its destination ``compression = codec``), transmit
    N entries in batches of 20 and check they are all delivered at ``b``, in order."""
    sites.start("b", sources=["a"])
    before_source()
    sites.start("a", dests=["b"], dest_options=f'compression = "{codec}"')
    client = RoutingQueueClient(sites.store("a"), "a", "policy")
    store = sites.store("a")
    for start in range(0, N, 20):
        with store.write() as conn:
            for i in range(start, start + 20):
                client.transmit_log_entry_message(conn, _payload(i), ["b"])
    listener = Applied()
    with RoutingQueueSubscriber(sites.store("b"), "policy", listener) as sub:
        wait_for(lambda: sub.poll_once() >= 0 and len(listener.payloads) >= N, scaled(30))
    assert listener.payloads == [_payload(i) for i in range(N)]


@pytest.mark.parametrize("codec", ["zlib", "zstd"])
def test_batches_travel_compressed_and_arrive_whole(
    sites: Sites, received: list[str], codec: str
) -> None:
    _replicate(sites, codec)
    assert received and set(received) == {codec}


def test_a_sink_without_zstd_gets_batches_uncompressed(
    sites: Sites, received: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The source loads its configuration with zstd installed; the sink then answers as
    # one without it would.
    def sink_without_zstd() -> None:
        monkeypatch.setattr(codecs, "available", lambda: ["zlib"])

    _replicate(sites, "zstd", sink_without_zstd)
    assert received and set(received) == {""}


def test_an_older_sink_gets_batches_uncompressed(
    sites: Sites, received: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    negotiate = Receiver.negotiate

    def version_5(
        self: Receiver, source_id: str, request: pb.NegotiateRequest
    ) -> pb.NegotiateResponse:
        response = negotiate(self, source_id, request)
        response.protocol_version = 5  # a release before compression: it answers no codecs
        response.ClearField("codecs")
        return response

    monkeypatch.setattr(Receiver, "negotiate", version_5)
    _replicate(sites, "zlib")
    assert received and set(received) == {""}


def test_a_zip_bomb_is_refused_with_invalid_argument(sites: Sites) -> None:
    from lr_client.errors import ProtocolError
    from lr_server.config import DestinationConfig, SecurityConfig
    from lr_server.transport.grpc_client import GrpcTransport

    sites.start("b", sources=["a"])
    dest = DestinationConfig(id="b", address=f"127.0.0.1:{sites.port('b')}")
    security = SecurityConfig(transport="plaintext", client_auth="token", token="token-a")
    transport = GrpcTransport("a", dest, security, 1 << 20)
    bomb = pb.ReplicationBatch(
        batch_id=1,
        client_name="policy",
        kind=pb.BATCH_LOG_ENTRY,
        first_position=1,
        last_position=1,
        codec="zstd",
        compressed=codecs.compress("zstd", b"\0" * (256 << 20)),  # past the sink's 65 MiB
    )
    try:
        transport.negotiate(pb.NegotiateRequest(source_id="a", clients=["policy"]), scaled(10))
        stream = transport.open_stream()
        stream.send(bomb)
        with pytest.raises(ProtocolError, match=r"INVALID_ARGUMENT: .*expands past"):
            wait_for(lambda: stream.next_ack(0.2), scaled(10))
    finally:
        transport.close()
    assert sites.store("b").queues.list_queues() == []


def test_every_lane_of_a_destination_compresses(sites: Sites, received: list[str]) -> None:
    """Three streams to one destination: negotiated over the first, used by all."""
    sites.start("b", sources=["a"])
    sites.start(
        "a",
        dests=["b"],
        dest_options='compression = "zstd"',
        replication="streams_per_destination = 3\nbatch_max_entries = 10",
    )
    store = sites.store("a")
    client = RoutingQueueClient(store, "a", "policy")
    with store.write() as conn:
        for i in range(N):
            client.transmit_log_entry_message(conn, _payload(i), ["b"], key=f"k{i % 7}")
    listener = Applied()
    with RoutingQueueSubscriber(sites.store("b"), "policy", listener) as sub:
        wait_for(lambda: sub.poll_once() >= 0 and len(listener.payloads) >= N, scaled(30))
    assert sorted(listener.payloads) == sorted(_payload(i) for i in range(N))
    assert set(received) == {"zstd"} and len(set(LANES)) > 1
