"""Every error a user can make with ``lr`` or its config: one ``lr: error:`` line, its exit code.

Each row runs ``lr`` (click's runner, in process) and checks the exact exit code,
that stderr is a single line starting ``lr: error:`` that names what is at fault
(the file, the key, the path, the option), that nothing prints a traceback, and
that the failed command created no file. A few rows also run as real processes
(``python -m lr_server`` and the ``lr`` console script).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lr_server.cli import EXIT_FAILED, EXIT_PENDING, EXIT_USAGE, cli
from tests.integration.test_cli import ROOT

#: A site that runs as a trial on one host: plaintext alone, loopback addresses.
BASE = """\
[site]
id = "site-a"
database_url = "{url}"
listen = "127.0.0.1:7000"

[security]
transport = "plaintext"

[[clients]]
name = "policy"
snapshot = "app"

[[clients]]
name = "inventory"

[[destinations]]
id = "site-b"
address = "127.0.0.1:7001"

[[sources]]
id = "site-b"
"""

#: The SQLite file of BASE's default URL, relative to the config file (its directory exists).
DB = "data/site.db"
SUPPORTED = ("site.database_url", "sqlite:///PATH", "postgresql://", "postgresql+psycopg://")


@dataclass(frozen=True)
class Case:
    """One error: the arguments after ``lr``, the exit code, what the line must name.

    In ``args`` and ``fragments``, ``{cfg}`` is the config file and ``{dir}`` its
    directory. ``config`` is the file's text (``{url}``: the database URL), or
    None for no file; ``raw`` writes bytes instead.
    """

    id: str
    args: tuple[str, ...]
    code: int
    fragments: tuple[str, ...]
    config: str | None = BASE
    raw: bytes | None = None
    url: str = f"sqlite:///{DB}"


def _cfg(*args: str) -> tuple[str, ...]:
    return (*args[:1], "--config", "{cfg}", *args[1:])


def _base(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new)


MISSING_DB = ("{dir}/" + DB, "does not exist", "lr init-db --config {cfg}", "site.database_url")

CASES: list[Case] = [
    # -- a read (or any non-init) command never creates the SQLite file ------------------
    Case("status-no-db", _cfg("status"), EXIT_FAILED, MISSING_DB),
    Case("status-json-no-db", _cfg("status", "--json"), EXIT_FAILED, MISSING_DB),
    Case("browse-no-db", _cfg("browse"), EXIT_FAILED, MISSING_DB),
    Case("browse-queue-no-db", _cfg("browse", "LRQ_Send_LogEntries"), EXIT_FAILED, MISSING_DB),
    Case("snapshot-list-no-db", ("snapshot", *_cfg("list")), EXIT_FAILED, MISSING_DB),
    Case("snapshot-cancel-no-db", ("snapshot", *_cfg("cancel", "abc")), EXIT_FAILED, MISSING_DB),
    Case(
        "snapshot-request-no-db",
        ("snapshot", *_cfg("request", "-d", "site-b", "--client", "policy")),
        EXIT_FAILED,
        MISSING_DB,
    ),
    Case(
        "accept-loss-no-db",
        _cfg("accept-loss", "-d", "site-b", "--client", "inventory"),
        EXIT_FAILED,
        MISSING_DB,
    ),
    Case("trim-no-db", _cfg("trim"), EXIT_FAILED, MISSING_DB),
    Case(
        "snapshot-run-no-db",
        ("snapshot", *_cfg("run", "-d", "site-b", "--client", "policy", "--source", "csv:/x")),
        EXIT_FAILED,
        MISSING_DB,
    ),
    Case(
        "init-db-check-no-db",
        _cfg("init-db", "--check"),
        EXIT_PENDING,
        ("{dir}/" + DB, "lr init-db"),
    ),
    Case(
        "status-no-db-directory",
        _cfg("status"),
        EXIT_FAILED,
        ("{dir}/nodir/deeper/site.db", "no directory {dir}/nodir/deeper", "lr init-db"),
        url="sqlite:///nodir/deeper/site.db",
    ),
    Case(
        "database-path-is-a-directory",
        _cfg("status"),
        EXIT_FAILED,
        ("sqlite:///{dir}/data:", "unable to open database file"),
        url="sqlite:///data",
    ),
    Case(
        "init-db-database-path-is-a-directory",
        _cfg("init-db"),
        EXIT_FAILED,
        ("sqlite:///{dir}/data:", "unable to open database file"),
        url="sqlite:///data",
    ),
    # -- site.database_url ---------------------------------------------------------------
    Case("mysql-url", _cfg("status"), EXIT_USAGE, (*SUPPORTED, "'mysql'"), url="mysql://u@h/db"),
    Case("oracle-url", _cfg("init-db"), EXIT_USAGE, (*SUPPORTED, "'oracle'"), url="oracle://h/x"),
    Case("garbage-url", _cfg("server"), EXIT_USAGE, (*SUPPORTED, "not a database URL"), url="x"),
    Case(
        "async-driver-url",
        _cfg("trim"),
        EXIT_USAGE,
        (*SUPPORTED, "'postgresql+asyncpg'"),
        url="postgresql+asyncpg://h/db",
    ),
    # -- plaintext without client authentication: loopback only --------------------------
    Case(
        "plaintext-listen-off-loopback",
        _cfg("server"),
        EXIT_USAGE,
        ("site.listen", "'0.0.0.0:7000'", "loopback", "in {cfg}"),
        config=_base('listen = "127.0.0.1:7000"', 'listen = "0.0.0.0:7000"'),
    ),
    Case(
        "plaintext-destination-off-loopback",
        _cfg("init-db"),
        EXIT_USAGE,
        ("destinations[0].address", "'b.example.net:7001'", "loopback"),
        config=_base('"127.0.0.1:7001"', '"b.example.net:7001"'),
    ),
    Case(
        "plaintext-token-without-token-auth",
        _cfg("status"),
        EXIT_USAGE,
        ("security.token", "client_auth = 'token'"),
        config=_base('transport = "plaintext"', 'transport = "plaintext"\ntoken = "t"'),
    ),
    # -- the config file -----------------------------------------------------------------
    Case("missing-config", ("status", "--config", "{dir}/nope.toml"), EXIT_USAGE, ("nope.toml",)),
    Case(
        "config-is-a-directory",
        ("status", "--config", "{dir}"),
        EXIT_USAGE,
        ("'--config'", "is a directory", "lr status --help"),
    ),
    Case(
        "bad-toml",
        _cfg("status"),
        EXIT_USAGE,
        ("{cfg}", "invalid TOML", "line 2"),
        config='[site]\nid = "site-a\n',
    ),
    Case("not-utf8", _cfg("status"), EXIT_USAGE, ("{cfg}", "UTF-8"), raw=b"[site]\nid = '\xff'\n"),
    Case(
        "unknown-key",
        _cfg("status"),
        EXIT_USAGE,
        ("replication.window_batch: unknown key", "window_batches", "in {cfg}"),
        config=BASE + "\n[replication]\nwindow_batch = 4\n",
    ),
    Case(
        "unknown-site-key",
        _cfg("status"),
        EXIT_USAGE,
        ("site.database: unknown key", "database_url"),
        config=_base("[site]\n", '[site]\ndatabase = "x"\n'),
    ),
    Case(
        "unknown-section",
        _cfg("status"),
        EXIT_USAGE,
        ("replicaton: unknown section", "replication"),
        config=BASE + "\n[replicaton]\nwindow_batches = 4\n",
    ),
    Case(
        "wrong-type",
        _cfg("status"),
        EXIT_USAGE,
        ("replication.window_batches", "positive integer", "'8'"),
        config=BASE + '\n[replication]\nwindow_batches = "8"\n',
    ),
    Case(
        "missing-required-key",
        _cfg("status"),
        EXIT_USAGE,
        ("destinations[1].address: required",),
        config=BASE + '\n[[destinations]]\nid = "site-c"\n',
    ),
    Case(
        "destinations-not-tables",
        _cfg("status"),
        EXIT_USAGE,
        ("destinations: expected [[destinations]] tables",),
        config="destinations = 5\n"
        + _base('[[destinations]]\nid = "site-b"\n', "").replace(
            'address = "127.0.0.1:7001"\n', ""
        ),
    ),
    Case(
        "invalid-destination-id-in-config",
        _cfg("status"),
        EXIT_USAGE,
        ("destinations[1].id", "Site_C"),
        config=BASE + '\n[[destinations]]\nid = "Site_C"\naddress = "127.0.0.1:7002"\n',
    ),
    # -- what click itself detects -------------------------------------------------------
    Case("unknown-command", ("bogus",), EXIT_USAGE, ("no such command 'bogus'", "lr --help")),
    Case(
        "unknown-snapshot-command",
        ("snapshot", "bogus"),
        EXIT_USAGE,
        ("no such command 'bogus'", "lr snapshot --help"),
    ),
    Case(
        "unknown-option",
        _cfg("status", "--bogus"),
        EXIT_USAGE,
        ("no such option", "--bogus", "lr status --help"),
    ),
    Case("missing-config-option", ("status",), EXIT_USAGE, ("'--config'", "lr status --help")),
    Case(
        "missing-required-option",
        ("snapshot", *_cfg("request", "-d", "site-b")),
        EXIT_USAGE,
        ("missing option '--client'", "lr snapshot request --help"),
    ),
    Case(
        "option-out-of-range",
        _cfg("trim", "--batch", "0"),
        EXIT_USAGE,
        ("'--batch'", "lr trim --help"),
    ),
    Case(
        "option-not-a-number",
        _cfg("browse", "LRQ_Send_LogEntries", "--limit", "many"),
        EXIT_USAGE,
        ("'--limit'", "'many'"),
    ),
    # -- names of destinations and clients -----------------------------------------------
    Case(
        "invalid-destination-name",
        ("snapshot", *_cfg("request", "-d", "Bad_Site", "--client", "policy")),
        EXIT_USAGE,
        ("--destination", "'Bad_Site'", "site-b"),
    ),
    Case(
        "unknown-destination",
        _cfg("accept-loss", "-d", "site-z", "--client", "policy"),
        EXIT_USAGE,
        ("--destination", "'site-z'", "configured: site-b"),
    ),
    Case(
        "invalid-client-name",
        ("snapshot", *_cfg("run", "-d", "site-b", "--client", "Bad_C", "--dry-run")),
        EXIT_USAGE,
        ("--client", "'Bad_C'", "policy, inventory"),
    ),
]


def _tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def _fill(text: str, tmp_path: Path, cfg: Path) -> str:
    return text.replace("{cfg}", str(cfg)).replace("{dir}", str(tmp_path))


def _write(tmp_path: Path, case: Case, url: str | None = None) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    cfg = tmp_path / "site.toml"
    if case.raw is not None:
        cfg.write_bytes(case.raw)
    elif case.config is not None:
        cfg.write_text(case.config.replace("{url}", url or case.url))
    return cfg


def lr(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"LR_CONFIG": None})


def one_error_line(stdout: str, stderr: str, code: int, expected: int) -> str:
    """The single ``lr: error:`` line of a failed command (and nothing on stdout)."""
    assert code == expected, (code, stdout, stderr)
    assert "Traceback" not in stdout + stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("lr: error: "), stderr
    assert stdout == "", stdout
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error(tmp_path: Path, case: Case) -> None:
    cfg = _write(tmp_path, case)
    before = _tree(tmp_path)
    result = lr(*(_fill(a, tmp_path, cfg) for a in case.args))
    line = one_error_line(result.stdout, result.stderr, result.exit_code, case.code)
    for fragment in case.fragments:
        assert _fill(fragment, tmp_path, cfg) in line, (fragment, line)
    assert _tree(tmp_path) == before  # no database file, no directory


# -- errors against an initialised database, on each backend --------------------------------
DB_CASES: list[Case] = [
    Case(
        "browse-tag-unknown-destination",
        _cfg("browse", "LRQ_Send_LogEntries", "--tag", "lrq_logentry_site-z"),
        EXIT_USAGE,
        ("lrq_logentry_site-z", "'site-z'", "known: site-b"),
    ),
    Case(
        "browse-snapsync-tag-unknown-destination",
        _cfg("browse", "LRQ_Send_SnapSync", "--tag", "lrq_snapsync_site-z"),
        EXIT_USAGE,
        ("'site-z'", "known: site-b"),
    ),
    Case(
        "browse-tag-invalid-name",
        _cfg("browse", "LRQ_Send_LogEntries", "--tag", "lrq_logentry_Site_Z"),
        EXIT_USAGE,
        ("Site_Z",),
    ),
    Case(
        "browse-invalid-client-name",
        _cfg("browse", "LRQ_Send_LogEntries", "--client", "Bad_C"),
        EXIT_USAGE,
        ("'Bad_C'", "lr browse --help"),
    ),
    Case(
        "browse-tag-without-queue",
        _cfg("browse", "--tag", "lrq_logentry_site-b"),
        EXIT_USAGE,
        ("--tag and --client need a QUEUE",),
    ),
    Case("browse-unknown-queue", _cfg("browse", "NoSuchQueue"), EXIT_USAGE, ("'NoSuchQueue'",)),
    Case(
        "snapshot-cancel-unknown",
        ("snapshot", *_cfg("cancel", "ffffffff")),
        EXIT_FAILED,
        ("no snapshot ffffffff",),
    ),
    Case(
        "snapshot-request-without-provider",
        ("snapshot", *_cfg("request", "-d", "site-b", "--client", "inventory")),
        EXIT_USAGE,
        ("client 'inventory' has no snapshot provider",),
    ),
    Case(
        "accept-loss-not-stopped",
        _cfg("accept-loss", "-d", "site-b", "--client", "inventory"),
        EXIT_FAILED,
        ("stream site-b/inventory is not stopped",),
    ),
]


@pytest.mark.parametrize("case", DB_CASES, ids=[c.id for c in DB_CASES])
def test_error_on_a_database(tmp_path: Path, db_url: str, case: Case) -> None:
    cfg = _write(tmp_path, case, db_url)
    done = lr("init-db", "--config", str(cfg))
    assert done.exit_code == 0, done.stderr
    before = _tree(tmp_path)
    result = lr(*(_fill(a, tmp_path, cfg) for a in case.args))
    line = one_error_line(result.stdout, result.stderr, result.exit_code, case.code)
    for fragment in case.fragments:
        assert _fill(fragment, tmp_path, cfg) in line, (fragment, line)
    assert _tree(tmp_path) == before


def test_a_known_tag_with_nothing_outstanding_is_not_an_error(tmp_path: Path) -> None:
    cfg = _write(tmp_path, CASES[0])
    assert lr("init-db", "--config", str(cfg)).exit_code == 0
    result = lr(
        "browse", "--config", str(cfg), "LRQ_Send_LogEntries", "--tag", "lrq_logentry_site-b"
    )
    assert result.exit_code == 0 and "no outstanding entries" in result.stdout


def test_a_database_password_is_never_printed(tmp_path: Path) -> None:
    case = Case("pw", _cfg("status"), EXIT_USAGE, (), url="mysql://u:s3cret-pw@h/db")
    cfg = _write(tmp_path, case)
    result = lr("status", "--config", str(cfg))
    line = one_error_line(result.stdout, result.stderr, result.exit_code, EXIT_USAGE)
    assert "site.database_url" in line and "s3cret-pw" not in line


def test_read_commands_on_a_database_without_schema_create_nothing(
    tmp_path: Path, db_url: str
) -> None:
    """No schema yet: one line naming `lr init-db`, exit 1, no file and no table made."""
    cfg = _write(tmp_path, CASES[0], db_url)
    before = _tree(tmp_path)
    for args in (["status"], ["browse"], ["snapshot", "list"], ["trim"]):
        result = lr(*args, "--config", str(cfg))
        line = one_error_line(result.stdout, result.stderr, result.exit_code, EXIT_FAILED)
        assert "lr init-db" in line, line
        if not db_url.startswith("sqlite"):  # the database is named
            assert line.startswith("lr: error: postgresql") and "no schema" in line, line
    assert _tree(tmp_path) == before
    if not db_url.startswith("sqlite"):
        check = lr("init-db", "--config", str(cfg), "--check", "--json")
        assert check.exit_code == EXIT_PENDING and '"state": "empty"' in check.stdout


# -- through a real process: the console script and `python -m lr_server` -------------------
def _commands() -> list[list[str]]:
    script = Path(sys.executable).with_name("lr")
    assert script.exists(), "the lr console script is not installed in this environment"
    return [[str(script)], [sys.executable, "-m", "lr_server"]]


PROCESS_CASES = [
    c
    for c in CASES
    if c.id
    in {"status-no-db", "bad-toml", "unknown-command", "missing-required-option", "mysql-url"}
]


#: Every case through the console script, as users run it; ``python -m lr_server`` calls
#: the same ``main``: one usage error and one failed command show its wiring.
MODULE_CASES = {"status-no-db", "unknown-command"}
PROCESS_RUNS = [(c, "script") for c in PROCESS_CASES] + [
    (c, "module") for c in PROCESS_CASES if c.id in MODULE_CASES
]


@pytest.mark.parametrize(
    ("case", "command"), PROCESS_RUNS, ids=[f"{c.id}-{how}" for c, how in PROCESS_RUNS]
)
def test_error_in_a_real_process(tmp_path: Path, case: Case, command: str) -> None:
    cfg = _write(tmp_path, case)
    before = _tree(tmp_path)
    argv = _commands()[0 if command == "script" else 1]
    env = {k: v for k, v in os.environ.items() if k != "LR_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [*argv, *(_fill(a, tmp_path, cfg) for a in case.args)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    line = one_error_line(done.stdout, done.stderr, done.returncode, case.code)
    for fragment in case.fragments:
        assert _fill(fragment, tmp_path, cfg) in line, (fragment, line)
    assert _tree(tmp_path) == before


def test_server_port_in_use_is_one_line_naming_the_key(tmp_path: Path) -> None:
    """`lr server` whose port another process holds: exit 1, no gRPC log, no traceback."""
    listen = 'listen = "127.0.0.1:7000"\n'
    sources = '[[sources]]\nid = "site-b"\n'
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        configs = {
            "site.listen": _base(listen, f'listen = "127.0.0.1:{port}"\n'),
            "site.metrics_port": _base(listen, f"metrics_port = {port}\n")
            .replace(sources, "")
            .replace("{url}", "sqlite:///made/by/server/site.db"),
        }
        for key, config in configs.items():
            cfg = _write(tmp_path, Case(key, (), 0, (), config=config))
            done = subprocess.run(
                [sys.executable, "-m", "lr_server", "server", "--config", str(cfg)],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                timeout=120,
                check=False,
            )
            line = one_error_line(done.stdout, done.stderr, done.returncode, EXIT_FAILED)
            assert line.startswith(f"lr: error: the server could not start: {key}") or (
                line.startswith(f"lr: error: {key}: cannot listen on 127.0.0.1:{port}")
            ), line
            assert "in use" in line, line
        # The listen port is checked first; the metrics port once the server has
        # created its database, directory included, as `lr init-db` would.
        assert (tmp_path / "made" / "by" / "server" / "site.db").exists()


@pytest.mark.parametrize("args", [[], ["snapshot"]])
def test_a_group_without_a_command_prints_its_help(args: list[str]) -> None:
    result = lr(*args)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith(f"Usage: {' '.join(['lr', *args])} [OPTIONS] COMMAND")
    assert "Commands:" in result.stderr and "Traceback" not in result.stderr


def test_help_and_version_still_exit_0() -> None:
    assert lr("--version").exit_code == 0 and "lr, version" in lr("--version").stdout
    assert lr("status", "--help").exit_code == 0
