"""The ``lr`` command line: run a site's server, set up its database, look inside it.

Exit codes: 0 success; 1 a check failed or an operation failed (database
unreachable, schema missing, snapshot not open); 2 a usage or configuration
error; ``lr init-db --check`` also 3 (an upgrade is pending) and 4 (the
database was made by a newer release). Errors are one line on stderr,
``lr: error: ...`` naming the file, key, path or option at fault (usage errors,
click's own included, end with ``(try 'lr CMD --help')``), never a traceback;
a failed command creates no file. Every read command takes ``--json``.
Environment: ``LR_CONFIG`` is the default for ``--config``.

Heavy modules (grpc, the server) are imported inside the commands that need
them, so ``lr --help`` is fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from lr_client.errors import ConfigError, LRError, SchemaError, StoreUnavailableError
from lr_server.config import CascadeRole, SiteConfig, SnapshotProvider, load_config

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from sqlalchemy.engine import URL

    from lr_client.store import QueueStore
    from lr_server.status import SiteStatus

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PENDING = 3  # `lr init-db --check`: an upgrade is pending
EXIT_NEWER = 4  # `lr init-db --check`: the database was made by a newer release

F = TypeVar("F", bound=Callable[..., Any])

#: Short labels of entry types in ``lr browse`` tables.
TYPE_LABELS = {"LOG_ENTRY_SYNC": "log", "SNAPSHOT_SYNC": "snapshot", "LAST_FULL_SYNC_ENTRY": "end"}


def _first_line(exc: BaseException) -> str:
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
            fail(_first_line(exc), EXIT_USAGE)
        except LRError as exc:
            fail(_first_line(exc), EXIT_FAILED)
        except SQLAlchemyError as exc:
            fail(f"database error: {_first_line(getattr(exc, 'orig', None) or exc)}")

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
            click.echo(f"lr: error: {_first_line(Exception(exc.format_message()))}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("lr: error: interrupted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(result if isinstance(result, int) else EXIT_OK)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def config_option(func: F) -> F:
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
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(
        func
    )


def database_url(config: SiteConfig) -> URL:
    """``site.database_url`` parsed, or a :class:`ConfigError` naming the key."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(config.database_url)
    except ArgumentError as exc:
        raise ConfigError(f"site.database_url: {_first_line(exc)}") from exc


def sqlite_file(config: SiteConfig) -> Path | None:
    """The file of a SQLite ``site.database_url`` (None for PostgreSQL or in-memory)."""
    url = database_url(config)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(str(url.database))


def require_database(config: SiteConfig) -> None:
    """Fail (exit 1) if the site's SQLite file does not exist: reading never creates it."""
    path = sqlite_file(config)
    if path is not None and not path.exists():
        where = f"--config {config.path}" if config.path else "--config FILE"
        missing = "" if path.parent.is_dir() else f" (no directory {path.parent})"
        fail(
            f"the database {path} does not exist{missing}; "
            f"`lr init-db {where}` creates it (site.database_url)"
        )


def make_database_directory(config: SiteConfig) -> None:
    """Create the directory of the site's SQLite file (``init-db``, ``server``)."""
    path = sqlite_file(config)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot create the directory {path.parent} of the database: {exc.strerror or exc}")


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


@contextmanager
def open_site_store(
    config: SiteConfig, *, check: bool = True, create: bool = False
) -> Iterator[QueueStore]:
    """The site's store (schema checked unless ``check`` is false); disposed on exit.

    Only with ``create`` may a missing SQLite file be created; otherwise it is an
    error naming the file. Errors while opening name the database.
    """
    from lr_client.store import open_store

    where = database_url(config).render_as_string(hide_password=True)
    if create:
        make_database_directory(config)
    else:
        require_database(config)
    try:
        store = open_store(config.database_url)
    except (ArgumentError, NoSuchModuleError, ImportError, ValueError) as exc:
        raise ConfigError(f"site.database_url: {_first_line(exc)}") from exc
    try:
        if check:
            store.check_schema()
        yield store
    except (SchemaError, StoreUnavailableError, SQLAlchemyError) as exc:
        fail(f"{where}: {_first_line(getattr(exc, 'orig', None) or exc)}")
    finally:
        store.close()


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


# -- formatting ---------------------------------------------------------------------------
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
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_seconds(sec: float) -> str:
    if sec < 10:
        return f"{sec:.1f}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if sec >= size:
            return f"{sec / size:.0f}{unit}"
    return f"{sec:.0f}s"


def ago(ts: float | None, now: float) -> str:
    if not ts:
        return "never"
    return human_seconds(max(now - ts, 0.0)) + " ago"


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_id(snapshot_id: str) -> str:
    return snapshot_id[:8]


# -- the group ----------------------------------------------------------------------------
@click.group("lr", cls=LRGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lr-routing-queue", prog_name="lr")
def cli() -> None:
    """Routing-queue log replication: run and inspect a site.

    Exit codes: 0 ok, 1 check or operation failed, 2 usage or config error.
    """


@cli.command()
@config_option
@click.option("--member-id", help="This server's member id (default: members.id, else the host).")
@click.option("--listen", help="host:port of the receiver (default: site.listen).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Metrics port (default: site.metrics_port).",
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

    config = _member_overrides(config, member_id, listen, metrics_port)

    if config.listen:
        check_listen_address(config.listen)
    make_database_directory(config)
    try:
        run_server(config)
    except OSError as exc:  # a port in use, a file that cannot be read
        fail(f"the server could not start: {exc.strerror or _first_line(exc)}")


@cli.command("init-db")
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
    from lr_client.store.lifecycle import SchemaState

    config = load_config(config_path)
    url = database_url(config)
    where = url.render_as_string(hide_password=True)
    dests = [d.id for d in config.destinations]
    db_file = sqlite_file(config)
    if check:
        if db_file is not None and not db_file.exists():
            fail(f"no database file at {db_file} (run `lr init-db`)", EXIT_PENDING)
        with open_site_store(config, check=False) as store:
            status = store.schema_status()
            missing = (
                [d for d in dests if d not in store.site_numbers(refresh=True)]
                if status.state is SchemaState.CURRENT
                else dests
            )
        if as_json:
            print_json(
                {
                    "database": where,
                    "state": status.state.value,
                    "current": status.current,
                    "expected": status.expected,
                    "pending": list(status.pending),
                    "unregistered_destinations": missing,
                }
            )
        elif status.state is SchemaState.CURRENT:
            click.echo(f"{where}: {status.describe()}")
        if status.state is not SchemaState.CURRENT:
            code = EXIT_NEWER if status.state is SchemaState.AHEAD else EXIT_PENDING
            if not as_json:
                fail(f"{where}: {status.describe()}", code)
            raise click.exceptions.Exit(code)
        if missing:
            fail(f"destinations not registered: {', '.join(missing)} (run `lr init-db`)")
        return
    with open_site_store(config, check=False, create=True) as store:
        before = store.create_schema()
        store.register_sites(dests)
    if before.state is SchemaState.CURRENT:
        click.echo(f"schema revision {before.expected} already current at {where}")
    else:
        applied = ", ".join(before.pending)
        click.echo(f"schema revision {before.expected} ready at {where} (applied: {applied})")
    if dests:
        click.echo(f"destinations registered: {', '.join(dests)}")


# -- status -------------------------------------------------------------------------------
@cli.command()
@config_option
@json_option
def status(config_path: Path, as_json: bool) -> None:
    """Where every stream stands: lag, state, acks, in-flight, snapshots, drops."""
    from lr_server.status import collect_status

    config = load_config(config_path)
    with open_site_store(config) as store:
        report = collect_status(config, store)
    if as_json:
        print_json(report.to_dict())
    else:
        render_status(report)


def render_status(report: SiteStatus) -> None:
    from rich.text import Text

    from lr_server.status import StreamState

    out = console()
    now = report.time
    oldest = "-" if report.oldest_position is None else str(report.oldest_position)
    out.print(
        Text.assemble(
            (f"site {report.site}", "bold"),
            f"  head position {report.head_position}, oldest stored {oldest}",
        )
    )
    if report.send:
        # The owner column when several members share the streams (always in --json).
        owners = len({x.owner for x in report.send if x.owner}) > 1
        columns = ["dest", "client", "state", "lag", "bytes", "age", "ack", "in-fl"]
        t = table("send streams", *columns, *(["owner"] if owners else []))
        for x in report.send:
            t.add_row(
                x.destination + ("" if x.configured else "*"),
                x.client,
                x.state,
                str(x.lag_entries) + ("!" if x.slow and x.state != StreamState.DROPPED else ""),
                human_bytes(x.lag_bytes),
                human_seconds(x.lag_seconds),
                ago(x.last_ack, now),
                "-" if x.inflight_batches is None else str(x.inflight_batches),
                *([x.owner or "-"] if owners else []),
            )
        out.print(t)
    snaps = [x for x in report.send if x.snapshot]
    if snaps:
        t = table("open snapshots", "dest", "client", "id", "status", "rows", "base")
        for x in snaps:
            assert x.snapshot is not None
            total = "?" if x.snapshot.entry_count is None else str(x.snapshot.entry_count)
            t.add_row(
                x.destination,
                x.client,
                short_id(x.snapshot.snapshot_id),
                x.snapshot.status,
                f"{x.snapshot.rows_written}/{total}",
                "-" if x.snapshot.base_position is None else str(x.snapshot.base_position),
            )
        out.print(t)
    if report.slots:
        t = table("queue slots (retired whole)", "queue", "slots", "current", "stored", "size")
        for queue in ("send", "receive"):
            mine = [x for x in report.slots if x.queue == queue]
            if mine:
                t.add_row(
                    queue,
                    str(len(mine)),
                    ",".join(str(x.slot) for x in mine if x.current),
                    str(sum(x.entries for x in mine)),
                    human_bytes(sum(x.bytes for x in mine)),
                )
        out.print(t)
    drops = [x for x in report.send if x.drop]
    if drops:
        t = table("dropped (full sync on return)", "dest", "client", "from pos", "when", "reason")
        for x in drops:
            assert x.drop is not None
            t.add_row(
                x.destination,
                x.client,
                str(x.drop.first_dropped_position),
                ago(x.drop.dropped_at, now),
                x.drop.reason,
            )
        out.print(t)
    stops = [x for x in report.send if x.stop]
    if stops:
        t = table(
            "stopped streams (lr accept-loss to resume) and accepted losses",
            "dest",
            "client",
            "resume after",
            "since",
            "reason",
        )
        for x in stops:
            assert x.stop is not None
            t.add_row(
                x.destination,
                x.client,
                str(x.stop.resume_after) + (" (accepted)" if x.stop.accepted else ""),
                ago(x.stop.stopped_at, now),
                Text(x.stop.reason),
            )
        out.print(t)
    if report.sessions:
        t = table("sessions", "dest", "state", "conn", "in-flight", "updated", "last error")
        for s in report.sessions:
            t.add_row(
                s.destination,
                s.state,
                "yes" if s.connected else "no",
                f"{s.inflight_batches} / {human_bytes(s.inflight_bytes)}",
                ago(s.updated_at, now),
                shorten(s.last_error, 60) or "-",
            )
        out.print(t)
    if report.sink:
        t = table("sink streams", "source", "client", "last pos", "snapshot", "recv", "queued")
        for y in report.sink:
            t.add_row(
                y.source + ("" if y.configured else "*"),
                y.client,
                str(y.last_position),
                y.snapshot_state + (f" {short_id(y.snapshot_id)}" if y.snapshot_id else ""),
                str(y.entries_received),
                str(y.queue_depth),
            )
        out.print(t)
    notices = [y for y in report.sink if y.drop]
    if notices:
        t = table("drop notices received", "source", "client", "from pos", "when", "reason")
        for y in notices:
            assert y.drop is not None
            t.add_row(
                y.source,
                y.client,
                str(y.drop.first_dropped_position),
                ago(y.drop.dropped_at, now),
                Text(y.drop.reason),
            )
        out.print(t)
    if report.cascades:
        t = table("cascades", "client", "origin", "role", "provider", "local wm", "global wm")
        for k in report.cascades:
            t.add_row(
                k.client,
                k.origin,
                k.role,
                f"{k.provider} (epoch {k.epoch})" if k.provider else "-",
                str(k.local_watermark),
                str(k.global_watermark),
            )
        out.print(t)
    kids = [(k.client, c) for k in report.cascades for c in k.children]
    if kids:
        t = table("cascade children", "client", "child", "epoch", "local wm", "acked", "report")
        for client, c in kids:
            state = "" if not c.dropped else (" (left)" if c.counts else " (dropped)")
            t.add_row(
                client,
                c.child_id + state,
                str(c.epoch),
                str(c.local_watermark),
                str(c.acked_position),
                ago(c.reported_at, now),
            )
        out.print(t)
    if not report.send and not report.sink:
        out.print("no streams yet: no destinations, sources or traffic")
    if any(x.slow and x.state != StreamState.DROPPED for x in report.send):
        out.print("! slow: past retention.soft_fraction of a retention limit")
    if any(not x.configured for x in report.send) or any(not y.configured for y in report.sink):
        out.print("* not in this config file")


# -- browse -------------------------------------------------------------------------------
@cli.command()
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
    from lr_server import browse as b

    config = load_config(config_path)
    with open_site_store(config) as store:
        if queue is None:
            if tag is not None or client is not None:
                raise click.UsageError("--tag and --client need a QUEUE")
            queues = b.list_queues(store)
            if as_json:
                print_json([q.to_dict() for q in queues])
                return
            t = table(f"queues of site {config.id}", "queue", "entries", "tags")
            for q in queues:
                t.add_row(q.queue, str(q.entries), " ".join(q.tags) or "-")
            console().print(t)
            return
        try:
            entries = b.browse(store, queue, tag=tag, client=client, after=after, limit=limit)
        except InvalidInputError as exc:
            raise click.UsageError(str(exc)) from exc
    if as_json:
        print_json([e.to_dict() for e in entries])
        return
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


# -- snapshots ----------------------------------------------------------------------------
@cli.group()
def snapshot() -> None:
    """Full syncs: request, run (PySpark), list, cancel."""


def _check_stream(config: SiteConfig, destination: str, client: str) -> None:
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


@snapshot.command("request")
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
@click.option("--reason", default="operator request", show_default=True)
def snapshot_request(config_path: Path, destination: str, client: str, reason: str) -> None:
    """Ask for a full sync of CLIENT to DESTINATION; prints the snapshot id.

    An open snapshot of the same destination and client is cancelled; the
    running server picks the request up (and launches the Spark job for
    clients with snapshot = "spark").
    """
    config = load_config(config_path)
    _check_stream(config, destination, client)
    found = config.client(client)
    if found is not None and found.snapshot == SnapshotProvider.NONE:
        fail(
            f'client {client!r} has no snapshot provider (snapshot = "none"), so nobody '
            f'could make a full sync for {destination}; set snapshot = "app" or "spark"',
            EXIT_USAGE,
        )
    with open_site_store(config) as store:
        snapshot_id = store.request_snapshot(None, destination, client, reason)
    click.echo(snapshot_id)


@snapshot.command("list")
@config_option
@click.option("--destination", "-d", help="Only this destination.")
@click.option("--client", help="Only this client.")
@click.option("--open", "only_open", is_flag=True, help="Only requested, running or ready ones.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Requests at most."
)
@json_option
def snapshot_list(
    config_path: Path,
    destination: str | None,
    client: str | None,
    only_open: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List snapshot requests, newest first."""
    from lr_client.records import OPEN_SNAPSHOT_STATUSES

    config = load_config(config_path)
    with open_site_store(config) as store:
        snaps = store.list_snapshots(
            destination, client, OPEN_SNAPSHOT_STATUSES if only_open else None
        )[:limit]
    if as_json:
        print_json(
            [
                {
                    "snapshot_id": x.snapshot_id,
                    "destination": x.destination,
                    "client": x.client_name,
                    "status": x.status.value,
                    "base_position": x.base_position,
                    "rows_written": x.rows_written,
                    "entry_count": x.entry_count,
                    "shipped_position": x.shipped_position,
                    "reason": x.reason,
                    "created_at": x.created_at,
                    "updated_at": x.updated_at,
                }
                for x in snaps
            ]
        )
        return
    now = time.time()
    t = table("snapshots", "id", "dest", "client", "status", "rows", "created", "reason")
    for x in snaps:
        total = "?" if x.entry_count is None else str(x.entry_count)
        t.add_row(
            short_id(x.snapshot_id),
            x.destination,
            x.client_name,
            x.status.value,
            f"{x.rows_written}/{total}",
            ago(x.created_at, now),
            x.reason,
        )
    out = console()
    out.print(t)
    if not snaps:
        out.print("no snapshots")


@snapshot.command("cancel")
@config_option
@click.argument("snapshot_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option(
    "--dest",
    "destination",
    default=None,
    help="Cancel it for this destination only; the others keep the shared snapshot.",
)
def snapshot_cancel(
    config_path: Path, snapshot_id: str, reason: str, destination: str | None
) -> None:
    """Cancel an open snapshot (SNAPSHOT_ID or a unique prefix of it)."""
    config = load_config(config_path)
    with open_site_store(config) as store:
        views = store.list_snapshots(destination)
        matches = list({x.snapshot_id: x for x in views if x.snapshot_id.startswith(snapshot_id)})
        if not matches:
            fail(f"no snapshot {snapshot_id}" + (f" for {destination}" if destination else ""))
        if len(matches) > 1:
            fail(f"{snapshot_id} matches {len(matches)} snapshots; give more of the id")
        found = store.get_snapshot(matches[0], destination)
        assert found is not None
        if not store.cancel_snapshot(found.snapshot_id, reason, destination):
            fail(f"snapshot {found.snapshot_id} is {found.status.value}, not open")
    where = f" for {destination}" if destination else ""
    click.echo(f"cancelled {found.snapshot_id}{where}")


def snapshot_job_command(
    config: SiteConfig,
    destination: str,
    client: str,
    source: str | None,
    snapshot_id: str | None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The snapshot job's command line for a client of ``config`` (see
    :func:`spark_jobs.launch.snapshot_job_command`); the URL goes in ``$LR_DATABASE_URL``."""
    from spark_jobs.launch import snapshot_job_command as job_command

    conf = config.client(client)
    spec = source or (conf.spark_source if conf else "")
    if not spec:
        raise click.BadParameter(
            f"client {client!r} has no spark_source in the config; give one", param_hint="--source"
        )
    return job_command(
        snapshot_id,
        source=spec,
        encoder=conf.spark_encoder if conf else "",
        key_column=conf.spark_key_column if conf else "",
        master=conf.spark_master if conf else None,
        spark_options=conf.spark_options if conf else None,
        destination=None if snapshot_id else destination,
        client=None if snapshot_id else client,
        extra_args=extra,
    )


@snapshot.command("run", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
@click.option("--source", help="Source spec (jdbc:, parquet:, csv:, module:function).")
@click.option("--snapshot-id", help="Fill this existing request instead of creating one.")
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def snapshot_run(
    config_path: Path,
    destination: str,
    client: str,
    source: str | None,
    snapshot_id: str | None,
    dry_run: bool,
    job_args: tuple[str, ...],
) -> None:
    """Run the PySpark snapshot job for CLIENT to DESTINATION, in the foreground.

    Without --snapshot-id the job records a new request (cancelling an open
    one of the same stream). The source defaults to the client's
    spark_source; JOB_ARGS after -- go to ``python -m spark_jobs.snapshot_job``.
    Exit code 1 if the job failed or the snapshot was cancelled or superseded.
    """
    import os
    import shlex

    from spark_jobs.launch import DATABASE_URL_ENV

    config = load_config(config_path)
    _check_stream(config, destination, client)
    cmd = snapshot_job_command(config, destination, client, source, snapshot_id, job_args)
    if dry_run:
        click.echo(f"{DATABASE_URL_ENV}=... {shlex.join(cmd)}")
        return
    if not _module_exists("spark_jobs.snapshot_job"):
        fail("spark_jobs.snapshot_job is not installed")
    require_database(config)
    env = {**os.environ, DATABASE_URL_ENV: config.database_url}
    conf = config.client(client)
    if conf is None or conf.spark_master.startswith("local"):
        env.setdefault("PYSPARK_PYTHON", sys.executable)
    code = subprocess.run(cmd, env=env, check=False).returncode
    if code == 3:
        fail("the snapshot was cancelled, superseded or not startable")
    if code == 2:
        fail("the snapshot job rejected its arguments", EXIT_USAGE)
    if code != 0:
        fail(f"the snapshot job failed (exit code {code})")


# -- demo -------------------------------------------------------------------------------
@cli.command()
@click.option(
    "--transactions",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Application transactions at the source site.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=1),
    default=20.0,
    show_default=True,
    help="Seconds over which the application spreads them.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary directory (databases, logs).")
@click.option(
    "--topology",
    type=click.Choice(["star", "tree"]),
    default="star",
    show_default=True,
    help="star: a replicates to b, c and d; tree: a cascaded client a -> b -> c, d, "
    "with d moved from b to a mid-run (lr provider switch).",
)
def demo(transactions: int, duration: float, keep: bool, topology: str) -> None:
    """Replicate between sites on embedded SQLite, as real `lr server` processes.

    Needs nothing but this package (Java and PySpark make the late site's
    full sync a Spark job). Ends with a table and a check of every sink;
    exit code 1 if a sink does not hold what it should. With --topology tree,
    the sites form a cascade (docs/cascading.md) and the check covers every node
    and that the provider switch needed no full sync.
    """
    if topology == "tree":
        from lr_server.demo.tree import run_tree_demo

        code = int(run_tree_demo(transactions=transactions, duration=duration, keep=keep))
        if code:
            raise click.exceptions.Exit(code)
        return
    from lr_server.demo.star import run_demo

    code = int(run_demo(transactions=transactions, duration=duration, keep=keep))
    if code:
        raise click.exceptions.Exit(code)


# -- stopped streams ----------------------------------------------------------------------
@cli.command("accept-loss")
@config_option
@click.option("--destination", "-d", required=True, help="The destination site id.")
@click.option("--client", required=True, help="The client name.")
def accept_loss(config_path: Path, destination: str, client: str) -> None:
    """Resume a stopped stream, accepting that its sink misses some entries.

    A stream stops when its sink lacks entries this source no longer holds
    and the client has no snapshot provider. The running server then tells
    the sink (its listener's on_stream_dropped) and ships log entries again.
    """
    config = load_config(config_path)
    _check_stream(config, destination, client)
    with open_site_store(config) as store:
        stop = store.accept_stream_loss(destination, client)
    if stop is None:
        fail(f"stream {destination}/{client} is not stopped")
    click.echo(
        f"accepted the loss of {destination}/{client} ({stop.reason}); "
        f"log entries resume after position {stop.resume_after}"
    )


def _member_overrides(
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
    if metrics_port is not None:
        config = replace(config, metrics_port=metrics_port)
    return config


# -- members ------------------------------------------------------------------------------
@cli.group(invoke_without_command=True)
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


# -- cascades -----------------------------------------------------------------------------
@cli.group()
def provider() -> None:
    """A cascaded client's provider at this node (docs/cascading.md)."""


def check_switch(config: SiteConfig, client: str, to: str) -> str:
    """The set's current configured provider of this site, or a usage error naming the
    option: the client must be cascaded here, this site not its root, ``to`` a node of
    the set other than this site and not below it (no cycle), and in ``[[sources]]``
    with an ``address``."""
    cascade = config.cascade(client)
    if cascade is None:
        raise click.BadParameter(
            f"{client!r} is not a cascaded client of this site (no [cascade.{client}])",
            param_hint="--client",
        )
    if config.id == cascade.root:
        raise click.BadParameter(
            f"{config.id} is the root of {client}: it has no provider", param_hint="--client"
        )
    members = cascade.members()
    if to not in members:
        raise click.BadParameter(
            f"{to!r} is not a node of the set of {client} (nodes: {', '.join(members)})",
            param_hint="--to",
        )
    if to == config.id:
        raise click.BadParameter(f"{to} cannot be its own provider", param_hint="--to")
    at = to
    while at != cascade.root:
        at = cascade.nodes[at]
        if at == config.id:
            raise click.BadParameter(
                f"{to} receives {client} through {config.id}: switching to it would make a cycle",
                param_hint="--to",
            )
    if cascade.role_of(to) is CascadeRole.LEAF:
        raise click.BadParameter(
            f"{to} is a leaf of {client}: it keeps no copy to provide from (name it in "
            f"cascade.{client}.branches)",
            param_hint="--to",
        )
    source = config.source(to)
    if source is None or not source.address:
        raise click.BadParameter(
            f"{to} must be in [[sources]] with its address (sources.address) to provide "
            f"{client} here",
            param_hint="--to",
        )
    return cascade.provider_of(config.id)


@provider.command("switch")
@config_option
@click.option("--client", required=True, help="The cascaded client.")
@click.option("--to", "to", required=True, help="The node to receive it from.")
@json_option
def provider_switch(config_path: Path, client: str, to: str, as_json: bool) -> None:
    """Receive CLIENT from the node TO from now on (epoch + 1), and tell TO.

    Recorded in the database: it survives restarts (until the configuration names
    another provider). TO adopts this node when it gets the report (the running
    server repeats it every replication.cascade_report_interval) and resumes the
    stream after this node's position, or sends a full sync if it no longer holds
    the entries after it. The old provider, if alive, is refused and lets go.
    """
    from lr_server.cascade_control import make_report
    from lr_server.transport.grpc_client import call_cascade

    config = load_config(config_path)
    check_switch(config, client, to)
    with open_site_store(config) as store:
        before = store.cascade_node(client)
        if before is None:
            fail(f"{client} is not cascaded in the database yet: start `lr server` once first")
        if before.provider_id == to:
            fail(f"{to} already provides {client} here (epoch {before.epoch})")
        epoch = store.switch_cascade_provider(client, to)
        node = store.cascade_node(client)
        assert epoch is not None and node is not None
        report = make_report(store, config.id, node, config.replication.cascade_grace)
    source = config.source(to)
    assert source is not None
    told = ""
    try:
        reply = call_cascade(config.id, source, config.security, report, timeout=10.0)
    except LRError as exc:
        told = _first_line(exc)
        reply = None
    result = {
        "client": client,
        "provider": to,
        "previous_provider": before.provider_id,
        "epoch": epoch,
        "local_watermark": report.local_watermark,
        "adopted": reply is not None,
        "global_watermark": None if reply is None else reply.global_watermark,
        "error": told or None,
    }
    if as_json:
        print_json(result)
    else:
        click.echo(
            f"{client}: provider {before.provider_id} -> {to} (epoch {epoch}); "
            + (
                f"{to} adopted this node at position {report.applied_position}"
                if reply is not None
                else f"{to} did not answer ({told}); the running server reports to it"
            )
        )
    if reply is None:
        raise click.exceptions.Exit(EXIT_FAILED)


# -- trim ---------------------------------------------------------------------------------
@cli.command()
@config_option
@click.option("--batch", type=click.IntRange(min=1), help="Rows per transaction.")
def trim(config_path: Path, batch: int | None) -> None:
    """Delete send-queue entries every destination has acknowledged; print how many.

    On PostgreSQL the current slot is closed first, so everything acknowledged goes.
    """
    config = load_config(config_path)
    with open_site_store(config) as store:
        store.rotation_period = 0.0
        n = store.trim(batch or config.retention.trim_batch)
    click.echo(f"trimmed {n} entries")


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point of ``lr``."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="lr")


__all__ = ["EXIT_FAILED", "EXIT_NEWER", "EXIT_OK", "EXIT_PENDING", "EXIT_USAGE", "cli", "main"]


if __name__ == "__main__":  # pragma: no cover - `python -m lr_server.cli`
    main()
