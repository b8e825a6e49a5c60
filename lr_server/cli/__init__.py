"""The ``lr`` command line: run a site's server, set up its database, look inside it.

Exit codes: 0 success; 1 a check failed or an operation failed (database
unreachable, schema missing, snapshot not open); 2 a usage or configuration
error; ``lr init-db --check`` also 3 (an upgrade is pending) and 4 (the
database was made by a newer release). Errors are one line on stderr,
``lr: error: ...`` naming the file, key, path or option at fault (usage errors,
click's own included, end with ``(try 'lr CMD --help')``), never a traceback;
a failed command creates no file. Every read command takes ``--json``.
Environment: ``LR_CONFIG`` is the default for ``--config``.

One module per command group: :mod:`~lr_server.cli.serve` (``server``,
``init-db``), :mod:`~lr_server.cli.status`, :mod:`~lr_server.cli.browse`,
:mod:`~lr_server.cli.snapshot`, :mod:`~lr_server.cli.members`,
:mod:`~lr_server.cli.provider`, :mod:`~lr_server.cli.streams` (``trim``,
``accept-loss``, ``replay``, ``rewind``), :mod:`~lr_server.cli.parked` and
:mod:`~lr_server.cli.demo`; what they share is in
:mod:`~lr_server.cli.errors`, :mod:`~lr_server.cli.options`,
:mod:`~lr_server.cli.database` and :mod:`~lr_server.cli.render`.

Each command parses its arguments, opens the site's store, calls one function of
:mod:`lr_server.admin` (the operator's API: the actions and their checks live
there) and prints the record it returns. Heavy modules (grpc, the server) are
imported inside the commands that need them, so ``lr --help`` is fast.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from lr_server.cli import (
    browse,
    demo,
    members,
    parked,
    provider,
    serve,
    snapshot,
    status,
    streams,
)
from lr_server.cli.errors import (
    EXIT_FAILED,
    EXIT_NEWER,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_USAGE,
    LRGroup,
)


@click.group("lr", cls=LRGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lr-routing-queue", prog_name="lr")
def cli() -> None:
    """Routing-queue log replication: run and inspect a site.

    Exit codes: 0 ok, 1 check or operation failed, 2 usage or config error.
    """


cli.add_command(serve.server)
cli.add_command(serve.init_db)
cli.add_command(status.status)
cli.add_command(browse.browse)
cli.add_command(snapshot.snapshot)
cli.add_command(demo.demo)
cli.add_command(streams.accept_loss)
cli.add_command(members.members)
cli.add_command(provider.provider)
cli.add_command(streams.trim)
cli.add_command(parked.parked)
cli.add_command(streams.replay)
cli.add_command(streams.rewind)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point of ``lr``."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="lr")


__all__ = ["EXIT_FAILED", "EXIT_NEWER", "EXIT_OK", "EXIT_PENDING", "EXIT_USAGE", "cli", "main"]
