"""``lr members``: the site's servers listed, a member's weight set, a gone member removed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.options import config_option, json_option
from lr_server.cli.render import console, human_seconds, print_json, table
from lr_server.config import load_config

if TYPE_CHECKING:
    from lr_server.admin import MemberView


@click.group(invoke_without_command=True)
@click.option(
    "--config",
    "-c",
    "config_path",
    envvar="LR_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The site's TOML config file (default: $LR_CONFIG).",
)
@json_option
@click.pass_context
def members(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    """List the site's servers (members): id, address, weight, heartbeat, units owned."""
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("Missing option '--config' / '-c'.", ctx)
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        found = admin.list_members(config, store)
    if as_json:
        print_json([m.to_dict() for m in found])
        return
    render_members(found)


def render_members(found: Sequence[MemberView]) -> None:
    """Print the members as a table."""
    t = table("members", "member", "address", "weight", "state", "heartbeat", "units")
    for m in found:
        t.add_row(
            m.member_id,
            m.address,
            str(m.weight),
            "alive" if m.alive else "gone",
            human_seconds(m.heartbeat_age) + " ago",
            str(len(m.units)),
        )
    out = console()
    out.print(t)
    if not found:
        out.print("no members")


@members.command("weight")
@config_option
@click.argument("member_id")
@click.argument("weight", type=click.IntRange(min=0))
def members_weight(config_path: Path, member_id: str, weight: int) -> None:
    """Set a member's weight at run time (0 drains it: its units move to the others)."""
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        admin.set_member_weight(store, member_id, weight)
    click.echo(f"member {member_id}: weight {weight}")


@members.command("remove")
@config_option
@click.argument("member_id")
def members_remove(config_path: Path, member_id: str) -> None:
    """Forget a member that is gone, releasing its units at once."""
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        admin.remove_member(store, member_id)
    click.echo(f"member {member_id} removed")
