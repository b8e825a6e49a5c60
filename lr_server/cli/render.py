"""How the commands print: JSON, and rich tables that show every string verbatim."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def print_json(value: object) -> None:
    """Print ``value`` as indented JSON (what ``--json`` prints)."""
    click.echo(json.dumps(value, indent=2, default=str))


def console() -> Console:
    """A console that shows every string verbatim.

    Tables show data (payloads, reasons, errors, names read from the database
    or the network): nothing printed is read as rich markup or emoji codes, so
    ``[red]`` or ``[/x]`` in the data is shown as it is. Styles come only from
    :class:`rich.text.Text` objects built here.
    """
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, markup=False, emoji=False)


def table(title: str, *columns: str) -> Table:
    """A table with this title and these columns (cells fold, never cut)."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def human_bytes(n: int) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_seconds(sec: float) -> str:
    """A duration in seconds, minutes, hours or days."""
    if sec < 10:
        return f"{sec:.1f}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if sec >= size:
            return f"{sec / size:.0f}{unit}"
    return f"{sec:.0f}s"


def ago(ts: float | None, now: float) -> str:
    """How long before ``now`` the time ``ts`` was (``never`` without one)."""
    if not ts:
        return "never"
    return human_seconds(max(now - ts, 0.0)) + " ago"


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, an ellipsis last if it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_id(snapshot_id: str) -> str:
    """The first 8 characters of a snapshot id, as the tables show it."""
    return snapshot_id[:8]
