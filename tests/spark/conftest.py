"""One SparkSession for every Spark test: ``local[2,3]`` (2 cores, a task may run 3 times).

``local[N,F]`` is how local mode allows task retries (``spark.task.maxFailures``
is ignored there); the retry tests need it. The session skips cleanly when
pyspark or Java is missing, except with ``CI=true``, where that fails the run
(:func:`tests.kit.guards.need`).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.guards import need

ROOT = Path(__file__).resolve().parents[2]
POSTGRESQL_JAR = Path("/usr/share/java/postgresql.jar")


def _missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"pyspark is not installed ({exc})"
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        return "Java is not installed (no java on PATH, no JAVA_HOME)"
    return None


def require_spark() -> None:
    """Skip (or, on CI, fail) unless pyspark and Java are available."""
    reason = _missing()
    need(reason is None, reason or "")


#: JVM starts tried before the session fixture fails.
START_ATTEMPTS = 3


def _start(builder: Any) -> Any:
    """``getOrCreate``, again if the JVM gateway process dies while it starts.

    The JVM is a separate process; on a machine short of CPU or memory its start
    can fail (``JAVA_GATEWAY_EXITED``). Each failed start is reported on stderr,
    with the JVM's own output above it, and the last failure is raised.
    """
    from pyspark.errors import PySparkRuntimeError

    for attempt in range(1, START_ATTEMPTS + 1):
        # A failed start leaves PySpark's pipe to the dead gateway open; it is
        # closed here, by the collector, without turning its ResourceWarning
        # (PySpark's, not the suite's) into an error of the next test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                return builder.getOrCreate()
            except PySparkRuntimeError as exc:
                if exc.getCondition() != "JAVA_GATEWAY_EXITED" or attempt == START_ATTEMPTS:
                    raise
                print(f"spark: start {attempt} of {START_ATTEMPTS} failed: {exc}", file=sys.stderr)
            gc.collect()
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared SparkSession."""
    require_spark()
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP", "PYTHONPATH")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers import test helpers (encoders) from the repository.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    builder = (
        SparkSession.builder.master("local[2,3]")
        .appName("lr-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if POSTGRESQL_JAR.exists():  # the JDBC source test needs it (need() there)
        builder = builder.config("spark.jars", str(POSTGRESQL_JAR))
    session = _start(builder)
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
