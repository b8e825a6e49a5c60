"""Invariant I6 and bad batches at the gRPC boundary: rejected, sink unchanged, still serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lr_client import AuthenticationError, PermissionDeniedError, ProtocolError
from lr_client._proto import replication_pb2 as pb
from lr_client.errors import LRError
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_server.config import DestinationConfig, SecurityConfig, load_config
from lr_server.server import SiteServer
from lr_server.transport.grpc_client import GrpcTransport
from tests.kit.certs import Pki, make_pki
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.wait import scaled


def _batch(
    client: str = "policy", positions: tuple[int, ...] = (1,), **kw: object
) -> pb.ReplicationBatch:
    entries = [
        pb.RoutingTableEntryMsg(type=pb.LOG_ENTRY_SYNC, opaque_payload=b"x", position=p)
        for p in positions
    ]
    return pb.ReplicationBatch(
        batch_id=1,
        client_name=client,
        kind=pb.BATCH_LOG_ENTRY,
        entries=entries,
        **kw,  # type: ignore[arg-type]
    )


def _push(transport: GrpcTransport, batch: pb.ReplicationBatch) -> pb.ReplicationAck:
    stream = transport.open_stream()
    try:
        stream.send(batch)
        ack = stream.next_ack(timeout=scaled(15))
        assert ack is not None
        return ack
    finally:
        stream.close()


def _entries(store: SQLAlchemyQueueStore) -> int:
    return sum(store.queues.queue_depth(q.queue_id) for q in store.queues.list_queues())


class Sink:
    def __init__(self, tmp_path: Path, security: str, pki: Pki | None = None) -> None:
        self.port = free_port()
        url = f"sqlite:///{tmp_path / 'sink.db'}"
        spec = SiteSpec("sink", url, port=self.port, sources=["site-a"])
        self.config = load_config(write_config(tmp_path, spec, security=security, pki=pki))
        self.server = SiteServer(self.config)
        self.server.start()
        self.store = open_store(url)

    def transport(self, source: str, security: SecurityConfig) -> GrpcTransport:
        dest = DestinationConfig(id="sink", address=f"127.0.0.1:{self.port}", server_name="sink")
        return GrpcTransport(source, dest, security, 1 << 20)

    def close(self) -> None:
        self.server.stop()
        self.store.engine.dispose()


@pytest.fixture
def token_sink(tmp_path: Path) -> Iterator[Sink]:
    sink = Sink(tmp_path, "token")
    yield sink
    sink.close()


def _token(token: str) -> SecurityConfig:
    return SecurityConfig(transport="plaintext", client_auth="token", token=token)


def test_token_auth_accepts_the_configured_source(token_sink: Sink) -> None:
    t = token_sink.transport("site-a", _token("token-site-a"))
    try:
        ack = _push(t, _batch())
    finally:
        t.close()
    assert not ack.duplicate and ack.last_position == 1
    assert _entries(token_sink.store) == 1


@pytest.mark.parametrize(
    ("source", "token", "error"),
    [
        ("site-a", "wrong", AuthenticationError),
        ("site-a", "", AuthenticationError),
        ("site-x", "token-site-a", PermissionDeniedError),
    ],
)
def test_token_auth_rejects(
    token_sink: Sink, source: str, token: str, error: type[LRError]
) -> None:
    t = token_sink.transport(source, _token(token))
    try:
        with pytest.raises(error):
            t.negotiate(
                pb.NegotiateRequest(source_id=source, clients=["policy"]), timeout=scaled(10)
            )
        with pytest.raises(error):
            _push(t, _batch())
    finally:
        t.close()
    assert token_sink.store.queues.list_queues() == []
    # and the sink keeps serving the good source
    good = token_sink.transport("site-a", _token("token-site-a"))
    try:
        assert _push(good, _batch()).last_position == 1
    finally:
        good.close()


@pytest.fixture
def plaintext_sink(tmp_path: Path) -> Iterator[Sink]:
    sink = Sink(tmp_path, "plaintext")
    yield sink
    sink.close()


def test_plaintext_alone_accepts_a_configured_source_and_refuses_others(
    plaintext_sink: Sink,
) -> None:
    """``transport = "plaintext"`` alone (loopback): the claimed source must be configured."""
    assert plaintext_sink.config.security.client_auth == "none"
    trial = SecurityConfig(transport="plaintext", client_auth="none")
    good = plaintext_sink.transport("site-a", trial)
    try:
        assert _push(good, _batch()).last_position == 1
    finally:
        good.close()
    other = plaintext_sink.transport("site-x", trial)
    try:
        with pytest.raises(PermissionDeniedError):
            _push(other, _batch(positions=(2,)))
    finally:
        other.close()
    assert _entries(plaintext_sink.store) == 1


@pytest.mark.parametrize(
    "batch",
    [
        _batch(client="Bad_Name"),
        _batch(positions=(3, 2)),
        _batch(source_id="site-b"),
        _batch(previous_position=7),
        pb.ReplicationBatch(batch_id=1, client_name="policy", kind=pb.BATCH_SNAPSHOT),
        pb.ReplicationBatch(batch_id=1, client_name="policy", kind=0),
        pb.ReplicationBatch(
            batch_id=1,
            client_name="policy",
            kind=pb.BATCH_LOG_ENTRY,
            entries=[pb.RoutingTableEntryMsg(type=pb.SNAPSHOT_SYNC, position=1)],
        ),
        pb.ReplicationBatch(
            batch_id=1,
            client_name="policy",
            kind=pb.BATCH_LOG_ENTRY,
            entries=[
                pb.RoutingTableEntryMsg(destinations=["x"], type=pb.LOG_ENTRY_SYNC, position=1)
            ],
        ),
    ],
)
def test_malformed_batches_are_rejected_and_change_nothing(
    token_sink: Sink, batch: pb.ReplicationBatch
) -> None:
    t = token_sink.transport("site-a", _token("token-site-a"))
    try:
        with pytest.raises(ProtocolError):
            _push(t, batch)
        assert _entries(token_sink.store) == 0
        assert _push(t, _batch()).last_position == 1  # still serving
    finally:
        t.close()


def test_oversized_batch_is_rejected(token_sink: Sink) -> None:
    t = token_sink.transport("site-a", _token("token-site-a"))
    big = _batch()
    big.entries[0].opaque_payload = b"x" * (2 << 20)  # over the 1 MiB channel limit here
    try:
        with pytest.raises(LRError):
            _push(t, big)
        assert _entries(token_sink.store) == 0
    finally:
        t.close()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", client_names=("site-a", "sink", "site-x"))


@pytest.fixture
def mtls_sink(tmp_path: Path, pki: Pki) -> Iterator[Sink]:
    sink = Sink(tmp_path, "mtls", pki)
    yield sink
    sink.close()


def _mtls(pki: Pki, cert: Path, key: Path) -> SecurityConfig:
    return SecurityConfig(
        transport="tls", client_auth="mtls", ca_file=pki.ca.cert, cert_file=cert, key_file=key
    )


def test_mtls_accepts_the_configured_source(mtls_sink: Sink, pki: Pki) -> None:
    c = pki.client("site-a")
    t = mtls_sink.transport("site-a", _mtls(pki, c.cert, c.key))
    try:
        assert _push(t, _batch()).last_position == 1
    finally:
        t.close()


@pytest.mark.parametrize("which", ["wrong_ca", "expired", "unknown_site", "impersonation"])
def test_mtls_rejects_bad_certificates(mtls_sink: Sink, pki: Pki, which: str) -> None:
    source = "site-a"
    if which == "wrong_ca":
        sec = _mtls(pki, pki.wrong_client.cert, pki.wrong_client.key)
    elif which == "expired":
        sec = _mtls(pki, pki.expired_client.cert, pki.expired_client.key)
    elif which == "unknown_site":
        c = pki.client("site-x")
        sec, source = _mtls(pki, c.cert, c.key), "site-x"
    else:  # a valid certificate of another site claiming to be site-a
        c = pki.client("site-x")
        sec = _mtls(pki, c.cert, c.key)
    t = mtls_sink.transport(source, sec)
    try:
        with pytest.raises(LRError) as info:
            t.negotiate(
                pb.NegotiateRequest(source_id=source, clients=["policy"]), timeout=scaled(10)
            )
    finally:
        t.close()
    if which in ("unknown_site", "impersonation"):
        assert isinstance(info.value, PermissionDeniedError)
    assert mtls_sink.store.queues.list_queues() == []


def test_plaintext_needs_to_be_explicit() -> None:
    from lr_client.errors import ConfigError
    from lr_server.config import parse_config

    raw = {"site": {"id": "a", "database_url": "sqlite://"}, "security": {"client_auth": "token"}}
    with pytest.raises(ConfigError, match=r"security\.ca_file"):
        parse_config(raw)
