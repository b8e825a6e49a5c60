"""``lr browse`` reads previews, not payloads: its RSS stays bounded with 40 MiB payloads.

40 MiB payloads are stored in each queue ``lr browse`` reads: five in the send log,
three in the snapshot queue and in a receive queue. ``lr browse QUEUE --json`` runs as
a real process; its peak RSS (``VmHWM``, written by the process at its end) is compared
with the same command listing the queues (no QUEUE: it reads no entry). Reading the
payloads takes it hundreds of MiB above that: 362 MiB against 80 on SQLite when the
store read whole payloads (the send log's five).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_server.ops.browse import PREVIEW_CHARS

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
SIZE = 40 * MIB
COUNT = 5
#: The payloads of each queue: the first COUNT of the send log, fewer elsewhere (time).
COUNTS = {"LRQ_Send_LogEntries": COUNT, "LRQ_Send_SnapSync": 3, "LRQ_Recv_policy__site-x": 3}
#: Above the listing's peak, at most: less than one payload on PostgreSQL. SQLite's
#: ``substr`` loads the value it cuts (one row's at a time, in the library): one payload more.
MARGIN = {"postgresql": 24 * MIB, "sqlite": SIZE + 24 * MIB}


#: Runs ``lr`` with the arguments after ``--``, then writes the process's peak RSS
#: (``VmHWM``: of this program's memory only, unlike ``ru_maxrss``, which counts the
#: forking parent's too) to the file named first.
MEASURE = """
import runpy, sys
out, sys.argv = sys.argv[1], ["lr", *sys.argv[2:]]
try:
    runpy.run_module("lr_server", run_name="__main__")
finally:
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
    open(out, "w").write(status)
"""


def run_measured(tmp: Path, cfg: Path, *args: str) -> tuple[object, int]:
    """``lr browse --config cfg ARGS --json`` as a process: its JSON and its peak RSS."""
    peak = tmp / "peak"
    command = [sys.executable, "-c", MEASURE, str(peak), "browse", "--config", str(cfg), *args]
    done = subprocess.run([*command, "--json"], cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout), int(peak.read_text()) * 1024  # kB


@pytest.fixture
def big_site(tmp_path: Path, db_url: str, store: SQLAlchemyQueueStore) -> Path:
    """A site whose three queues hold 40 MiB payloads (:data:`COUNTS`)."""
    nums = store.sites.register_sites(["site-b"])
    payloads = [bytes([i]) * 16 + os.urandom(SIZE - 16) for i in range(COUNT)]
    for p in payloads:
        with store.write() as conn:
            store.send.append_log_entries(conn, "policy", [(p, [nums["site-b"]])])
    sid = store.snapshots.request_snapshot(None, "site-b", "policy")
    store.snapshots.start_snapshot(sid)
    for i, p in enumerate(payloads[: COUNTS["LRQ_Send_SnapSync"]]):
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(conn, sid, i, [p])
    for i, p in enumerate(payloads[: COUNTS["LRQ_Recv_policy__site-x"]]):
        store.recv.apply_log_batch(
            "site-x", "policy", [WireEntry(i + 1, ReplicationType.LOG_ENTRY_SYNC, p)]
        )
    del payloads
    cfg = tmp_path / "site.toml"
    cfg.write_text(
        f"""
[site]
id = "site-a"
database_url = "{db_url}"
listen = "127.0.0.1:7000"

[security]
transport = "plaintext"
client_auth = "token"
token = "t"

[[destinations]]
id = "site-b"
address = "127.0.0.1:7001"

[[sources]]
id = "site-x"
token = "x"
"""
    )
    return cfg


@pytest.mark.slow
def test_browsing_40_mib_payloads_keeps_the_rss_bounded(big_site: Path, db_url: str) -> None:
    margin = MARGIN["sqlite" if db_url.startswith("sqlite") else "postgresql"]
    queues, baseline = run_measured(big_site.parent, big_site)
    assert {q["queue"]: q["entries"] for q in queues}["LRQ_Send_LogEntries"] == COUNT  # type: ignore[union-attr, index]
    for queue, count in COUNTS.items():
        entries, peak = run_measured(big_site.parent, big_site, queue, "--limit", "50")
        assert [e["size"] for e in entries] == [SIZE] * count, queue  # type: ignore[union-attr, index]
        previews = [e["preview"] for e in entries]  # type: ignore[union-attr, index]
        assert previews == ["0x" + f"{i:02x}" * (PREVIEW_CHARS // 2) + "…" for i in range(count)]
        assert peak < baseline + margin, (queue, peak // MIB, baseline // MIB)
