"""SQLite: a sink's database killed in the middle of a WAL checkpoint, recovered from its WAL.

The sink ``b`` runs on SQLite in WAL mode under steady traffic. A checkpointer
process (:data:`CHECKPOINTER`) checkpoints ``b``'s database in a loop, saying
``begin`` before and ``done`` after each ``PRAGMA wal_checkpoint``. At a
``begin`` the test SIGKILLs it together with ``b``'s ``lr server`` and its sink
application: every connection to the database dies at once, the database file
possibly half copied from the WAL. The ``-wal`` file must still be there (the
last connection never closed, so nothing removed it) and, once the processes
restart, SQLite's recovery from it must lose nothing: the verifier finds every
entry applied once, in order.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kit.procs import ROOT, lr_env
from tests.kit.traffic import SourceApp
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import Deployment, reliability_seed, trial_count

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]

WAL_PAGES = 4  # at least this many pages in the WAL when the checkpoint starts
CHECKPOINTER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.execute("PRAGMA busy_timeout = 30000")
while True:
    print("begin", flush=True)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    print("done", flush=True)
"""


def checkpointer(db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHECKPOINTER, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        env=lr_env(),
        cwd=ROOT,
    )


def test_sqlite_sink_killed_mid_checkpoint_recovers_everything_from_its_wal(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    seed = reliability_seed()
    dep = Deployment(tmp_path, db_url_factory, ("b",))
    db = Path(dep.raw_urls["b"].removeprefix("sqlite:///"))
    wal = db.with_name(db.name + "-wal")
    source = SourceApp(
        dep.raw_urls["a"], "a", ["b"], seed=seed, rate=80, pad=500, all_destinations=True
    )
    kills: list[tuple[bool, int]] = []  # (killed before its "done", WAL bytes then)
    try:
        dep.start()
        source.start()
        for _ in range(trial_count(3)):
            floor = dep.verify(source).applied + 30
            wait_for(lambda f=floor: dep.verify(source).applied >= f, scaled(60), 0.1)
            proc = checkpointer(db)
            assert proc.stdout is not None
            while True:  # a checkpoint that starts while the WAL holds a few pages
                line = proc.stdout.readline()
                assert line, "the checkpointer exited"
                if line.strip() == "begin" and wal.stat().st_size > WAL_PAGES * 4096:
                    break
            size = wal.stat().st_size
            proc.kill()  # the checkpoint, the writer and the subscriber die at once
            dep.kill("sink", "b")
            dep.kill("subscriber", "b")
            rest = proc.communicate(timeout=scaled(10))[0]
            kills.append(("done" not in rest, size))
            assert wal.exists() and wal.stat().st_size > 4096, "the WAL was not kept"
            time.sleep(0.2)  # the source retries meanwhile; the sink comes back
            dep.restart("sink", "b")
            dep.restart("subscriber", "b")
        source.stop()
        report = dep.wait_drained(source)
        mid = sum(1 for killed_mid, _ in kills if killed_mid)
        print(f"seed {seed}: kills (mid-checkpoint, WAL bytes) {kills}: {report.counts()}")
        report.assert_clean()
        assert report.applied == report.expected == source.committed
        assert mid >= 1, f"no kill landed inside a checkpoint: {kills}"
    finally:
        source.close()
        dep.close()
