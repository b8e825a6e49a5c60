"""``lr trim`` and ``lr accept-loss``: acknowledged entries deleted, a stopped stream resumed."""

from __future__ import annotations

from pathlib import Path

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.errors import fail
from lr_server.cli.options import check_stream, config_option
from lr_server.config import load_config


@click.command()
@config_option
@click.option("--batch", type=click.IntRange(min=1), help="Rows per transaction.")
def trim(config_path: Path, batch: int | None) -> None:
    """Delete send-queue entries every destination has acknowledged; print how many.

    On PostgreSQL the current slot is closed first, so everything acknowledged goes.
    """
    config = load_config(config_path)
    with open_site_store(config) as store:
        store.rotation_period = 0.0
        n = store.trim(batch or config.retention.trim_batch)
    click.echo(f"trimmed {n} entries")


@click.command("accept-loss")
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
def accept_loss(config_path: Path, destination: str, client: str) -> None:
    """Resume a stopped stream, accepting that its sink misses some entries.

    A stream stops when its sink lacks entries this source no longer holds
    and the client has no snapshot provider. The running server then tells
    the sink (its listener's on_stream_dropped) and ships log entries again.
    """
    config = load_config(config_path)
    check_stream(config, destination, client)
    with open_site_store(config) as store:
        stop = store.accept_stream_loss(destination, client)
    if stop is None:
        fail(f"stream {destination}/{client} is not stopped")
    click.echo(
        f"accepted the loss of {destination}/{client} ({stop.reason}); "
        f"log entries resume after position {stop.resume_after}"
    )
