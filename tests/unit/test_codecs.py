"""Batches compressed on the wire: packing, the bound on expansion, the codec checks."""

from __future__ import annotations

import zlib

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import ConfigError, DecompressionError
from lr_server.protocol import codecs
from lr_server.transport.base import BatchStream, Transport
from lr_server.transport.compression import CompressingTransport, Negotiated


def _batch(n: int = 50, size: int = 200) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=7,
        client_name="policy",
        kind=pb.BATCH_LOG_ENTRY,
        first_position=1,
        last_position=n,
        entries=[
            pb.RoutingTableEntryMsg(
                type=pb.LOG_ENTRY_SYNC,
                opaque_payload=b'{"id": %d, "name": "policy holder"}' % i + b"x" * size,
                position=i,
            )
            for i in range(1, n + 1)
        ],
    )


@pytest.mark.parametrize("codec", ["zlib", "zstd"])
def test_a_packed_batch_unpacks_to_the_same_batch(codec: str) -> None:
    batch = _batch()
    packed = codecs.pack(batch, codec)
    assert packed.codec == codec and not packed.entries
    assert len(packed.SerializeToString()) < len(batch.SerializeToString()) / 5
    assert len(batch.entries) == 50  # the caller's batch is left as it was
    wire = pb.ReplicationBatch.FromString(packed.SerializeToString())
    assert codecs.unpack(wire, 1 << 20) == batch


def test_a_small_or_incompressible_batch_goes_as_it_is() -> None:
    small = _batch(1, 10)
    assert codecs.pack(small, "zlib") is small
    noise = pb.ReplicationBatch(
        entries=[pb.RoutingTableEntryMsg(opaque_payload=bytes(range(256)) * 8, position=1)]
    )
    noise.entries[0].opaque_payload = __import__("os").urandom(4096)
    assert codecs.pack(noise, "zstd") is noise
    assert codecs.unpack(small, 10) is small


@pytest.mark.parametrize("codec", ["zlib", "zstd"])
def test_a_zip_bomb_is_refused_at_the_limit(codec: str) -> None:
    bomb = pb.ReplicationBatch(
        batch_id=1, codec=codec, compressed=codecs.compress(codec, b"\0" * (64 << 20))
    )
    assert len(bomb.compressed) < 100_000
    with pytest.raises(DecompressionError, match="expands past 1048576 bytes"):
        codecs.unpack(bomb, 1 << 20)


@pytest.mark.parametrize(
    ("codec", "blob", "why"),
    [
        ("zlib", b"not zlib", "malformed zlib"),
        ("zlib", zlib.compress(b"abc" * 100)[:-6], "truncated zlib"),
        ("zstd", b"not zstd at all", "malformed zstd"),
        ("zstd", codecs.compress("zstd", bytes(range(256)) * 64)[:-40], "truncated zstd"),
        ("zlib", zlib.compress(b"\xff\xff\xff"), "holds no valid entries"),
        ("lzma", b"x", "does not accept"),
    ],
)
def test_a_malformed_batch_is_refused(codec: str, blob: bytes, why: str) -> None:
    with pytest.raises(DecompressionError, match=why):
        codecs.unpack(pb.ReplicationBatch(codec=codec, compressed=blob), 1 << 20)


def test_plain_entries_beside_compressed_ones_are_refused() -> None:
    batch = codecs.pack(_batch(), "zlib")
    batch.entries.add(position=99)
    with pytest.raises(DecompressionError, match="also holds plain entries"):
        codecs.unpack(batch, 1 << 20)
    with pytest.raises(DecompressionError, match="without a codec"):
        codecs.unpack(pb.ReplicationBatch(compressed=b"x"), 1 << 20)


def test_zstd_without_its_package_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    codecs.check_codec("zstd")  # installed here (the dev extra)
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs the zstandard package: pip install 'lr\[zstd\]'"):
        codecs.check_codec("zstd")
    assert codecs.available() == ["zlib"]
    assert codecs.accepted(["zstd", "zlib"]) == ["zlib"]
    codecs.check_codec("zlib")
    codecs.check_codec("none")


class _Sink(Transport):
    def __init__(self, codecs_answered: list[str]) -> None:
        self.answer = codecs_answered
        self.offered: list[str] = []

    def negotiate(self, request: pb.NegotiateRequest, timeout: float) -> pb.NegotiateResponse:
        self.offered = list(request.codecs)
        return pb.NegotiateResponse(codecs=self.answer)

    def open_stream(self) -> BatchStream:
        raise NotImplementedError


@pytest.mark.parametrize(("answer", "chosen"), [(["zstd"], "zstd"), ([], ""), (["zlib"], "")])
def test_the_codec_is_used_only_once_the_sink_accepts_it(answer: list[str], chosen: str) -> None:
    sink, choice = _Sink(answer), Negotiated("zstd")
    request = pb.NegotiateRequest(source_id="a", clients=["policy"])
    CompressingTransport(sink, choice).negotiate(request, 1.0)
    assert sink.offered == ["zstd"] and not request.codecs  # the caller's request unchanged
    assert choice.codec == chosen


def _site(compression: str) -> dict[str, object]:
    return {
        "site": {"id": "a", "database_url": "sqlite:///a.db"},
        "security": {"transport": "plaintext"},
        "clients": [{"name": "policy"}],
        "destinations": [
            {"id": "b", "address": "127.0.0.1:7001", "compression": compression},
        ],
    }


def test_a_destination_s_compression_is_checked_with_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lr_server.config.loading import parse_config

    assert parse_config(_site("zstd")).destinations[0].compression == "zstd"
    assert parse_config(_site("none")).destinations[0].compression == "none"
    with pytest.raises(ConfigError, match=r"destinations\[0\]\.compression: expected one of"):
        parse_config(_site("lz4"))
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)
    with pytest.raises(ConfigError, match=r"destinations\[0\]\.compression: .*lr\[zstd\]"):
        parse_config(_site("zstd"))
    assert parse_config(_site("zlib")).destinations[0].compression == "zlib"
