"""The snapshot job on a real cluster: ``local-cluster[2,1,1024]``, two executor JVMs.

PySpark's ``local-cluster`` master starts a standalone master and two workers
in the driver's JVM; each worker launches its executor as a separate JVM
process, as on a standalone, YARN or Kubernetes cluster. Only one
SparkContext can live in a process and the suite's shared one is ``local``
(which the ``local`` case of the correctness test uses), so cluster jobs run
in processes of their own. ``spark-submit`` starts its own application, as an
operator runs it. The correctness and executor-kill tests share one driver
process per module (:mod:`tests.spark.cluster_host`): an application on the
cluster, started once, that runs each test's job through the job's entry point
(``main``, with the arguments ``lr server`` and ``lr snapshot`` give the job's
command line); a killed executor is replaced by the cluster before the next
job. That the server and the launcher start the job's process is
``test_server_launches_job.py``'s and ``test_snapshot_cli.py``'s.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lr_client.records import ReplicationType, SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from spark_jobs.launch import DATABASE_URL_ENV, snapshot_job_command
from spark_jobs.snapshot_job import run_snapshot_job
from spark_jobs.writer import rows_committed
from tests.kit.guards import need
from tests.kit.procs import tail, track
from tests.kit.spark_jvm import java_options
from tests.kit.wait import scaled, wait_for
from tests.spark.conftest import require_spark
from tests.spark.helpers import GATE_ENV, PARTS_ENV, ROWS_ENV, process_gone

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "local-cluster[2,1,1024]"
#: spark-submit's own application: one executor JVM is enough to show that the
#: executors find the encoder in the shipped zip only (two is the other tests' point).
SUBMIT_CLUSTER = "local-cluster[1,1,1024]"
#: Spark settings of every cluster job: no UI, small executors with the drivers' JVM
#: options (the quick compiler, the shared class archive: tests/kit/spark_jvm.py), and the job
#: waits until both executors have registered, so both take tasks from the start.
CLUSTER_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.executor.memory": "512m",
    "spark.executor.extraJavaOptions": java_options(),
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "600s",
}
ROWS, PARTS, CHUNK = 2000, 8, 50


@pytest.fixture
def sqlite_site(tmp_path: Path) -> Iterator[tuple[str, SQLAlchemyQueueStore]]:
    url = f"sqlite:///{tmp_path / 'cluster-site.db'}"
    st = open_store(create_engine(url))
    st.create_schema()
    yield url, st
    st.engine.dispose()


@pytest.fixture
def pg_site(pg_schema: Any) -> Iterator[tuple[str, SQLAlchemyQueueStore]]:
    """PostgreSQL, a site's usual database (the kill and spark-submit tests run on it only)."""
    st = open_store(pg_schema.engine())
    st.create_schema()
    yield pg_schema.url, st


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **extra)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class ClusterHost:
    """The driver process of :mod:`tests.spark.cluster_host`: an application on ``CLUSTER``
    whose executors (JVM processes of their own) run every job sent to it."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        #: Whether a job was sent and its exit code not read yet.
        self.pending = False
        conf = CLUSTER_CONF
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.cluster_host", CLUSTER, json.dumps(conf)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
                env=_env(),
                cwd=ROOT,
                start_new_session=True,
            )
        track("cluster driver", log, self.proc)
        self._reader = threading.Thread(target=self._read, name="cluster-answers", daemon=True)
        self._reader.start()
        ready = self._answer(300)
        assert ready.get("ready") == 2, ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(json.loads(line))
        self.answers.put({"error": f"the cluster driver exited ({self.proc.wait()})"})

    def _answer(self, timeout: float) -> dict[str, Any]:
        try:
            answer = self.answers.get(timeout=scaled(timeout))
        except queue.Empty:
            raise AssertionError(f"no answer from the cluster driver\n{tail(self.log)}") from None
        assert "error" not in answer, f"{answer['error']}\n{tail(self.log)}"
        return answer

    def submit(self, url: str, sid: str, source: str, method: str = "copy", **env: str) -> None:
        """Run the job for request ``sid`` on the cluster, as ``lr server`` launches it
        (with ``--method`` for another write method); :meth:`wait` for its exit code."""
        encoder = "killable_encoder" if source == "killable_rows" else "jvm_encoder"
        cmd = snapshot_job_command(
            sid,
            source=f"tests.spark.helpers:{source}",
            encoder=f"tests.spark.helpers:{encoder}",
            master=CLUSTER,
            spark_options=CLUSTER_CONF,
            chunk_rows=CHUNK,
            extra_args=[] if method == "copy" else ["--method", method],
        )
        assert cmd[1:3] == ["-m", "spark_jobs.snapshot_job"], cmd
        env = {DATABASE_URL_ENV: url, ROWS_ENV: str(ROWS), PARTS_ENV: str(PARTS), **env}
        request = json.dumps({"argv": cmd[3:], "env": env}) + "\n"
        assert self.proc.stdin is not None and not self.pending
        self.proc.stdin.write(request.encode())
        self.proc.stdin.flush()
        self.pending = True

    def running(self) -> bool:
        """Whether the job sent last has not answered yet (and the driver runs)."""
        return self.pending and self.answers.empty() and self.proc.poll() is None

    def wait(self, timeout: float = 300) -> int:
        """The exit code of the job sent last."""
        answer = self._answer(timeout)
        self.pending = False
        return int(answer["code"])

    def kill(self) -> None:
        """SIGKILL the driver and its executors (a job left running by a failed test)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._close_pipes()

    def close(self) -> None:
        """Close its stdin: the driver stops its application and exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=scaled(60))
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        self._reader.join(scaled(10))  # it has read up to the end of the driver's stdout
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def cluster_drivers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ClusterHost]]:
    """The module's driver processes: one, unless a test had to kill it."""
    drivers: list[ClusterHost] = []
    yield drivers
    for host in drivers:
        host.close()


@pytest.fixture
def cluster(
    cluster_drivers: list[ClusterHost], tmp_path_factory: pytest.TempPathFactory
) -> ClusterHost:
    """The module's application on the cluster, started by the first test that runs a job."""
    require_spark()
    if cluster_drivers and cluster_drivers[-1].pending:  # a failed test left its job running
        cluster_drivers[-1].kill()
    if not cluster_drivers or cluster_drivers[-1].proc.poll() is not None:
        log = tmp_path_factory.mktemp("cluster") / "driver.log"
        cluster_drivers.append(ClusterHost(log))
    return cluster_drivers[-1]


def _entries(store: SQLAlchemyQueueStore, sid: str) -> list[dict[str, Any]]:
    """The rows of a READY snapshot, decoded; checks the end marker counts them."""
    *rows, end = store.snapshot_entries.read_snapshot_entries(sid, 0, 10_000_000)
    assert end.type == ReplicationType.LAST_FULL_SYNC_ENTRY
    assert end.payload == str(len(rows)).encode()
    return [json.loads(e.payload) for e in rows]


def _ready(store: SQLAlchemyQueueStore, sid: str) -> list[dict[str, Any]]:
    req = store.snapshots.get_snapshot(sid)
    assert req is not None and req.status == SnapshotStatus.READY
    assert req.entry_count == ROWS and req.rows_written == ROWS
    rows = _entries(store, sid)
    assert sorted(r["id"] for r in rows) == list(range(ROWS)), "every row exactly once"
    return rows


@pytest.mark.parametrize(
    ("master", "backend"),
    [("local", "sqlite"), ("local", "postgresql"), (CLUSTER, "sqlite")],
    ids=["local-sqlite", "local-postgresql", "cluster-sqlite"],
)
def test_every_row_once_on_either_master(
    request: pytest.FixtureRequest, tmp_path: Path, master: str, backend: str
) -> None:
    """Each master; the cluster on PostgreSQL is the kill test's and spark-submit's
    (a cluster job costs a JVM per executor: the suite runs three)."""
    require_spark()
    url, store = request.getfixturevalue("sqlite_site" if backend == "sqlite" else "pg_site")
    sid = store.snapshots.request_snapshot(None, "b", "policy", "test")
    if master == "local":
        spark = request.getfixturevalue("spark")
        df = spark.range(0, ROWS, numPartitions=PARTS)
        df = df.selectExpr("id", "concat('row-', id) AS name")
        encoder = "tests.spark.helpers:jvm_encoder"
        assert run_snapshot_job(spark, url, sid, df, encoder, start=True, chunk_rows=CHUNK) == ROWS
        assert len({r["jvm"] for r in _ready(store, sid)}) == 1  # the driver's own JVM
        return
    cluster = request.getfixturevalue("cluster")
    cluster.submit(url, sid, "numbered_rows")
    assert cluster.wait() == 0, tail(cluster.log)
    jvms = {r["jvm"] for r in _ready(store, sid)}
    assert len(jvms) == 2, f"rows written by the JVMs {jvms}: expected both executors"


def _site_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(
        f"""[site]
id = "a"
database_url = "{url}"

[security]
transport = "plaintext"

[[clients]]
name = "policy"
snapshot = "spark"
spark_source = "tests.spark.helpers:killable_rows"

[[destinations]]
id = "b"
address = "127.0.0.1:7001"
"""
    )
    return path


def _status_snapshot(config: Path, rows: int) -> dict[str, Any] | None:
    """The snapshot ``lr status --json`` shows for b/policy, once it has ``rows`` written."""
    from click.testing import CliRunner

    from lr_server.cli import cli

    done = CliRunner().invoke(cli, ["status", "--config", str(config), "--json"])
    assert done.exit_code == 0, done.output
    (stream,) = json.loads(done.output)["send"]
    snapshot = stream["snapshot"]
    return snapshot if snapshot and snapshot["rows_written"] >= rows else None


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            tree.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.postgres
def test_an_executor_killed_mid_job_loses_and_duplicates_nothing(
    pg_site: tuple[str, SQLAlchemyQueueStore], cluster: ClusterHost, tmp_path: Path
) -> None:
    """``kill -9`` of the executor JVM running partition 0, after 3 of its chunks
    committed: Spark retries the task on an executor still alive (or a new one),
    which rewrites the part; every row once.

    A chunk is encoded inside its transaction (``COPY``): the kill lands in an
    open ``COPY``, which PostgreSQL rolls back. Meanwhile ``lr status`` shows the
    rows committed: the open chunk's lock of the request lets the driver's
    progress updates through."""
    require_spark()
    method = "copy"
    url, store = pg_site
    sid = store.snapshots.request_snapshot(None, "b", "policy", "test")
    barrier = tmp_path / "partition-0-blocked"
    config = _site_config(tmp_path, url)
    cluster.submit(url, sid, "killable_rows", method, **{GATE_ENV: str(barrier)})
    try:

        def blocked() -> bool:
            assert cluster.running(), tail(cluster.log)
            return barrier.exists()

        wait_for(blocked, 300, 0.05, what="partition 0 blocked", detail=lambda: tail(cluster.log))
        executor = int(barrier.read_text())
        assert executor in _descendants(cluster.proc.pid), "the executor is a process of this job"
        cmdline = Path(f"/proc/{executor}/cmdline").read_bytes()
        assert b"CoarseGrainedExecutorBackend" in cmdline
        assert rows_committed(store, sid, 1) == 3 * CHUNK  # part 0: chunks 1..3 committed
        # The driver records the rows committed; lr status shows them.
        running = wait_for(
            lambda: _status_snapshot(config, rows=3 * CHUNK), 120, 0.2, what="progress shown"
        )
        assert running["status"] == "running" and running["entry_count"] is None
        os.kill(executor, signal.SIGKILL)
        wait_for(lambda: process_gone(executor), 60, what=f"executor {executor} gone")
        assert cluster.wait() == 0, tail(cluster.log)
    finally:
        if cluster.pending:  # the test failed: no job is left running for the next one
            cluster.kill()
    rows = _ready(store, sid)
    ready = _status_snapshot(config, rows=ROWS)
    assert ready and ready["status"] == "ready" and ready["entry_count"] == ROWS
    rewritten = {r["jvm"] for r in rows if r["id"] < ROWS // PARTS}
    assert len(rewritten) == 1 and executor not in rewritten, "part 0 was written again"


def _package(zip_path: Path) -> Path:
    """What an operator ships with ``--py-files``: the package and a site's encoder module."""
    with zipfile.ZipFile(zip_path, "w") as z:
        for pkg in ("lr_client", "spark_jobs"):
            for f in sorted((ROOT / pkg).rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    z.write(f, str(f.relative_to(ROOT)))
        z.writestr("site_encoders.py", "def tagged(row):\n    return b'site:%d' % row.id\n")
    return zip_path


def _spark_submit() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    need(path.exists(), f"no spark-submit at {path}")
    return path


@pytest.mark.postgres
def test_spark_submit_on_a_cluster(
    pg_site: tuple[str, SQLAlchemyQueueStore], tmp_path: Path
) -> None:
    """As an operator runs it: spark-submit, ``--py-files`` with the package and the
    site's encoder (a module found nowhere else), the URL in the environment."""
    require_spark()
    url, store = pg_site
    data = tmp_path / "policies.csv"
    data.write_text("id,name\n" + "".join(f"{i},policy {i}\n" for i in range(300)))
    env = _env(**{DATABASE_URL_ENV: url})
    env.pop("PYTHONPATH")  # the executors find the encoder in the shipped zip only
    conf = [f"{k}={v}" for k, v in CLUSTER_CONF.items()]
    conf += [f"spark.pyspark.python={sys.executable}", "spark.sql.files.maxPartitionBytes=2k"]
    done = subprocess.run(
        [
            str(_spark_submit()),
            "--master",
            SUBMIT_CLUSTER,
            "--deploy-mode",
            "client",
            "--executor-cores",
            "1",
            # The driver's JVM options are those of every driver the suite starts
            # through PySpark (tests/kit/spark_jvm.py).
            "--driver-java-options",
            java_options(),
            "--py-files",
            str(_package(tmp_path / "lr.zip")),
            *(arg for c in conf for arg in ("--conf", c)),
            str(ROOT / "spark_jobs" / "snapshot_job.py"),
            "--destination",
            "b",
            "--client",
            "policy",
            "--source",
            f"csv:{data}",
            "--encoder",
            "site_encoders:tagged",
            "--source-option",
            "inferSchema=true",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(line)
    assert result["status"] == "ready" and result["entry_count"] == 300
    (req,) = store.snapshots.list_snapshots(destination="b", client_name="policy")
    assert req.snapshot_id == result["snapshot_id"] and req.status == SnapshotStatus.READY
    *rows, end = store.snapshot_entries.read_snapshot_entries(req.snapshot_id, 0, 10_000)
    assert end.payload == b"300"
    assert sorted(r.payload for r in rows) == sorted(b"site:%d" % i for i in range(300))
