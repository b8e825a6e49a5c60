"""The job's command line: ``python -m``, the server's launcher, ``lr snapshot run``, and
``spark-submit``.

The launcher starts a real job process (``test_launch_snapshot_job_runs_a_requested_snapshot``;
``spark-submit`` of the job's file is ``tests/spark/test_cluster.py``'s). The tests of what
the job does with its arguments (the base fixed before the source is read, a branch's
wait, heartbeats, a failing source, ``--destination``, the command ``lr snapshot run``
builds from a site's config) run its entry point, ``main``, in this process, on the
suite's SparkSession: the job's own session is that one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lr_client.records import SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.receiving.receiver import Receiver
from spark_jobs import snapshot_job
from spark_jobs.launch import DATABASE_URL_ENV, launch_snapshot_job, snapshot_job_command
from spark_jobs.snapshot_job import main
from tests.integration.test_cli import as_json, ok, write_config
from tests.kit.relayed import TakesAll, from_root
from tests.kit.wait import join, scaled, wait_for
from tests.spark.conftest import require_spark
from tests.spark.helpers import GATE_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def site(sqlite_url: str) -> Iterator[tuple[str, SQLAlchemyQueueStore]]:
    st = open_store(create_engine(sqlite_url))
    st.create_schema()
    yield sqlite_url, st
    st.engine.dispose()


@pytest.fixture
def people_csv(tmp_path: Path) -> Path:
    path = tmp_path / "people.csv"
    path.write_text("id,name\n1,ann\n2,bob\n3,cy\n4,di\n")
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _result(output: str) -> dict[str, object]:
    lines = [ln for ln in output.splitlines() if ln.startswith("{")]
    assert lines, output[-3000:]
    return dict(json.loads(lines[-1]))


class _JobSession:
    """The suite's SparkSession as the job's own: the job's ``stop()`` is counted, and
    leaves the shared session running."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self.stops = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)

    def stop(self) -> None:
        self.stops += 1


@pytest.fixture
def job_session(
    spark: Any, site: tuple[str, SQLAlchemyQueueStore], monkeypatch: pytest.MonkeyPatch
) -> Iterator[_JobSession]:
    """``main`` runs on the shared session, with the site's URL in the environment
    (where the launcher puts it, and where the helpers' sources read it)."""
    session = _JobSession(spark)
    monkeypatch.setattr(snapshot_job, "build_session", lambda *args, **kwargs: session)
    monkeypatch.setenv(DATABASE_URL_ENV, site[0])
    try:
        yield session
    finally:
        spark.sparkContext.setLogLevel("ERROR")  # main sets the job's --log-level


def _main_in_thread(argv: list[str]) -> tuple[threading.Thread, list[int]]:
    """``main(argv)`` in a thread of its own; its exit code lands in the list."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(argv)), name="snapshot-job")
    thread.start()
    return thread, codes


def test_bad_arguments_exit_2_before_spark_starts(
    site: tuple[str, SQLAlchemyQueueStore], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = site
    assert main(["--database-url", url, "--snapshot-id", "x", "--source", "bogus"]) == 2
    assert main(["--database-url", url, "--destination", "b", "--source", "csv:/x"]) == 2
    args = ["--database-url", url, "--snapshot-id", "x", "--source", "csv:/x"]
    assert main([*args, "--encoder", "json:nope"]) == 2
    assert main([*args, "--conf", "novalue"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "--client" in err and "json:nope" in err


def test_command_line_of_the_launcher() -> None:
    cmd = snapshot_job_command(
        "abc",
        source="csv:/data/p.csv",
        encoder="app.enc:row",
        key_column="region",
        master="spark://m:7077",
        spark_options={"spark.executor.memory": "2g"},
        python="/venv/bin/python",
    )
    assert cmd == [
        "/venv/bin/python",
        "-m",
        "spark_jobs.snapshot_job",
        "--snapshot-id",
        "abc",
        "--source",
        "csv:/data/p.csv",
        "--encoder",
        "app.enc:row",
        "--key-column",
        "region",
        "--master",
        "spark://m:7077",
        "--conf",
        "spark.executor.memory=2g",
        "--start",
    ]
    with pytest.raises(ValueError):
        snapshot_job_command(None, source="csv:/x")


def test_a_job_told_to_start_a_running_snapshot_leaves_it_to_its_writer(
    site: tuple[str, SQLAlchemyQueueStore], people_csv: Path, tmp_path: Path
) -> None:
    """Two servers of a site may both launch a shared snapshot: the second job exits 3."""
    url, store = site
    sid = store.snapshots.request_snapshot(None, "b", "policy", "server")
    assert store.snapshots.start_snapshot(sid) is not None  # another job took it
    again = launch_snapshot_job(
        url, sid, source=f"csv:{people_csv}", master="local[1]", env=_env(), cwd=tmp_path
    )
    out, _ = again.communicate(timeout=scaled(300))
    assert again.returncode == 3
    assert _result(out.decode())["status"] == "stopped"
    assert store.snapshot_entries.count_snapshot_entries(sid) == 0
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.RUNNING


@pytest.mark.spark
@pytest.mark.slow
def test_launch_snapshot_job_runs_a_requested_snapshot(
    site: tuple[str, SQLAlchemyQueueStore], people_csv: Path, tmp_path: Path
) -> None:
    require_spark()
    url, store = site
    sid = store.snapshots.request_snapshot(None, "b", "policy", "server")
    log = tmp_path / "job.log"
    proc = launch_snapshot_job(
        url,
        sid,
        source=f"csv:{people_csv}",
        master="local[2]",
        spark_options={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
        log_path=log,
        env=_env(),
        cwd=tmp_path,
    )
    assert proc.wait(timeout=scaled(300)) == 0, log.read_text()[-3000:]
    assert url not in " ".join(map(str, proc.args))  # the URL travels in the environment
    result = _result(log.read_text())
    assert result["status"] == "ready" and result["entry_count"] == 4
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.READY and req.entry_count == 4
    # Launched again for the same request: it is not REQUESTED any more, exit 3.
    again = launch_snapshot_job(
        url, sid, source=f"csv:{people_csv}", master="local[1]", env=_env(), cwd=tmp_path
    )
    out, _ = again.communicate(timeout=scaled(300))
    assert again.returncode == 3
    assert _result(out.decode())["status"] == "stopped"
    assert store.snapshot_entries.count_snapshot_entries(sid) == 4


@pytest.mark.spark
def test_job_fixes_the_base_position_before_reading_its_source(
    site: tuple[str, SQLAlchemyQueueStore], job_session: _JobSession
) -> None:
    """A change committed after an eager source read its rows follows the snapshot."""
    _, store = site
    store.sites.register_sites(["b"])
    sid = store.snapshots.request_snapshot(None, "b", "policy", "server")
    source = "tests.spark.helpers:rows_then_a_change"
    assert main(["--snapshot-id", sid, "--source", source, "--start"]) == 0
    assert job_session.stops == 1
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.READY and req.entry_count == 2
    after = store.shipping.read_log_entries("b", "policy", after=req.base_position or 0, limit=10)
    assert [e.payload for e in after] == [b"committed-after-the-read"]


@pytest.mark.spark
def test_at_a_branch_the_job_reads_its_source_once_the_branchs_application_has_the_base(
    site: tuple[str, SQLAlchemyQueueStore], job_session: _JobSession
) -> None:
    """An eager source reads the branch's tables when the job loads it: the job waits
    until the branch's application has applied what the branch stored (the base)."""
    _, store = site
    store.cascade.apply_cascade_config("policy", "s1", "branch", "s1", ["b"])
    receiver = Receiver(store, "s3", ["s1"])
    for position in (1, 2, 3):
        receiver.apply("s1", from_root(position))
    sid = store.snapshots.request_snapshot(None, "b", "policy", "server")
    source = "tests.spark.helpers:branch_delivered"
    thread, codes = _main_in_thread(["--snapshot-id", sid, "--source", source, "--start"])
    beats: set[float] = set()

    def waiting() -> bool:
        assert thread.is_alive() and codes == [], f"the job ended: {codes}"
        req = store.snapshots.get_snapshot(sid)
        assert req is not None and req.rows_written == 0
        if req.status is SnapshotStatus.RUNNING:
            assert req.base_position == 3
            beats.add(req.updated_at)
        return len(beats) >= 5

    try:
        wait_for(waiting, 300, 0.02, what="5 heartbeats")
        assert RoutingQueueSubscriber(store, "policy", TakesAll()).poll_once() == 3
    finally:
        join(thread, 300)
    assert codes == [0]
    done = store.snapshots.get_snapshot(sid)
    assert done is not None and done.status is SnapshotStatus.READY
    (entry, _end) = store.snapshot_entries.read_snapshot_entries(sid, 0, 10)
    assert json.loads(entry.payload) == {"delivered": 3}


@pytest.mark.spark
def test_job_whose_source_fails_marks_the_request_failed(
    site: tuple[str, SQLAlchemyQueueStore],
    job_session: _JobSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, store = site
    sid = store.snapshots.request_snapshot(None, "b", "policy", "server")
    source = "tests.spark.helpers:broken_source"
    assert main(["--snapshot-id", sid, "--source", source, "--start"]) == 1
    assert job_session.stops == 1
    assert _result(capsys.readouterr().out)["status"] == "failed"
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.FAILED
    assert "the source is unreachable" in req.reason


@pytest.mark.spark
def test_job_sends_heartbeats_while_its_source_loads(
    site: tuple[str, SQLAlchemyQueueStore],
    job_session: _JobSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, store = site
    sid = store.snapshots.request_snapshot(None, "b", "policy", "server")
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    source = "tests.spark.helpers:gated_rows"
    argv = ["--snapshot-id", sid, "--source", source, "--start", "--heartbeat-interval", "0.2"]
    thread, codes = _main_in_thread(argv)
    beats: set[float] = set()

    def beating() -> bool:
        assert thread.is_alive() and codes == [], f"the job ended: {codes}"
        req = store.snapshots.get_snapshot(sid)
        assert req is not None and req.rows_written == 0  # the source is still loading
        if req.status is SnapshotStatus.RUNNING:
            beats.add(req.updated_at)
        return len(beats) >= 5

    try:
        # The source loads until the gate opens: every beat seen comes before any row.
        wait_for(beating, 300, 0.02, what="5 heartbeats")
    finally:
        gate.touch()
        join(thread, 300)
    assert codes == [0]
    done = store.snapshots.get_snapshot(sid)
    assert done is not None and done.status is SnapshotStatus.READY and done.entry_count == 2


@pytest.mark.spark
def test_a_destination_and_client_record_and_fill_a_new_request(
    site: tuple[str, SQLAlchemyQueueStore],
    job_session: _JobSession,
    people_csv: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--destination`` and ``--client`` (as ``lr snapshot run``): a new request, filled."""
    _, store = site
    argv = ["--destination", "b", "--client", "policy", "--source", f"csv:{people_csv}"]
    assert main(argv) == 0
    result = _result(capsys.readouterr().out)
    assert result["entry_count"] == 4
    (req,) = store.snapshots.list_snapshots(destination="b", client_name="policy")
    assert req.snapshot_id == result["snapshot_id"]
    assert req.status == SnapshotStatus.READY and req.reason == "lr snapshot run"


@pytest.mark.spark
def test_snapshot_run_fills_a_new_request(
    site: tuple[str, SQLAlchemyQueueStore],
    job_session: _JobSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`lr snapshot run` runs the job on the client's spark_source and spark_master.

    The command it runs is ``python -m spark_jobs.snapshot_job`` (a real process of it is
    ``test_launch_snapshot_job_runs_a_requested_snapshot``'s): here that command's
    arguments go to the job's ``main`` in this process, with the environment
    ``lr snapshot run`` gives it, and ``main``'s exit code is the process's.
    """
    import lr_server.cli

    url, _ = site
    (tmp_path / "policy.csv").write_text("key,value\np1,a\np2,b\np3,c\n")
    cfg = write_config(tmp_path, url)
    source = f'"csv:{tmp_path / "policy.csv"}"\nspark_master = "local[1]"'
    cfg.write_text(cfg.read_text().replace('"csv:/data/policy.csv"', source))
    ran: list[list[str]] = []

    def run(cmd: list[str], env: dict[str, str], check: bool) -> subprocess.CompletedProcess[str]:
        assert cmd[:3] == [sys.executable, "-m", "spark_jobs.snapshot_job"], cmd
        assert env[DATABASE_URL_ENV] == url and url not in " ".join(cmd)
        assert env["PYSPARK_PYTHON"]  # local master: the workers' interpreter is set
        assert cmd[cmd.index("--source") + 1] == f"csv:{tmp_path / 'policy.csv'}"
        assert cmd[cmd.index("--master") + 1] == "local[1]"
        ran.append(cmd)
        monkeypatch.setenv(DATABASE_URL_ENV, env[DATABASE_URL_ENV])
        return subprocess.CompletedProcess(cmd, main(cmd[3:]))

    monkeypatch.setattr(lr_server.cli.snapshot, "subprocess", SimpleNamespace(run=run))
    monkeypatch.delenv(DATABASE_URL_ENV)  # only what lr snapshot run gives the job
    ok("init-db", "--config", cfg)
    ok("snapshot", "run", "--config", cfg, "-d", "site-b", "--client", "policy")
    assert len(ran) == 1 and job_session.stops == 1
    (snap,) = as_json("snapshot", "list", "--config", cfg)
    assert (snap["status"], snap["entry_count"], snap["destination"]) == ("ready", 3, "site-b")
    entries = as_json(
        "browse", "--config", cfg, "LRQ_Send_SnapSync", "--tag", "lrq_snapsync_site-b"
    )
    assert [e["type"] for e in entries] == ["SNAPSHOT_SYNC"] * 3 + ["LAST_FULL_SYNC_ENTRY"]
