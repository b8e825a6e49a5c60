"""``lr parked``: a sink's parked entries listed, shown, retried, discarded
(:mod:`lr_server.admin.parked` does each)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.options import admin_errors, config_option, json_option
from lr_server.cli.render import ago, console, print_json, shorten, table
from lr_server.config import load_config

if TYPE_CHECKING:
    from lr_server.admin import BlockedView, ParkedCount, ParkedView

#: The states ``lr parked list --state`` takes.
STATES = ("parked", "held", "retrying", "retried", "discarded")


@click.group()
def parked() -> None:
    """Entries a sink's listener kept failing on (the "park" failure policy)."""


@parked.command("list")
@config_option
@click.option("--client", help="Only this client.")
@click.option("--source", help="Only this source site.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATES),
    help="Only these states (repeatable; default: parked, held, retrying).",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="Rows at most."
)
@json_option
def parked_list(
    config_path: Path,
    client: str | None,
    source: str | None,
    states: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """List parked entries, oldest first by queue."""
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors(), open_site_store(config) as store:
        found = admin.list_parked(store, client, source, states or None, limit=limit)
    if as_json:
        print_json([v.to_dict() for v in found])
        return
    render(found)


def render(found: Sequence[ParkedView]) -> None:
    """Print parked entries as a table."""
    now = time.time()
    t = table("parked entries", "id", "client", "source", "position", "key", "state")
    for name in ("attempts", "last failure", "error"):
        t.add_column(name, overflow="fold")
    for v in found:
        t.add_row(
            str(v.parked_id),
            v.client,
            v.source,
            str(v.source_position),
            v.key or "",
            v.state,
            str(v.attempts),
            ago(v.last_failed_at, now),
            shorten(v.error, 120),
        )
    console().print(t)


def render_failures(
    blocked: Sequence[BlockedView], parked: Sequence[ParkedCount], now: float
) -> None:
    """Print the sink's blocked queues and parked counts (``lr status``), if any."""
    out = console()
    if blocked:
        t = table("blocked queues", "source", "client", "partition", "attempts", "since", "error")
        for b in blocked:
            t.add_row(
                b.source,
                b.client,
                "-" if b.partition is None else str(b.partition),
                str(b.attempts),
                ago(b.first_failed_at, now),
                shorten(b.error, 120),
            )
        out.print(t)
    if parked:
        t = table("parked entries (lr parked list)", "source", "client", "entries")
        for p in parked:
            t.add_row(p.source, p.client, str(p.entries))
        out.print(t)


@parked.command("show")
@config_option
@click.argument("parked_id", type=int)
@json_option
def parked_show(config_path: Path, parked_id: int, as_json: bool) -> None:
    """Show one parked entry with its error and payload."""
    from lr_server import admin

    config = load_config(config_path)
    with open_site_store(config) as store:
        view = admin.show_parked(store, parked_id)
    if as_json:
        print_json(view.to_dict())
        return
    for name, value in view.to_dict().items():
        click.echo(f"{name}: {value}")


@parked.command("retry")
@config_option
@click.argument("ids", nargs=-1, type=int, required=True)
def parked_retry(config_path: Path, ids: tuple[int, ...]) -> None:
    """Deliver parked entries again (then the entries of their keys held behind them).

    The subscriber delivers them at its next round, in order; one that fails
    again is parked again.
    """
    from lr_server import admin

    config = load_config(config_path)
    with admin_errors(), open_site_store(config) as store:
        done = admin.retry_parked(store, ids)
    click.echo(f"{len(done)} entries to retry: " + ", ".join(str(v.parked_id) for v in done))


@parked.command("discard")
@config_option
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--by", help="Who discards them (default: the OS user).")
def parked_discard(config_path: Path, ids: tuple[int, ...], by: str | None) -> None:
    """Give up parked or held entries: never delivered, the row kept with who and when.

    The entries of a key held behind a discarded entry are then delivered.
    """
    from lr_server import admin
    from lr_server.admin.parked import os_user

    config = load_config(config_path)
    who = by or os_user()
    with admin_errors(), open_site_store(config) as store:
        done = admin.discard_parked(store, ids, who)
    click.echo(f"{len(done)} entries discarded by {who}")


__all__ = ["parked"]
