"""The wire protocol's version: rolling upgrades work, a too-old peer is refused clearly.

Real gRPC on loopback against a real sink server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import IncompatibleVersionError
from lr_server.config import ClientConfig
from lr_server.protocol import versions as protocol
from lr_server.sending.session import SenderSession
from lr_server.transport.grpc_client import GrpcTransport
from tests.integration.test_security import Sink, _token


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Sink]:
    s = Sink(tmp_path, "token")
    yield s
    s.close()


def _negotiate(sink: Sink, version: int) -> pb.NegotiateResponse:
    t: GrpcTransport = sink.transport("site-a", _token("token-site-a"))
    try:
        request = pb.NegotiateRequest(source_id="site-a", clients=["policy"])
        if version:
            request.protocol_version = version
        return t.negotiate(request, timeout=10)
    finally:
        t.close()


def test_the_sink_announces_its_version_to_a_current_source(sink: Sink) -> None:
    response = _negotiate(sink, protocol.PROTOCOL_VERSION)
    assert response.protocol_version == protocol.PROTOCOL_VERSION
    assert response.drop_notices


def test_a_first_release_source_without_a_version_is_still_accepted(sink: Sink) -> None:
    assert protocol.MIN_PEER_VERSION <= 1  # sites are upgraded one at a time
    response = _negotiate(sink, 0)
    assert [c.client_name for c in response.clients] == ["policy"]


def test_a_too_old_source_gets_a_clear_refusal(sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    # As a later release that no longer accepts version 1 would answer.
    monkeypatch.setattr(protocol, "MIN_PEER_VERSION", 2)
    with pytest.raises(IncompatibleVersionError) as refused:
        _negotiate(sink, 0)
    message = str(refused.value)
    assert message.startswith("FAILED_PRECONDITION")
    assert "source 'site-a' speaks wire protocol 1" in message
    assert "needs 2 or newer" in message
    assert sink.store.queues.list_queues() == []
    # a source of an accepted version still gets in
    assert _negotiate(sink, 2).protocol_version == protocol.PROTOCOL_VERSION


def test_a_source_refuses_a_too_old_sink(sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    session = SenderSession(
        sink.server.store,
        "site-a",
        "sink",
        [ClientConfig("policy")],
        lambda: sink.transport("site-a", _token("token-site-a")),
    )
    old_sink = pb.NegotiateResponse(sink_id="sink", clients=[pb.ClientState(client_name="policy")])
    assert session._plan(old_sink)  # version 1 is accepted today
    monkeypatch.setattr(protocol, "MIN_PEER_VERSION", 2)
    with pytest.raises(IncompatibleVersionError, match="sink 'sink' speaks wire protocol 1"):
        session._plan(old_sink)


def test_lanes_need_a_sink_of_version_4() -> None:
    protocol.require("lanes", protocol.LANES_VERSION, "'sink'")
    with pytest.raises(IncompatibleVersionError, match="streams_per_destination > 1 needs 4"):
        protocol.require("lanes", 3, "'sink'")
