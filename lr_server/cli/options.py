"""Options that several commands share, and their checks against the site's config."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from lr_server.cli.errors import EXIT_USAGE, fail

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


@contextmanager
def admin_errors() -> Iterator[None]:
    """The admin API's input errors as usage errors (exit 2): naming the option at fault
    (``--destination``, ``--client``, ``--to``, ...) when the error names one.

    Its other errors are :class:`~lr_client.errors.LRError` s, which the ``lr`` group
    prints as one line (exit 1).
    """
    from lr_server.admin import AdminInputError

    try:
        yield
    except AdminInputError as exc:
        if exc.option is None:
            fail(str(exc), EXIT_USAGE)
        raise click.BadParameter(str(exc), param_hint=f"--{exc.option}") from exc
