"""Options that several commands share, and their checks against the site's config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from lr_server.config import SiteConfig

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    """``--config`` / ``-c``: the site's TOML config file (default ``$LR_CONFIG``), required."""
    return click.option(
        "--config",
        "-c",
        "config_path",
        required=True,
        envvar="LR_CONFIG",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The site's TOML config file (default: $LR_CONFIG).",
    )(func)


def json_option(func: F) -> F:
    """``--json``: print JSON instead of tables."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(
        func
    )


def check_stream(config: SiteConfig, destination: str, client: str) -> None:
    """A usage error naming ``--destination`` or ``--client`` unless the site replicates
    ``client`` to ``destination``."""
    dest = next((d for d in config.destinations if d.id == destination), None)
    if dest is None:
        known = ", ".join(d.id for d in config.destinations) or "none"
        raise click.BadParameter(
            f"{destination!r} is not a destination of site {config.id} (configured: {known})",
            param_hint="--destination",
        )
    clients = config.clients_for(dest)
    if clients and client not in clients:
        raise click.BadParameter(
            f"{client!r} is not replicated to {destination} (clients: {', '.join(clients)})",
            param_hint="--client",
        )
