"""A Spark driver on a cluster that runs snapshot jobs one after another (test_cluster.py).

``python -m tests.spark.cluster_host MASTER CONF_JSON`` builds the job's own
session (``spark_jobs.snapshot_job.build_session``) on ``MASTER``, then reads one
request a line on stdin, ``{"argv": [...], "env": {...}}``: it sets ``env``, waits
until the application has ``EXECUTORS`` live executors again (one killed by a test
is replaced by the cluster) and runs the job's entry point, ``main(argv)``, on that
session; the job's stop leaves it running. It answers each request on stdout with
``{"code": main's exit code}`` (or ``{"error": ...}``); the job's own output goes
to stderr, with Spark's. It exits when stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from spark_jobs import snapshot_job

#: Executors the application must have before each job runs.
EXECUTORS = 2
#: How long a job may wait for them.
EXECUTOR_WAIT = 600.0


class _Session:
    """The host's session as the job's own: the job's ``stop()`` leaves it running."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)

    def stop(self) -> None:
        pass


def live_executors(spark: Any) -> int:
    """Executors registered with the driver (the driver itself not counted)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def wait_executors(spark: Any) -> None:
    deadline = time.monotonic() + EXECUTOR_WAIT
    while live_executors(spark) < EXECUTORS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {EXECUTORS} executors after {EXECUTOR_WAIT:.0f}s")
        time.sleep(0.05)


def main() -> int:
    master, conf = sys.argv[1], json.loads(sys.argv[2])
    # Answers go to the stdout the host was given; everything else (the JVM's output
    # included) to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spark = snapshot_job.build_session(master, conf, "lr-cluster-tests")
    spark.sparkContext.setLogLevel("WARN")
    session = _Session(spark)
    snapshot_job.build_session = lambda *args, **kwargs: session  # type: ignore[assignment]
    wait_executors(spark)
    print(json.dumps({"ready": live_executors(spark)}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            os.environ.update(request["env"])
            waited = time.monotonic()
            wait_executors(spark)
            print(
                f"{time.strftime('%H:%M:%S')} cluster host: {live_executors(spark)} executors, "
                f"waited {time.monotonic() - waited:.1f} s; running {request['argv']}",
                file=sys.stderr,
                flush=True,
            )
            code = snapshot_job.main(request["argv"])
            answer: dict[str, object] = {"code": code}
        except BaseException:  # the test reads the traceback
            answer = {"error": traceback.format_exc()}
        finally:
            spark.sparkContext.setLogLevel("WARN")  # main sets the job's --log-level
            sys.stderr.flush()
        print(json.dumps(answer), file=answers, flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
