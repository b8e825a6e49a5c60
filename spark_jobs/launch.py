"""Start the snapshot job as a subprocess (what ``lr server`` does for a client).

Imports neither pyspark nor grpc: the server only builds a command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: The environment variable the job reads the database URL from (kept off the
#: command line, where ``ps`` would show a password).
DATABASE_URL_ENV = "LR_DATABASE_URL"


def snapshot_job_command(
    snapshot_id: str | None = None,
    *,
    source: str,
    encoder: str = "",
    key_column: str = "",
    master: str | None = "local[*]",
    spark_options: Mapping[str, str] | None = None,
    source_options: Mapping[str, str] | None = None,
    start: bool = True,
    destination: str | None = None,
    client: str | None = None,
    chunk_rows: int | None = None,
    python: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of ``python -m spark_jobs.snapshot_job`` for these settings.

    Give ``snapshot_id`` to fill an existing request, or ``destination`` and
    ``client`` to create one. The database URL is not part of it: pass it in
    the ``LR_DATABASE_URL`` environment variable (or add ``--database-url``).
    """
    if not source:
        raise ValueError("source is required (jdbc:, parquet:, csv:, ... or module:function)")
    cmd = [python or sys.executable, "-m", "spark_jobs.snapshot_job"]
    if snapshot_id:
        cmd += ["--snapshot-id", snapshot_id]
    elif destination and client:
        cmd += ["--destination", destination, "--client", client]
    else:
        raise ValueError("give snapshot_id, or destination and client")
    cmd += ["--source", source]
    if encoder:
        cmd += ["--encoder", encoder]
    if key_column:
        cmd += ["--key-column", key_column]
    if master:
        cmd += ["--master", master]
    for key, value in (spark_options or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    for key, value in (source_options or {}).items():
        cmd += ["--source-option", f"{key}={value}"]
    if start and snapshot_id:
        cmd.append("--start")
    if chunk_rows:
        cmd += ["--chunk-rows", str(int(chunk_rows))]
    cmd += list(extra_args)
    return cmd


def launch_snapshot_job(
    database_url: str,
    snapshot_id: str,
    *,
    source: str,
    encoder: str = "",
    key_column: str = "",
    master: str | None = "local[*]",
    spark_options: Mapping[str, str] | None = None,
    source_options: Mapping[str, str] | None = None,
    start: bool = True,
    chunk_rows: int | None = None,
    python: str | None = None,
    log_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start the snapshot job for one request in a child process; return it.

    The keyword arguments mirror a client's configuration
    (``lr_server.config.ClientConfig``: ``spark_source``, ``spark_encoder``,
    ``spark_key_column``, ``spark_master``, ``spark_options``). With ``start`` (the default) the job
    moves the request from REQUESTED to RUNNING itself, so a request another
    provider already took is left alone (the job exits with code 3).

    The child runs ``python -m spark_jobs.snapshot_job`` with ``python``
    (default: this interpreter, also used for the Spark Python workers of a
    local master), the database URL in ``LR_DATABASE_URL``, and its own
    process group (``os.killpg(proc.pid, signal.SIGTERM)`` stops it and its
    JVM). Its output (Spark's log on stderr, one JSON result line on stdout:
    ``{"snapshot_id", "status", "entry_count", "seconds"}``) goes to
    ``log_path`` (appended) if given; otherwise stdout is a pipe and stderr is
    inherited. Exit codes: 0 done (READY), 2 bad settings, 3 the snapshot was
    cancelled, superseded or not startable, 1 any other failure (the request is
    then marked FAILED and a new one will be asked for).
    """
    exe = python or sys.executable
    cmd = snapshot_job_command(
        snapshot_id,
        source=source,
        encoder=encoder,
        key_column=key_column,
        master=master,
        spark_options=spark_options,
        source_options=source_options,
        start=start,
        chunk_rows=chunk_rows,
        python=exe,
    )
    child_env = dict(os.environ if env is None else env)
    child_env[DATABASE_URL_ENV] = database_url
    is_local = master is None or master.startswith("local")
    if is_local and "spark.pyspark.python" not in (spark_options or {}):
        child_env.setdefault("PYSPARK_PYTHON", exe)
    kwargs: dict[str, Any] = {
        "env": child_env,
        "start_new_session": True,
        "stdin": subprocess.DEVNULL,
    }
    if cwd is not None:
        kwargs["cwd"] = str(cwd)
    if log_path is None:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, **kwargs)
    log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs)
    finally:
        log.close()


__all__ = ["DATABASE_URL_ENV", "launch_snapshot_job", "snapshot_job_command"]
