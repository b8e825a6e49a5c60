"""The source server's memory stays within its byte limits (invariant I9).

A real ``lr server`` process ships a backlog of large payloads, committed at
once, to two sinks. Its peak resident size (``VmHWM``) may exceed the peak it
had already reached while idle and connected (the baseline, measured in the
same process) only by the bound that ``docs/operations.md`` derives from the
byte settings, whatever the payload sizes and the backlog's length; so may
each sink's, by the bound derived from the sender's settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.subscriber import DEFAULT_BATCH_MAX_BYTES
from lr_server.config import ReplicationConfig
from tests.kit.procs import LrServer, stop_all
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config
from tests.kit.wait import scaled
from tests.reliability.subscriber_proc import app_metadata

MIB = 1024 * 1024
ENTRIES, PAYLOAD = 40, 4 * MIB
LIMITS = ReplicationConfig(
    batch_max_bytes=8 * MIB, window_bytes=16 * MIB, shared_reader_bytes=16 * MIB
)
SINKS = ("b", "c")


def source_memory_bound(cfg: ReplicationConfig, destinations: int, largest: int) -> int:
    """The bound of docs/operations.md: bytes above the idle server's peak."""
    batch = max(cfg.batch_max_bytes, largest)
    shared = cfg.shared_reader and destinations > 1
    reader = cfg.shared_reader_bytes * 3 // 2 if shared else 2 * batch
    return reader + destinations * (cfg.window_bytes + 3 * batch)


def sink_memory_bound(sender: ReplicationConfig, sources: int, largest: int) -> int:
    """The sink's bound of docs/operations.md (no subscriber running): bytes above its idle peak."""
    batch = max(sender.batch_max_bytes, largest)
    return sources * (sender.window_bytes + 6 * batch)


def peak_rss(pid: int) -> int:
    """The process's peak resident set size, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def _digests(store: SQLAlchemyQueueStore) -> list[tuple[int, str]]:
    """(source position, payload digest) of every queued entry from ``a``, in queue order."""
    out: list[tuple[int, str]] = []
    for q in store.queues.list_queues("policy"):
        assert q.source_id == "a"
        with store.read() as conn:
            for e in store.queues.read_queue(conn, q.queue_id, 100_000):
                out.append((e.source_position, hashlib.sha256(e.payload).hexdigest()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("shared_reader", [True, False], ids=["shared-reader", "own-reads"])
def test_a_backlog_of_large_payloads_stays_within_the_byte_limits(
    tmp_path: Path, db_url_factory: Callable[[str], str], shared_reader: bool
) -> None:
    ports = {s: free_port() for s in SINKS}
    urls = {s: db_url_factory(s) for s in ("a", *SINKS)}
    limits = replace(LIMITS, shared_reader=shared_reader)
    settings = (
        f"batch_max_bytes = {limits.batch_max_bytes}\n"
        f"window_bytes = {limits.window_bytes}\n"
        f"shared_reader_bytes = {limits.shared_reader_bytes}\n"
        f"shared_reader = {str(limits.shared_reader).lower()}"
    )
    cfg_a = write_config(
        tmp_path,
        SiteSpec("a", urls["a"], destinations=[(s, ports[s]) for s in SINKS], replication=settings),
    )
    sinks = [
        LrServer(write_config(tmp_path, SiteSpec(s, urls[s], port=ports[s], sources=["a"])))
        for s in SINKS
    ]
    source = LrServer(cfg_a)
    stores: list[SQLAlchemyQueueStore] = []
    servers = [*sinks]
    try:
        for server, s in zip(sinks, SINKS, strict=True):
            server.start().wait_listening(ports[s])
        src = open_store(urls["a"])
        stores.append(src)
        src.create_schema()
        client = RoutingQueueClient(src, source_id="a", client_name="policy")
        client.register_destinations(list(SINKS))
        sink_stores = {s: open_store(urls[s]) for s in SINKS}
        stores += sink_stores.values()
        servers.append(source.start())
        assert source.proc is not None
        # Warm up: both sessions connected and one small entry shipped to both.
        with Session(src.engine) as session, session.begin():
            client.transmit_log_entry_message(session, b"warm-up", list(SINKS))
        wait_for(
            lambda: all(
                st.recv.sink_progress("a", "policy").last_position == 1
                for st in sink_stores.values()
            ),
            timeout=60,
        )
        baseline = peak_rss(source.proc.pid)
        sink_baselines = [peak_rss(s.proc.pid) for s in sinks if s.proc is not None]

        expected = [(1, hashlib.sha256(b"warm-up").hexdigest())]
        with Session(src.engine) as session, session.begin():
            for i in range(ENTRIES):
                payload = i.to_bytes(4, "big") + os.urandom(PAYLOAD - 4)
                client.transmit_log_entry_message(session, payload, list(SINKS))
                expected.append((i + 2, hashlib.sha256(payload).hexdigest()))
                del payload
        last = expected[-1][0]
        wait_for(
            lambda: all(
                st.recv.sink_progress("a", "policy").last_position == last
                for st in sink_stores.values()
            ),
            timeout=180,
        )
        peak = peak_rss(source.proc.pid)
        sink_growth = [
            peak_rss(s.proc.pid) - base
            for s, base in zip(sinks, sink_baselines, strict=True)
            if s.proc is not None
        ]
        for s, st in sink_stores.items():
            assert _digests(st) == expected, s
    finally:
        codes = stop_all(servers)  # SIGTERM to all at once; each must exit cleanly
        for st in stores:
            st.engine.dispose()
    assert codes == [0] * len(servers), [s.log() for s in servers]
    bound = source_memory_bound(limits, len(SINKS), PAYLOAD)
    print(
        f"baseline {baseline / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB, "
        f"growth {(peak - baseline) / MIB:.0f} MiB, bound {bound / MIB:.0f} MiB"
    )
    assert peak - baseline <= bound, (baseline, peak, bound)
    sink_bound = sink_memory_bound(limits, 1, PAYLOAD)
    print(f"sinks' growth {[g // MIB for g in sink_growth]} MiB, bound {sink_bound // MIB} MiB")
    assert len(sink_growth) == len(SINKS) and max(sink_growth) <= sink_bound, sink_growth


SNAPSHOT_ROWS, ROW_BYTES = 80_000, 1024
SUBSCRIBER = Path(__file__).with_name("subscriber_proc.py")


def subscriber_memory_bound(batch_max_bytes: int) -> int:
    """operations.md: a delivery's payloads about three times over (the driver's copy,
    PostgreSQL's hex text of ``bytea`` counted twice, the entries, the messages), plus
    16 MiB for the listener's own rows and the allocator's slack."""
    return 4 * batch_max_bytes + 16 * MIB


@pytest.mark.slow
def test_a_large_snapshot_is_delivered_in_bounded_memory(
    db_url_factory: Callable[[str], str],
) -> None:
    """A subscriber process delivers an 80 MiB snapshot of 1 KiB rows with the default
    batch sizes (4,000 entries, 4 MiB per delivery): its peak resident size grows above
    its idle peak by the bound of a few deliveries, not by the snapshot's size."""
    url = db_url_factory("sink")
    sink = open_store(url)
    try:
        sink.create_schema()
        app_metadata.create_all(sink.engine)
        sid, chunk = "bigsnap", 4000
        for first in range(1, SNAPSHOT_ROWS + 1, chunk):
            last = min(SNAPSHOT_ROWS, first + chunk - 1)
            entries = [
                WireEntry(i, ReplicationType.SNAPSHOT_SYNC, os.urandom(ROW_BYTES), snapshot_id=sid)
                for i in range(first, last + 1)
            ]
            sink.recv.apply_snapshot_batch("a", "policy", sid, entries, first - 1)
        end = WireEntry(
            SNAPSHOT_ROWS + 1,
            ReplicationType.LAST_FULL_SYNC_ENTRY,
            b"",
            snapshot_id=sid,
            snapshot_count=SNAPSHOT_ROWS,
        )
        sink.recv.apply_snapshot_batch("a", "policy", sid, [end], SNAPSHOT_ROWS)
    finally:
        sink.close()
    proc = subprocess.run(
        [
            sys.executable,
            str(SUBSCRIBER),
            f"--url={url}",
            "--owner=memory",
            "--batch-size=500",
            "--snapshot-batch-size=4000",
            "--exit-when-empty",
            f"--timeout={scaled(300)}",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(360),
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["delivered"] == SNAPSHOT_ROWS
    growth = report["peak_rss"] - report["idle_peak_rss"]
    bound = subscriber_memory_bound(DEFAULT_BATCH_MAX_BYTES)
    print(
        f"\nsubscriber: {SNAPSHOT_ROWS * ROW_BYTES / MIB:.0f} MiB snapshot delivered, "
        f"idle peak {report['idle_peak_rss'] / MIB:.0f} MiB, "
        f"growth {growth / MIB:.1f} MiB (bound {bound / MIB:.0f} MiB)"
    )
    assert growth <= bound
