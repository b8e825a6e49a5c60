"""Encoders and sources the Spark tests name as ``module:function``.

They run in Spark's Python workers, which import this module by name.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pyspark import TaskContext


def id_encoder(row: Any) -> bytes:
    """The row's ``id`` as ASCII digits."""
    return str(row.id).encode()


def flaky_encoder(row: Any) -> bytes:
    """Fails once: on the first attempt of partition 1, at the row ``id == fail_at``.

    Touches ``row.marker`` first so the test knows the failure happened.
    """
    ctx = TaskContext.get()
    assert ctx is not None
    if ctx.partitionId() == 1 and ctx.attemptNumber() == 0 and row.id == row.fail_at:
        Path(row.marker).touch()
        raise RuntimeError("injected failure on the first attempt")
    return id_encoder(row)


def always_failing_encoder(row: Any) -> bytes:
    """Fails every attempt of partition 1 at ``fail_at`` (a job that dies midway)."""
    ctx = TaskContext.get()
    assert ctx is not None
    if ctx.partitionId() == 1 and row.id == row.fail_at:
        raise RuntimeError("partition 1 always fails")
    return id_encoder(row)


#: How long a gated encoder or source waits for its gate before it fails.
GATE_TIMEOUT = 600.0
#: The environment variable naming the gate file of :func:`gated_rows`.
GATE_ENV = "LR_TEST_GATE"


def wait_for_gate(gate: str) -> None:
    """Block until the file ``gate`` exists (the test opens it); fail after a long deadline."""
    deadline = time.monotonic() + GATE_TIMEOUT
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {gate} not opened within {GATE_TIMEOUT:.0f}s")
        time.sleep(0.02)


def gated_encoder(row: Any) -> bytes:
    """Blocks at the row ``id % 1000 == gate_at`` until the file ``row.gate`` exists.

    Every partition stops there, after its first chunks are committed, so the
    job cannot finish before the test has done what it waits to do.
    """
    if row.id % 1000 == row.gate_at:
        wait_for_gate(row.gate)
    return id_encoder(row)


def text_encoder(row: Any) -> Any:
    """Wrong: returns str, not bytes."""
    return str(row.id)


def people(spark: Any) -> Any:
    """A ``module:function`` source."""
    return spark.createDataFrame([(1, "ann"), (2, "bob"), (3, "cy")], "id long, name string")


def rows_then_a_change(spark: Any) -> Any:
    """An eager source that reads its rows, then sees the application commit a change.

    The change (a log entry to ``b``) is committed after the rows were read, so
    it must come after the snapshot's base position, or it would be lost.
    """
    import os

    from lr_client import RoutingQueueClient
    from lr_client.store import create_engine, open_store
    from spark_jobs.launch import DATABASE_URL_ENV

    df = spark.createDataFrame([(1, "ann"), (2, "bob")], "id long, name string")
    store = open_store(create_engine(os.environ[DATABASE_URL_ENV]))
    try:
        client = RoutingQueueClient(store, source_id="a", client_name="policy")
        with store.engine.begin() as conn:
            client.transmit_log_entry_message(conn, b"committed-after-the-read", ["b"])
    finally:
        store.engine.dispose()
    return df


def broken_source(spark: Any) -> Any:
    """A ``module:function`` source that fails before any row is read."""
    raise RuntimeError("the source is unreachable")


def gated_rows(spark: Any) -> Any:
    """A source whose loading lasts until the file named by ``LR_TEST_GATE`` exists.

    A long query, as long as the test needs to watch the job while it loads.
    """
    import os

    wait_for_gate(os.environ[GATE_ENV])
    return spark.createDataFrame([(1, "ann"), (2, "bob")], "id long, name string")


# -- the cluster tests: which JVM a row was written from ------------------------------------

#: Environment variables of :func:`numbered_rows`: how many rows, in how many partitions.
ROWS_ENV = "LR_TEST_ROWS"
PARTS_ENV = "LR_TEST_PARTS"
#: Columns :func:`jvm_encoder` and :func:`killable_encoder` read besides ``id``.
KILL_COLUMNS = ("barrier", "block_at")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_jvm(pid: int) -> bool:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(argv[0].decode()).name == "java"


def executor_jvm() -> int:
    """The pid of the JVM this Python worker serves (its nearest ``java`` ancestor)."""
    import os

    pid = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        if _is_jvm(pid):
            return pid
    raise RuntimeError("no JVM among this worker's ancestors")


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (no such process, or a zombie not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def numbered_rows(spark: Any) -> Any:
    """``$LR_TEST_ROWS`` rows ``id, name`` in ``$LR_TEST_PARTS`` partitions."""
    import os

    rows, parts = int(os.environ[ROWS_ENV]), int(os.environ[PARTS_ENV])
    return spark.range(0, rows, numPartitions=parts).selectExpr("id", "concat('row-', id) AS name")


def jvm_encoder(row: Any) -> bytes:
    """``{"id", "jvm"}``: the row's id and the pid of the JVM whose task wrote it."""
    import json

    return json.dumps({"id": row.id, "jvm": executor_jvm()}).encode()


def killable_encoder(row: Any) -> bytes:
    """As :func:`jvm_encoder`; the first attempt of partition 0 stops at ``row.block_at``.

    There it writes its executor's pid to the file ``row.barrier`` (chunks
    before that row are committed, the current one is open) and waits until
    that executor is killed, then exits at once, as the executor's Python
    worker does when its JVM dies. The job cannot finish before the kill.
    """
    import os

    ctx = TaskContext.get()
    assert ctx is not None
    if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and row.id == row.block_at:
        jvm = executor_jvm()
        tmp = Path(row.barrier + ".tmp")
        tmp.write_text(str(jvm))
        tmp.rename(row.barrier)
        deadline = time.monotonic() + GATE_TIMEOUT
        while not process_gone(jvm):
            if time.monotonic() > deadline:
                raise RuntimeError(f"executor {jvm} not killed within {GATE_TIMEOUT:.0f}s")
            time.sleep(0.02)
        os._exit(1)
    return jvm_encoder(row)


def killable_rows(spark: Any) -> Any:
    """:func:`numbered_rows` with the columns :func:`killable_encoder` reads.

    The barrier file is ``$LR_TEST_GATE``; partition 0 stops at its 151st row.
    """
    import os

    return numbered_rows(spark).selectExpr(
        "id", "name", f"'{os.environ[GATE_ENV]}' AS barrier", "150 AS block_at"
    )


def branch_delivered(spark: Any) -> Any:
    """An eager source at a branch: one row, how far the branch's application had
    applied ``policy`` (origin ``s1``) when the source was read."""
    import os

    from lr_client.store import create_engine, open_store
    from spark_jobs.launch import DATABASE_URL_ENV

    store = open_store(create_engine(os.environ[DATABASE_URL_ENV]))
    try:
        delivered = store.cascade.relay_delivered_position("policy", "s1")
    finally:
        store.engine.dispose()
    return spark.createDataFrame([(delivered,)], "delivered long")
