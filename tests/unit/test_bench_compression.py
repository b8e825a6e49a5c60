"""``bench/compression.py`` runs, prints its tables and writes the JSON docs/benchmarks.md
describes (one round: the figures themselves are the benchmark's, not this test's)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.compression import main


def test_the_compression_benchmark_writes_bytes_and_cpu_per_entry(tmp_path: Path) -> None:
    out = tmp_path / "compression.json"
    result = main(["--rounds", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert [s["shape"] for s in result["shapes"]] == ["json-1k", "json-64k"]
    for shape in result["shapes"]:
        by_codec = {c["codec"]: c for c in shape["codecs"]}
        assert list(by_codec) == ["none", "zlib", "zstd"]
        assert by_codec["none"]["ratio"] == 1.0
        assert by_codec["zlib"]["ratio"] > 3 and by_codec["zstd"]["ratio"] > 3
        assert all(c["pack_us_per_entry"] >= 0 for c in shape["codecs"])
        enc = shape["encryption"]
        assert enc["envelope_overhead_bytes"] == 33 + 61 + len("k1")
        assert enc["zstd_wire_bytes_per_entry_sealed"] > shape["payload_bytes"]  # no gain
        assert enc["seal_us_per_entry"] > 0 and enc["open_us_per_entry"] > 0
