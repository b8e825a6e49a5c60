"""``lr server`` and ``lr init-db``: run one of a site's servers, set up its database."""

from __future__ import annotations

from pathlib import Path

import click

from lr_client.errors import ConfigError
from lr_server.admin.database import database_url
from lr_server.cli.database import (
    make_database_directory,
    open_site_store,
    sqlite_file,
)
from lr_server.cli.errors import EXIT_NEWER, EXIT_PENDING, fail, first_line
from lr_server.cli.options import config_option, json_option
from lr_server.cli.render import print_json
from lr_server.config import SiteConfig, load_config


@click.command()
@config_option
@click.option("--member-id", help="This server's member id (default: members.id, else the host).")
@click.option("--listen", help="host:port of the receiver (default: site.listen).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Metrics port (default: site.metrics_port, or the port of site.metrics_listen).",
)
def server(
    config_path: Path, member_id: str | None, listen: str | None, metrics_port: int | None
) -> None:
    """Run one of the site's servers until SIGTERM or SIGINT.

    It plays both roles: the sender sessions of the streams it owns and a
    receiver for the configured sources, plus trim (when it owns it) and
    metrics. Several servers may share the site's database (PostgreSQL),
    each with its own ``--member-id``, ``--listen`` and ``--metrics-port``.
    """
    config = load_config(config_path)
    from lr_server.server import run_server

    config = member_overrides(config, member_id, listen, metrics_port)

    if config.listen:
        check_listen_address(config.listen)
    make_database_directory(config)
    try:
        run_server(config)
    except OSError as exc:  # a port in use, a file that cannot be read
        fail(f"the server could not start: {exc.strerror or first_line(exc)}")


def member_overrides(
    config: SiteConfig, member_id: str | None, listen: str | None, metrics_port: int | None
) -> SiteConfig:
    """The config with this server's own id, listen address and metrics port."""
    from dataclasses import replace

    from lr_server.config import parse_listen

    if member_id is not None:
        if not member_id or len(member_id) > 128 or not member_id.isprintable():
            raise ConfigError("--member-id: expected 1 to 128 printable characters")
        config = replace(config, members=replace(config.members, id=member_id))
    if listen is not None:
        config = replace(config, listen=parse_listen(listen, "--listen"))
    if metrics_port is not None and config.metrics_listen:  # the port of metrics_listen
        host = config.metrics_listen.rpartition(":")[0]
        config = replace(config, metrics_listen=f"{host}:{metrics_port}" if metrics_port else "")
    elif metrics_port is not None:
        config = replace(config, metrics_port=metrics_port)
    return config


def check_listen_address(address: str) -> None:
    """Fail (exit 1) naming ``site.listen`` if its address cannot be bound.

    Bound as the gRPC server binds (``SO_REUSEADDR`` and ``SO_REUSEPORT``), and
    released at once, so that a port in use is one line, not gRPC's native log.
    """
    import socket

    host, _, port = address.rpartition(":")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(sockaddr)
    except OSError as exc:
        fail(f"site.listen: cannot listen on {address}: {exc.strerror or exc}")


@click.command("init-db")
@config_option
@click.option(
    "--check",
    is_flag=True,
    help=(
        "Only check, change nothing: exit 0 if the schema is current and the destinations "
        "registered, 3 if an upgrade is pending (or the database is empty), 4 if the "
        "database was made by a newer release, 1 if it cannot be read."
    ),
)
@json_option
def init_db(config_path: Path, check: bool, as_json: bool) -> None:
    """Create or upgrade the site's schema (concurrency-safe) and register its destinations."""
    from lr_client.store.schema.lifecycle import SchemaState
    from lr_server import admin

    config = load_config(config_path)
    url = database_url(config)
    where = url.render_as_string(hide_password=True)
    dests = [d.id for d in config.destinations]
    db_file = sqlite_file(config)
    if check:
        if db_file is not None and not db_file.exists():
            fail(f"no database file at {db_file} (run `lr init-db`)", EXIT_PENDING)
        with open_site_store(config, check=False) as store:
            found = admin.check_database(config, store)
        status = found.status
        if as_json:
            print_json(found.to_dict())
        elif status.state is SchemaState.CURRENT:
            click.echo(f"{where}: {status.describe()}")
        if status.state is not SchemaState.CURRENT:
            code = EXIT_NEWER if status.state is SchemaState.AHEAD else EXIT_PENDING
            if not as_json:
                fail(f"{where}: {status.describe()}", code)
            raise click.exceptions.Exit(code)
        if found.unregistered_destinations:
            missing = ", ".join(found.unregistered_destinations)
            fail(f"destinations not registered: {missing} (run `lr init-db`)")
        return
    with open_site_store(config, check=False, create=True) as store:
        before = admin.init_database(config, store)
    if before.state is SchemaState.CURRENT:
        click.echo(f"schema revision {before.expected} already current at {where}")
    else:
        applied = ", ".join(before.pending)
        click.echo(f"schema revision {before.expected} ready at {where} (applied: {applied})")
    if dests:
        click.echo(f"destinations registered: {', '.join(dests)}")
