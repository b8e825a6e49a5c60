"""``lr members``: the site's servers listed, a member's weight set, a gone member removed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.errors import fail
from lr_server.cli.options import config_option, json_option
from lr_server.cli.render import ago, console, print_json, table
from lr_server.config import load_config

if TYPE_CHECKING:
    from lr_client.records import Member


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
    config = load_config(config_path)
    with open_site_store(config) as store:
        found = store.list_members(config.members.lease_timeout)
        leases = store.list_leases()
        now = store.db_now()
    owned: dict[str, list[str]] = {}
    for lease in leases:
        if lease.owner is not None:
            owned.setdefault(lease.owner, []).append(lease.unit)
    if as_json:
        print_json(
            [
                {
                    "member_id": m.member_id,
                    "address": m.address,
                    "weight": m.weight,
                    "alive": m.alive,
                    "heartbeat_age": round(max(0.0, now - m.heartbeat_at), 3),
                    "joined_at": m.joined_at,
                    "units": sorted(owned.get(m.instance, [])),
                }
                for m in found
            ]
        )
        return
    render_members(found, owned, now)


def render_members(found: Sequence[Member], owned: dict[str, list[str]], now: float) -> None:
    """Print the members as a table; ``owned`` maps a member's instance to its units."""
    t = table("members", "member", "address", "weight", "state", "heartbeat", "units")
    for m in found:
        t.add_row(
            m.member_id,
            m.address,
            str(m.weight),
            "alive" if m.alive else "gone",
            ago(m.heartbeat_at, now),
            str(len(owned.get(m.instance, []))),
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
    config = load_config(config_path)
    with open_site_store(config) as store:
        if not store.set_member_weight(member_id, weight):
            fail(f"no member {member_id!r} (see 'lr members')")
    click.echo(f"member {member_id}: weight {weight}")


@members.command("remove")
@config_option
@click.argument("member_id")
def members_remove(config_path: Path, member_id: str) -> None:
    """Forget a member that is gone, releasing its units at once."""
    config = load_config(config_path)
    with open_site_store(config) as store:
        if not store.remove_member(member_id):
            fail(f"no member {member_id!r} (see 'lr members')")
    click.echo(f"member {member_id} removed")
