"""Batches compressed on the wire (protocol 6): the codecs, packing, the bound.

A source whose destination sets ``compression`` offers that codec in
``NegotiateRequest.codecs``; the sink answers the ones it can decode in
``NegotiateResponse.codecs`` (a sink older than version 6 answers none). The
source then compresses a log or snapshot batch's entries into one blob
(``ReplicationBatch.codec`` and ``compressed``: the entries serialized as a
``ReplicationBatch`` holding them alone), so entries that look alike compress
together; the batch's header stays readable. A batch smaller than
:data:`MIN_BYTES`, or one the codec does not shrink, goes as it is: a sink
takes both kinds on one stream.

The sink expands a compressed batch before it checks it, up to its
``max_message_bytes`` (a hostile peer's zip bomb): past it, or malformed, it
refuses the batch with :class:`~lr_client.errors.DecompressionError`
(``INVALID_ARGUMENT``). ``zlib`` is the standard library's; ``zstd`` needs the
``zstandard`` package (the ``zstd`` extra), imported only when used.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import ConfigError, DecompressionError

#: The codecs this release knows, in the order a sink lists them.
CODECS = ("zstd", "zlib")
#: The setting that turns compression off.
NONE = "none"
#: Serialized entries below this many bytes are sent uncompressed (not worth it).
MIN_BYTES = 512
#: zlib's level: its default's ratio at a lower cost.
ZLIB_LEVEL = 6
#: zstd's level (3, its default): nearly zlib 6's ratio for a fifth of its CPU.
ZSTD_LEVEL = 3


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as exc:
        raise ConfigError(
            "compression = 'zstd' needs the zstandard package: pip install 'lr[zstd]'"
        ) from exc
    return zstandard


def has_zstd() -> bool:
    """Whether the ``zstandard`` package can be imported here."""
    try:
        _zstd()
    except ConfigError:
        return False
    return True


def available() -> list[str]:
    """The codecs this process can encode and decode."""
    return [c for c in CODECS if c != "zstd" or has_zstd()]


def check_codec(codec: str) -> None:
    """:class:`ConfigError` unless ``codec`` is ``none`` or a codec this process has."""
    if codec == NONE or codec == "zlib":
        return
    if codec != "zstd":
        raise ConfigError(f"unknown compression {codec!r}: expected one of none, zlib, zstd")
    _zstd()


def compress(codec: str, data: bytes) -> bytes:
    if codec == "zlib":
        return zlib.compress(data, ZLIB_LEVEL)
    return bytes(_zstd().ZstdCompressor(level=ZSTD_LEVEL).compress(data))


def decompress(codec: str, data: bytes, limit: int) -> bytes:
    """``data`` expanded, or :class:`DecompressionError` if it is malformed, truncated or
    expands past ``limit`` bytes (never more than ``limit + 1`` bytes are produced)."""
    if codec == "zlib":
        d = zlib.decompressobj()
        try:
            out = d.decompress(data, limit + 1)
        except zlib.error as exc:
            raise DecompressionError(f"a malformed {codec} batch: {exc}") from exc
        if len(out) > limit or d.unconsumed_tail:
            raise DecompressionError(f"a {codec} batch expands past {limit} bytes")
        if not d.eof:
            raise DecompressionError(f"a truncated {codec} batch")
        return out
    if codec == "zstd" and has_zstd():
        return _unzstd(data, limit)
    raise DecompressionError(f"a batch compressed with {codec!r}, which this sink does not accept")


def _unzstd(data: bytes, limit: int) -> bytes:
    zstd = _zstd()
    try:
        declared = zstd.frame_content_size(data)  # -1: not in the frame's header
        out = zstd.ZstdDecompressor().stream_reader(io.BytesIO(data)).read(limit + 1)
    except zstd.ZstdError as exc:
        raise DecompressionError(f"a malformed zstd batch: {exc}") from exc
    if len(out) > limit:
        raise DecompressionError(f"a zstd batch expands past {limit} bytes")
    if declared >= 0 and len(out) != declared:
        raise DecompressionError("a truncated zstd batch")
    return bytes(out)


def accepted(offered: Iterable[str]) -> list[str]:
    """What a sink answers: the codecs offered that it can decode."""
    have = available()
    return [c for c in offered if c in have]


def pack(batch: pb.ReplicationBatch, codec: str) -> pb.ReplicationBatch:
    """``batch`` with its entries compressed with ``codec`` (a copy), or ``batch`` itself
    when they are too few bytes or do not shrink."""
    if not batch.entries:
        return batch
    raw = pb.ReplicationBatch(entries=batch.entries).SerializeToString()
    if len(raw) < MIN_BYTES:
        return batch
    blob = compress(codec, raw)
    if len(blob) >= len(raw):
        return batch
    out = pb.ReplicationBatch()
    out.CopyFrom(batch)
    out.ClearField("entries")
    out.codec, out.compressed = codec, blob
    return out


def unpack(batch: pb.ReplicationBatch, limit: int) -> pb.ReplicationBatch:
    """``batch`` with its compressed entries expanded in place (``limit``: the most bytes
    they may expand to); a batch that is not compressed is returned as it is."""
    if not batch.codec:
        if batch.compressed:
            raise DecompressionError("compressed entries without a codec")
        return batch
    if batch.entries:
        raise DecompressionError("a compressed batch also holds plain entries")
    raw = decompress(batch.codec, batch.compressed, limit)
    try:
        inner = pb.ReplicationBatch.FromString(raw)
    except DecodeError as exc:
        raise DecompressionError(f"a {batch.codec} batch holds no valid entries") from exc
    batch.entries.extend(inner.entries)
    batch.ClearField("codec")
    batch.ClearField("compressed")
    return batch


__all__ = [
    "CODECS",
    "MIN_BYTES",
    "NONE",
    "accepted",
    "available",
    "check_codec",
    "compress",
    "decompress",
    "has_zstd",
    "pack",
    "unpack",
]
