"""``lr browse``: the outstanding entries of a queue, decoded (:mod:`lr_server.ops.browse`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lr_server.cli.database import open_site_store
from lr_server.cli.options import config_option, json_option
from lr_server.cli.render import console, print_json, short_id, table
from lr_server.config import load_config

if TYPE_CHECKING:
    from lr_server.ops.browse import BrowsedEntry, QueueSummary

#: Short labels of entry types in ``lr browse`` tables.
TYPE_LABELS = {"LOG_ENTRY_SYNC": "log", "SNAPSHOT_SYNC": "snapshot", "LAST_FULL_SYNC_ENTRY": "end"}


@click.command()
@config_option
@click.argument("queue", required=False)
@click.option("--tag", help="A stream tag: lrq_logentry_<dest>, lrq_snapsync_<dest>, lrq_recv_<c>.")
@click.option("--client", help="Only this client's entries.")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Start after this position (receive queues: this sequence number).",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Entries at most."
)
@json_option
def browse(
    config_path: Path,
    queue: str | None,
    tag: str | None,
    client: str | None,
    after: int,
    limit: int,
    as_json: bool,
) -> None:
    """Show the outstanding entries of QUEUE, decoded; without QUEUE, list the queues.

    QUEUE is LRQ_Send_LogEntries, LRQ_Send_SnapSync or LRQ_Recv_<client>__<source>.
    """
    from lr_client.errors import InvalidInputError
    from lr_server import admin as b

    config = load_config(config_path)
    with open_site_store(config) as store:
        if queue is None:
            if tag is not None or client is not None:
                raise click.UsageError("--tag and --client need a QUEUE")
            queues = b.list_queues(store)
            if as_json:
                print_json([q.to_dict() for q in queues])
                return
            render_queues(config.id, queues)
            return
        try:
            entries = b.browse(store, queue, tag=tag, client=client, after=after, limit=limit)
        except InvalidInputError as exc:
            raise click.UsageError(str(exc)) from exc
    if as_json:
        print_json([e.to_dict() for e in entries])
        return
    render_entries(queue, tag, entries, limit)


def render_queues(site: str, queues: Sequence[QueueSummary]) -> None:
    """Print the site's queues: entries and stream tags of each."""
    t = table(f"queues of site {site}", "queue", "entries", "tags")
    for q in queues:
        t.add_row(q.queue, str(q.entries), " ".join(q.tags) or "-")
    console().print(t)


def render_entries(
    queue: str, tag: str | None, entries: Sequence[BrowsedEntry], limit: int
) -> None:
    """Print a queue's entries, and the ``--after`` that shows the next ones if ``limit``
    were reached."""
    title = queue + (f" [{tag}]" if tag else "")
    recv = queue.startswith("LRQ_Recv_")
    t = table(
        title,
        "seq" if recv else "pos",
        "type",
        "src pos" if recv else "dests",
        "snap",
        "size",
        "preview",
    )
    for e in entries:
        t.add_row(
            str(e.seq if recv else e.position),
            TYPE_LABELS.get(e.type, e.type.lower()),
            str(e.position) if recv else ",".join(e.destinations),
            short_id(e.snapshot_id) or "-",
            str(e.size),
            e.preview,
        )
    out = console()
    out.print(t)
    if not entries:
        out.print("no outstanding entries")
    elif len(entries) == limit:
        last = entries[-1].seq if recv else entries[-1].position
        out.print(f"more may follow: --after {last}")
