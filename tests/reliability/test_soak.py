"""Soak: steady traffic to three destinations; server memory flat, send queue bounded.

Source ``a`` and sinks ``b``, ``c``, ``d`` run as ``lr server`` processes; the
source application (in this process) writes ``RATE`` entries per second,
each to all three destinations; a subscriber process per sink applies them. Every
second the test samples each server's resident memory (``VmRSS``) and the
source's send-queue size (``lrq_send_log_entries`` rows). After a warm-up
third, the last third must not use more than ``RSS_GROWTH`` more memory than
the middle third, and the queue must stay under ``QUEUE_SECONDS`` of traffic
with no upward trend.
Then the sinks drain and the verifier must find nothing lost or duplicated.

CI runs 15 s per backend; ``LR_SOAK_SECONDS=300`` runs the 5-minute soak.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lr_client.store import open_store
from tests.kit.traffic import SourceApp, send_queue_size
from tests.kit.wait import wait_for
from tests.reliability.harness import (
    Deployment,
    reliability_seed,
    rss_kib,
    soak_seconds,
    with_pg_setting,
)

pytestmark = pytest.mark.slow

RATE = 200  # entries per second, each to three destinations
RSS_GROWTH = 0.30  # last third vs middle third
QUEUE_SECONDS = 10  # the send queue holds at most this many seconds of traffic
ROTATION_SECONDS = 2.0


def thirds(values: list[float]) -> tuple[list[float], list[float], list[float]]:
    n = len(values) // 3
    return values[:n], values[n : 2 * n], values[2 * n :]


def test_soak_memory_flat_and_queue_bounded(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    seconds = soak_seconds()
    seed = reliability_seed()
    sinks = ("b", "c", "d")
    # The CI machine's disk is shared: commits do not wait for the WAL flush (PostgreSQL).
    # PostgreSQL retires the send queue a slot at a time: a slot closes every
    # ROTATION_SECONDS here (30 s by default), so a run of a minute sees many.
    dep = Deployment(
        tmp_path,
        lambda s: with_pg_setting(db_url_factory(s), "synchronous_commit", "off"),
        sinks,
        tune={"retention": {"rotation_period": ROTATION_SECONDS}},
    )
    source = SourceApp(
        dep.raw_urls["a"],
        "a",
        list(sinks),
        seed=seed,
        rate=RATE,
        max_batch=8,
        all_destinations=True,
        rollback_fraction=0.01,
        pad=100,
        state=False,
    )
    src_store = open_store(dep.engine("a"))
    try:
        dep.start()
        rss: dict[str, list[int]] = {name: [] for name in dep.servers}
        queue: list[int] = []
        source.start()
        started = time.monotonic()
        next_sample = started
        while time.monotonic() - started < seconds:
            next_sample += 1.0
            time.sleep(max(0.0, next_sample - time.monotonic()))
            for name, server in dep.servers.items():
                assert server.proc is not None and server.proc.poll() is None, server.log()
                rss[name].append(rss_kib(server.proc.pid))
            queue.append(send_queue_size(src_store))
        elapsed = time.monotonic() - started
        source.stop()
        committed = source.committed

        # The sinks catch up and nothing is lost, duplicated or reordered.
        wait_for(
            lambda: not dep.verify(source).lost and not dep.received_backlog(),
            120,
            0.5,
            what="every entry delivered and the receive queues empty",
            detail=lambda: dep.verify(source).summary(),
        )
        report = dep.verify(source)
        print(
            f"\nsoak {elapsed:.0f}s at {committed / elapsed:.0f} entries/s x 3 destinations "
            f"({committed} entries, {report.applied} applied): {report.counts()}"
        )
        for name, series in rss.items():
            _, middle, last = thirds([float(x) for x in series])
            print(
                f"  {name}: RSS start {series[0] / 1024:.1f} MiB, end {series[-1] / 1024:.1f} MiB,"
                f" middle third {statistics.median(middle) / 1024:.1f} MiB,"
                f" last third {statistics.median(last) / 1024:.1f} MiB"
            )
        _, q_middle, q_last = thirds([float(x) for x in queue])
        print(
            f"  send queue: max {max(queue)}, middle third mean {statistics.mean(q_middle):.0f},"
            f" last third mean {statistics.mean(q_last):.0f} (samples {queue})"
        )
        report.assert_clean()
        assert committed >= RATE * elapsed * 0.25, "the source application fell far behind"
        assert report.applied == report.expected == committed * len(sinks)
        for name, series in rss.items():
            _, middle, last = thirds([float(x) for x in series])
            growth = statistics.median(last) / statistics.median(middle) - 1
            assert growth < RSS_GROWTH, f"{name} RSS grew {growth:.0%}: {series}"
        assert max(queue) <= RATE * QUEUE_SECONDS, queue
        # No upward trend beyond the trim's sawtooth (a rotation period or two of traffic).
        assert statistics.mean(q_last) <= 2 * statistics.mean(q_middle) + 2 * RATE, queue
        assert not source.errors, source.errors[:5]
    finally:
        source.close()
        dep.close()
