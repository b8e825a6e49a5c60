"""Partitioners: stable across processes, range boundaries, loaded from configuration."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from lr_client import ConfigError, HashPartitioner, RangePartitioner
from lr_client.partitioners import load_partitioner, partition_of


def test_hash_is_blake2b_64_modulo_the_count() -> None:
    hashing = HashPartitioner()
    digest = hashlib.blake2b(b"order-17", digest_size=8).digest()
    assert hashing(b"order-17", 8) == int.from_bytes(digest, "big") % 8
    # Pinned: a change of the hash would reorder the keys of running sinks.
    assert (hashing(b"order-17", 8), hashing(b"order-17", 1000)) == (0, 336)
    assert {hashing(b"k%d" % i, 4) for i in range(100)} == {0, 1, 2, 3}


def test_hash_is_the_same_in_another_process() -> None:
    code = "from lr_client import HashPartitioner; print(HashPartitioner()(b'order-17', 1000))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == HashPartitioner()(b"order-17", 1000)


def test_range_splits_at_its_boundaries() -> None:
    ranges = RangePartitioner(["g", b"p"])
    assert ranges.partitions == 3
    assert [ranges(k, 3) for k in (b"a", b"g", b"o", b"p", b"z")] == [0, 1, 1, 2, 2]
    with pytest.raises(ConfigError, match="3 partitions"):
        ranges(b"a", 4)
    with pytest.raises(ConfigError, match="increasing"):
        RangePartitioner(["p", "g"])
    with pytest.raises(ConfigError, match="at least one"):
        RangePartitioner([])


def first_byte(key: bytes, count: int) -> int:
    return key[0] % count


def test_load_partitioner_from_configuration() -> None:
    assert isinstance(load_partitioner("hash"), HashPartitioner)
    assert isinstance(load_partitioner("range", ["m"]), RangePartitioner)
    loaded = load_partitioner("tests.unit.test_partitioners:first_byte")
    assert loaded(b"\x05", 4) == 1
    assert load_partitioner(first_byte) is first_byte
    for bad in ("nope", "tests.unit.test_partitioners:missing", "no_such_module:f", ":f"):
        with pytest.raises(ConfigError):
            load_partitioner(bad)
    with pytest.raises(ConfigError):
        load_partitioner(42)  # type: ignore[arg-type]


def test_a_partition_out_of_range_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="gave 9"):
        partition_of(lambda key, count: 9, b"k", 4)
    assert partition_of(first_byte, b"\x07", 4) == 3
