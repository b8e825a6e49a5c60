"""Exit codes, and every error as one ``lr: error:`` line on stderr.

:class:`LRGroup` is the ``lr`` group's class: it maps the SDK's errors and
click's usage errors to exit codes and one-line messages.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from sqlalchemy.exc import SQLAlchemyError

from lr_client.errors import ConfigError, LRError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PENDING = 3  # `lr init-db --check`: an upgrade is pending
EXIT_NEWER = 4  # `lr init-db --check`: the database was made by a newer release


def first_line(exc: BaseException) -> str:
    """The first line of the exception's message (its class name if it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print ``lr: error: message`` on stderr and exit with ``code``."""
    click.echo(f"lr: error: {message}", err=True)
    raise click.exceptions.Exit(code)


def usage_message(exc: click.UsageError) -> str:
    """Click's usage error as one line: the message, then where to find the usage.

    ``Missing option '--config' / '-c'.`` in ``lr status`` becomes
    ``missing option '--config' / '-c' (try 'lr status --help')``.
    """
    text = " ".join(line.strip() for line in exc.format_message().splitlines() if line.strip())
    text = text.rstrip(".") or "invalid usage"
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    if exc.ctx is not None:
        text += f" (try '{exc.ctx.command_path} --help')"
    return text


class LRGroup(click.Group):
    """Maps the SDK's errors to exit codes and one-line messages, click's usage errors too."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            fail(first_line(exc), EXIT_USAGE)
        except LRError as exc:
            fail(first_line(exc), EXIT_FAILED)
        except SQLAlchemyError as exc:
            fail(f"database error: {first_line(getattr(exc, 'orig', None) or exc)}")

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Click's ``main``, with its usage errors printed as one ``lr: error:`` line (exit 2).

        ``lr`` and ``lr snapshot`` without a command still print their help (exit 2).
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            click.echo(f"lr: error: {usage_message(exc)}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            click.echo(f"lr: error: {first_line(Exception(exc.format_message()))}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("lr: error: interrupted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(result if isinstance(result, int) else EXIT_OK)
