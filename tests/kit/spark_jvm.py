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
A value already in the environment is left as it is.
"""

from __future__ import annotations

import os

#: What pyspark passes to spark-submit (``pyspark-shell`` last, as its default).
QUICK_SUBMIT_ARGS = (
    "--conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=false "
    "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
)


def quick_spark_jvm() -> None:
    """Set ``PYSPARK_SUBMIT_ARGS`` for this process and its children, unless set."""
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", QUICK_SUBMIT_ARGS)
