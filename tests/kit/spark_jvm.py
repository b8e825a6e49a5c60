"""Every Spark application the suite starts through PySpark starts quicker.

PySpark starts its JVM with ``spark-submit`` plus ``$PYSPARK_SUBMIT_ARGS``:
the shared session of ``tests/spark``, the jobs ``lr server``, ``lr demo`` and
the launcher start (their processes inherit the variable), the cluster tests'
driver. These tests start Spark applications that live seconds and read a few
hundred rows: no web UI and no console progress bar to start, and the JVM
compiles with its quick compiler only (``-XX:TieredStopAtLevel=1``), which
spends far less CPU on such short runs: the demo's Spark job (a session, the
catalog's 300 rows through ``mapInArrow``) took 9.9-10.4 s of the JVM's CPU
instead of 18.1-18.9 s, back to back on the loaded 2-core machine.

Most of what is left of a short application's start is loading Spark's classes.
``python -m tests.kit.spark_jvm`` (run by ``scripts/test`` before pytest) runs a
small application once and keeps the classes it loaded in a class-data sharing
archive in the environment (``-XX:ArchiveClassesAtExit``); every JVM started
afterwards maps it (``-XX:SharedArchiveFile``): the driver of spark-submit's
cluster test took 5.3 s of CPU instead of 9.2 s, its executor 2.9 s instead of
4.6 s. A JVM that cannot use the archive (another Java, another classpath, no
archive yet) loads its classes as before, silently.
A value already in the environment is left as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

#: Where the archive lives: in the environment, beside the pyspark it was made from.
ARCHIVE_DIR = Path(sys.prefix) / "spark-classes"
#: A JVM that finds no usable archive says nothing of it.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path | None:
    """The archive for the installed pyspark, or None without pyspark."""
    try:
        from importlib.metadata import version

        return ARCHIVE_DIR / f"pyspark-{version('pyspark')}.jsa"
    except Exception:  # pyspark not installed: nothing to share
        return None


def java_options() -> str:
    """The JVM options of every driver and executor the suite starts."""
    archive = archive_path()
    sharing = f" -XX:SharedArchiveFile={archive} {_QUIET}" if archive and archive.exists() else ""
    return "-XX:TieredStopAtLevel=1" + sharing


def submit_args(options: str | None = None) -> str:
    """What pyspark passes to spark-submit (``pyspark-shell`` last, as its default): no UI,
    and the JVM ``options`` (default: :func:`java_options`) for the driver and executors."""
    options = java_options() if options is None else options
    return (
        "--conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=false "
        f"--conf 'spark.executor.extraJavaOptions={options}' "
        f"--driver-java-options '{options}' pyspark-shell"
    )


def quick_spark_jvm() -> None:
    """Set ``PYSPARK_SUBMIT_ARGS`` for this process and its children, unless set."""
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", submit_args())


#: The application whose classes are archived: a session, a CSV read, rows through
#: ``mapInArrow`` (as the snapshot job sends them) and a collect.
_WORKLOAD = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    frame = spark.read.option("header", True).option("inferSchema", True).csv(sys.argv[1])
    def ids(batches):
        yield from batches
    rows = frame.mapInArrow(ids, frame.schema).groupBy("name").count().collect()
    assert len(rows) == 100, rows
    spark.stop()
    """
)


def build_archive() -> Path | None:
    """Make the archive unless it exists (a minute at most); None without pyspark."""
    archive = archive_path()
    if archive is None or archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")  # same file system
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.csv"
        data.write_text("id,name\n" + "".join(f"{i},n{i % 100}\n" for i in range(1000)))
        options = f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} {_QUIET}"
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "PYSPARK_SUBMIT_ARGS": submit_args(options),
        }
        subprocess.run(
            [sys.executable, "-c", _WORKLOAD, str(data)],
            env=env,
            check=True,
            timeout=300,
            capture_output=True,
        )
        if not partial.exists():
            raise RuntimeError(f"the JVM wrote no class archive at {partial}")
        os.replace(partial, archive)  # whole or not at all: tests may start JVMs meanwhile
    return archive


if __name__ == "__main__":
    made = build_archive()
    print(f"spark class archive: {made or 'none (no pyspark)'}")
