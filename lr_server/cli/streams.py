"""``lr trim``, ``lr accept-loss``, ``lr replay`` and ``lr rewind``: acknowledged entries
deleted, a stopped stream resumed, a range shipped again from the source or delivered
again from a sink's receive queue (:mod:`lr_server.admin` does them)."""

from __future__ import annotations

from pathlib import Path

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.options import admin_errors, config_option
from lr_server.config import load_config


@click.command()
@config_option
@click.option("--batch", type=click.IntRange(min=1), help="Rows per transaction.")
def trim(config_path: Path, batch: int | None) -> None:
    """Delete send-queue entries every destination has acknowledged; print how many.

    On PostgreSQL the current slot is closed first, so everything acknowledged goes.
    """
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        result = admin.trim(config, store, batch)
    click.echo(f"trimmed {result.entries} entries")


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
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors():
        admin.check_stream(config, destination, client)  # before the database is opened
        with open_site_store(config) as store:
            stop = admin.accept_loss(config, store, destination, client)
    click.echo(
        f"accepted the loss of {destination}/{client} ({stop.reason}); "
        f"log entries resume after position {stop.resume_after}"
    )


@click.command()
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
@click.option(
    "--from",
    "from_position",
    required=True,
    type=int,
    help="The first position shipped again (inclusive).",
)
def replay(config_path: Path, destination: str, client: str, from_position: int) -> None:
    """Ship a stream's retained entries to its destination again, from a position on.

    The running server ships the client's entries from --from (inclusive) through
    what the destination had acknowledged when it picks the request up; the sink
    delivers them again, flagged replayed. A position trim deleted is refused: a
    full sync is needed then (lr snapshot request).
    """
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors():
        admin.check_stream(config, destination, client)  # before the database is opened
        with open_site_store(config) as store:
            request = admin.replay(config, store, destination, client, from_position)
    click.echo(
        f"replay {request.replay_id} of {destination}/{client} from position "
        f"{request.from_position} requested; lr status shows it until it is done"
    )


@click.command()
@config_option
@click.option("--source", "-s", required=True, help="The source site id.")
@click.option("--client", required=True, help="The client name.")
@click.option(
    "--to", "to_position", required=True, type=int, help="The first position delivered again."
)
def rewind(config_path: Path, source: str, client: str, to_position: int) -> None:
    """At a sink: deliver again the entries of a client from a source delivered from --to on.

    Only what the receive queue still holds: SQLite deletes entries as it delivers
    them, PostgreSQL keeps them until rotation. The listener gets them flagged
    replayed. Refused (exit 1) when the queue no longer holds them: ask the source
    (lr replay).
    """
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors(), open_site_store(config) as store:
        done = admin.rewind(config, store, source, client, to_position)
    click.echo(
        f"{done.entries} entries of {client} from {source} (positions {done.first_position}.."
        f"{done.last_position}) will be delivered again"
    )
