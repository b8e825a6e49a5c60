"""Compression on the wire and end-to-end encryption: bytes and CPU per entry.

    python bench/compression.py [--rounds 5] [--json bench/results/compression.json]

No database and no network: what a batch costs on the wire and in CPU is the
codec's and the cipher's alone. Two payload shapes: ``json-1k`` (1 KiB JSON-like
documents, 100 per batch, as an application's rows) and ``json-64k`` (64 KiB
documents, 16 per batch). Per shape and codec (``none``, ``zlib``, ``zstd``): the
bytes per entry of the serialized batch (what gRPC carries), the source's CPU
per entry to pack it (``lr_server.protocol.codecs.pack``: serialize the entries and
compress them) and the sink's to unpack it (expand and parse), in microseconds
of process time, median over ``--rounds`` rounds.

Encryption (``lr_client.encryption``, AES-256-GCM): per shape, the CPU per entry
to seal (at transmit, for 1 and for 3 destination keys) and to open (in the
subscriber), the envelope's bytes, and the bytes on the wire with zstd when the
payloads are sealed (ciphertext does not compress).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.common import machine_facts, print_table, write_json  # noqa: E402
from lr_client._proto import replication_pb2 as pb  # noqa: E402
from lr_client.encryption import open_sealed, seal  # noqa: E402
from lr_client.keys import Keyring, generate_key  # noqa: E402
from lr_server.protocol import codecs  # noqa: E402

#: (name, payload bytes, entries per batch)
SHAPES = (("json-1k", 1024, 100), ("json-64k", 64 * 1024, 16))
CODECS = ("none", "zlib", "zstd")
WORDS = [
    "policy",
    "holder",
    "claim",
    "premium",
    "address",
    "street",
    "city",
    "amount",
    "currency",
    "status",
]


def document(rng: random.Random, size: int) -> bytes:
    """A JSON-like document of about ``size`` bytes: keys repeat, values vary."""
    rows = []
    while sum(len(r) for r in rows) < size:
        rows.append(
            json.dumps(
                {
                    "id": rng.randrange(10**9),
                    "kind": rng.choice(WORDS),
                    "name": " ".join(rng.choice(WORDS) for _ in range(3)),
                    "amount": round(rng.uniform(0, 10_000), 2),
                    "active": rng.random() < 0.5,
                }
            )
        )
    return ("[" + ",".join(rows) + "]").encode()[:size]


def batch(payloads: list[bytes]) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=1,
        client_name="bench",
        kind=pb.BATCH_LOG_ENTRY,
        first_position=1,
        last_position=len(payloads),
        entries=[
            pb.RoutingTableEntryMsg(type=pb.LOG_ENTRY_SYNC, opaque_payload=p, position=i + 1)
            for i, p in enumerate(payloads)
        ],
    )


def cpu_us(fn: Callable[[], object], per: int, rounds: int) -> float:
    """Median process-time microseconds per item of ``fn`` (which handles ``per`` items)."""
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) / per * 1e6)
    return statistics.median(times)


def wire_bytes(b: pb.ReplicationBatch, codec: str) -> bytes:
    return (b if codec == "none" else codecs.pack(b, codec)).SerializeToString()


def measure_codecs(payloads: list[bytes], rounds: int) -> list[dict[str, Any]]:
    n, b, out = len(payloads), batch(payloads), []
    for codec in CODECS:
        wire = wire_bytes(b, codec)

        def unpack(wire: bytes = wire) -> None:
            codecs.unpack(pb.ReplicationBatch.FromString(wire), 1 << 30)

        out.append(
            {
                "codec": codec,
                "wire_bytes_per_entry": len(wire) / n,
                "ratio": len(wire_bytes(b, "none")) / len(wire),
                "pack_us_per_entry": cpu_us(lambda c=codec: wire_bytes(b, c), n, rounds),
                "unpack_us_per_entry": cpu_us(unpack, n, rounds),
            }
        )
    return out


def measure_encryption(payloads: list[bytes], rounds: int) -> dict[str, Any]:
    n = len(payloads)
    ring = Keyring({"k1": generate_key(), "k2": generate_key(), "k3": generate_key()})
    three = Keyring(
        {"k1": generate_key(), "k2": generate_key(), "k3": generate_key()},
        destinations={"c": "k2", "d": "k3"},
    )
    sealed = [seal(ring, p, ["b"], "a", "bench") for p in payloads]
    wire_plain = len(wire_bytes(batch(payloads), "zstd"))
    wire_sealed = len(wire_bytes(batch(sealed), "zstd"))
    return {
        "seal_us_per_entry": cpu_us(
            lambda: [seal(ring, p, ["b"], "a", "bench") for p in payloads], n, rounds
        ),
        "seal_3_keys_us_per_entry": cpu_us(
            lambda: [seal(three, p, ["b", "c", "d"], "a", "bench") for p in payloads], n, rounds
        ),
        "open_us_per_entry": cpu_us(
            lambda: [open_sealed(ring, e, "a", "bench") for e in sealed], n, rounds
        ),
        "envelope_overhead_bytes": len(sealed[0]) - len(payloads[0]),
        "zstd_wire_bytes_per_entry_plain": wire_plain / n,
        "zstd_wire_bytes_per_entry_sealed": wire_sealed / n,
    }


def run(rounds: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    shapes = []
    for name, size, per_batch in SHAPES:
        payloads = [document(rng, size) for _ in range(per_batch)]
        shapes.append(
            {
                "shape": name,
                "payload_bytes": size,
                "entries_per_batch": per_batch,
                "codecs": measure_codecs(payloads, rounds),
                "encryption": measure_encryption(payloads, rounds),
            }
        )
    return {
        "benchmark": "compression",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "rounds": rounds,
        "shapes": shapes,
    }


def report(console: Console, result: dict[str, Any]) -> None:
    rows = []
    for s in result["shapes"]:
        for c in s["codecs"]:
            rows.append(
                [
                    s["shape"],
                    c["codec"],
                    f"{c['wire_bytes_per_entry']:,.0f}",
                    f"{c['ratio']:.2f}x",
                    f"{c['pack_us_per_entry']:,.1f}",
                    f"{c['unpack_us_per_entry']:,.1f}",
                ]
            )
    print_table(
        console,
        "Compression: bytes on the wire and CPU per entry",
        ["payload", "codec", "wire B/entry", "smaller", "pack us/entry", "unpack us/entry"],
        rows,
        left=2,
    )
    rows = [
        [
            s["shape"],
            f"{s['encryption']['seal_us_per_entry']:,.1f}",
            f"{s['encryption']['seal_3_keys_us_per_entry']:,.1f}",
            f"{s['encryption']['open_us_per_entry']:,.1f}",
            f"{s['encryption']['envelope_overhead_bytes']}",
            f"{s['encryption']['zstd_wire_bytes_per_entry_plain']:,.0f} -> "
            f"{s['encryption']['zstd_wire_bytes_per_entry_sealed']:,.0f}",
        ]
        for s in result["shapes"]
    ]
    print_table(
        console,
        "Encryption (AES-256-GCM): CPU per entry, envelope bytes",
        ["payload", "seal us", "seal 3 keys us", "open us", "+bytes", "zstd B/entry sealed"],
        rows,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds per measurement (median)")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "compression.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run(max(1, args.rounds))
    report(Console(), result)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
