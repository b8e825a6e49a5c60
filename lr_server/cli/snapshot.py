"""``lr snapshot``: full syncs requested, run (PySpark, in the foreground), listed, cancelled."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lr_server.cli.database import open_site_store, require_database
from lr_server.cli.errors import EXIT_USAGE, fail
from lr_server.cli.options import admin_errors, config_option, json_option
from lr_server.cli.render import ago, console, print_json, short_id, table
from lr_server.config import load_config

if TYPE_CHECKING:
    from lr_client.snapshot_status import SnapshotInfo


@click.group()
def snapshot() -> None:
    """Full syncs: request, run (PySpark), list, cancel."""


@snapshot.command("request")
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
@click.option("--reason", default="operator request", show_default=True)
def snapshot_request(config_path: Path, destination: str, client: str, reason: str) -> None:
    """Ask for a full sync of CLIENT to DESTINATION; prints the snapshot id.

    An open snapshot of the same destination and client is cancelled; the
    running server picks the request up (and launches the Spark job for
    clients with snapshot = "spark").
    """
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors():
        admin.check_snapshot_request(config, destination, client)  # before opening the database
        with open_site_store(config) as store:
            snapshot_id = admin.request_snapshot(config, store, destination, client, reason)
    click.echo(snapshot_id)


@snapshot.command("list")
@config_option
@click.option("--destination", "-d", help="Only this destination.")
@click.option("--client", help="Only this client.")
@click.option("--open", "only_open", is_flag=True, help="Only requested, running or ready ones.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Requests at most."
)
@json_option
def snapshot_list(
    config_path: Path,
    destination: str | None,
    client: str | None,
    only_open: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List snapshot requests, newest first."""
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        snaps = admin.list_snapshots(store, destination, client, only_open=only_open, limit=limit)
    if as_json:
        from lr_server.ops.status_records import snapshot_json

        print_json([snapshot_json(x) for x in snaps])
        return
    render_snapshots(snaps)


def render_snapshots(snaps: Sequence[SnapshotInfo]) -> None:
    """Print snapshot requests as a table, one row per destination's view."""
    now = time.time()
    t = table("snapshots", "id", "dest", "client", "status", "rows", "created", "reason")
    for x in snaps:
        total = "?" if x.rows_total is None else str(x.rows_total)
        t.add_row(
            short_id(x.snapshot_id),
            x.destination,
            x.client_name,
            x.state.value,
            f"{x.rows_written}/{total}",
            ago(x.created_at, now),
            x.reason,
        )
    out = console()
    out.print(t)
    if not snaps:
        out.print("no snapshots")


@snapshot.command("cancel")
@config_option
@click.argument("snapshot_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option(
    "--dest",
    "destination",
    default=None,
    help="Cancel it for this destination only; the others keep the shared snapshot.",
)
def snapshot_cancel(
    config_path: Path, snapshot_id: str, reason: str, destination: str | None
) -> None:
    """Cancel an open snapshot (SNAPSHOT_ID or a unique prefix of it)."""
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        found = admin.cancel_snapshot(store, snapshot_id, reason, destination)
    where = f" for {destination}" if destination else ""
    click.echo(f"cancelled {found.snapshot_id}{where}")


@snapshot.command("run", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
@click.option("--source", help="Source spec (jdbc:, parquet:, csv:, module:function).")
@click.option("--snapshot-id", help="Fill this existing request instead of creating one.")
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def snapshot_run(
    config_path: Path,
    destination: str,
    client: str,
    source: str | None,
    snapshot_id: str | None,
    dry_run: bool,
    job_args: tuple[str, ...],
) -> None:
    """Run the PySpark snapshot job for CLIENT to DESTINATION, in the foreground.

    Without --snapshot-id the job records a new request (cancelling an open
    one of the same stream). The source defaults to the client's
    spark_source; JOB_ARGS after -- go to ``python -m spark_jobs.snapshot_job``.
    Exit code 1 if the job failed or the snapshot was cancelled or superseded.
    """
    import os
    import shlex

    from lr_server import admin
    from spark_jobs.launch import DATABASE_URL_ENV

    config = load_config(config_path)
    with admin_errors():
        cmd = admin.snapshot_job_command(config, destination, client, source, snapshot_id, job_args)
    if dry_run:
        click.echo(f"{DATABASE_URL_ENV}=... {shlex.join(cmd)}")
        return
    if not _module_exists("spark_jobs.snapshot_job"):
        fail("spark_jobs.snapshot_job is not installed")
    require_database(config)
    env = {**os.environ, DATABASE_URL_ENV: config.database_url}
    conf = config.client(client)
    if conf is None or conf.spark_master.startswith("local"):
        env.setdefault("PYSPARK_PYTHON", sys.executable)
    code = subprocess.run(cmd, env=env, check=False).returncode
    if code == 3:
        fail("the snapshot was cancelled, superseded or not startable")
    if code == 2:
        fail("the snapshot job rejected its arguments", EXIT_USAGE)
    if code != 0:
        fail(f"the snapshot job failed (exit code {code})")


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
