"""``lr provider switch``: a cascaded client's provider at this node (docs/cascading.md)."""

from __future__ import annotations

from pathlib import Path

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.errors import EXIT_FAILED
from lr_server.cli.options import admin_errors, config_option, json_option
from lr_server.cli.render import print_json
from lr_server.config import load_config


@click.group()
def provider() -> None:
    """A cascaded client's provider at this node (docs/cascading.md)."""


@provider.command("switch")
@config_option
@click.option("--client", required=True, help="The cascaded client.")
@click.option("--to", "to", required=True, help="The node to receive it from.")
@json_option
def provider_switch(config_path: Path, client: str, to: str, as_json: bool) -> None:
    """Receive CLIENT from the node TO from now on (epoch + 1), and tell TO.

    Recorded in the database: it survives restarts (until the configuration names
    another provider). TO adopts this node when it gets the report (the running
    server repeats it every replication.cascade_report_interval) and resumes the
    stream after this node's position, or sends a full sync if it no longer holds
    the entries after it. The old provider, if alive, is refused and lets go.
    """
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors():
        admin.check_switch(config, client, to)  # before the database is opened
        with open_site_store(config) as store:
            result = admin.switch_provider(config, store, client, to)
    if as_json:
        print_json(result.to_dict())
    else:
        click.echo(
            f"{client}: provider {result.previous_provider} -> {to} (epoch {result.epoch}); "
            + (
                f"{to} adopted this node at position {result.applied_position}"
                if result.adopted
                else f"{to} did not answer ({result.error}); the running server reports to it"
            )
        )
    if not result.adopted:
        raise click.exceptions.Exit(EXIT_FAILED)
