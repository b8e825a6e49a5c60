"""The ``lr`` CLI against real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from lr_client import LRMessageWithDestinations, RoutingQueueClient
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store.schema.lifecycle import LEGACY_REVISION, VERSION_TABLE, head_revision
from lr_server.cli import EXIT_FAILED, EXIT_NEWER, EXIT_PENDING, EXIT_USAGE, cli
from lr_server.ops.status_records import DEPRECATED_SNAPSHOT_KEYS
from tests.integration.test_schema_lifecycle import make_legacy_v1
from tests.kit.guards import need
from tests.kit.positions import new_slot
from tests.kit.procs import LrServer, stop_all, track
from tests.kit.sites import free_port, wait_for
from tests.kit.wait import scaled

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, db_url: str, extra: str = "", name: str = "site.toml") -> Path:
    """A site-a config: plaintext + tokens, two clients, destinations b and c, source x."""
    path = tmp_path / name
    path.write_text(
        f"""
[site]
id = "site-a"
database_url = "{db_url}"
listen = "127.0.0.1:{free_port()}"

[security]
transport = "plaintext"
client_auth = "token"
token = "token-of-a"

[[clients]]
name = "policy"
snapshot = "spark"
spark_source = "csv:/data/policy.csv"

[[clients]]
name = "inventory"

[[destinations]]
id = "site-b"
address = "127.0.0.1:7001"

[[destinations]]
id = "site-c"
address = "127.0.0.1:7002"
clients = ["policy"]

[[sources]]
id = "site-x"
token = "token-of-x"
{extra}
"""
    )
    return path


def lr(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(*args: str | Path) -> Result:
    result = lr(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def as_json(*args: str | Path) -> Any:
    return json.loads(ok(*args, "--json").stdout)


@pytest.fixture
def site(tmp_path: Path, db_url: str, store: SQLAlchemyQueueStore) -> Path:
    """An initialised site-a database and its config file."""
    cfg = write_config(tmp_path, db_url)
    ok("init-db", "--config", cfg)
    return cfg


def transmit(store: SQLAlchemyQueueStore, client: str, rows: list[tuple[bytes, list[str]]]) -> None:
    """Each row in a transaction and (PostgreSQL) a slot of its own: trims go entry by entry."""
    sender = RoutingQueueClient(store, source_id="site-a", client_name=client)
    for payload, dests in rows:
        new_slot(store)
        with store.engine.begin() as conn:
            sender.transmit_log_entry_message(conn, payload, dests)


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- help and wiring ------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        [],
        ["server"],
        ["init-db"],
        ["status"],
        ["browse"],
        ["trim"],
        ["snapshot"],
        ["snapshot", "request"],
        ["snapshot", "list"],
        ["snapshot", "cancel"],
        ["snapshot", "run"],
        ["demo"],
    ],
)
def test_help_everywhere(args: list[str]) -> None:
    result = ok(*args, "--help")
    assert "Usage: " in result.stdout


def test_help_does_not_load_grpc() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from lr_server.cli import cli; "
        "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0; "
        "assert 'grpc' not in sys.modules, 'grpc imported'; "
        "assert 'lr_server.server' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- init-db --------------------------------------------------------------------------
def test_init_db_creates_and_checks(tmp_path: Path, db_url: str) -> None:
    cfg = write_config(tmp_path, db_url)
    empty = lr("init-db", "--config", cfg, "--check")
    assert empty.exit_code == EXIT_PENDING
    assert "lr init-db" in empty.stdout + empty.stderr
    no_traceback(empty)
    if db_url.startswith("sqlite"):  # a check creates no file
        assert not (tmp_path / "site.db").exists()

    created = ok("init-db", "--config", cfg)
    assert f"schema revision {head_revision()} ready" in created.stdout
    assert "site-b, site-c" in created.stdout
    assert "(current)" in ok("init-db", "--config", cfg, "--check").stdout
    checked = json.loads(ok("init-db", "--config", cfg, "--check", "--json").stdout)
    assert checked["state"] == "current"
    assert checked["current"] == checked["expected"] == head_revision()
    assert checked["pending"] == [] and checked["unregistered_destinations"] == []
    assert "already current" in ok("init-db", "--config", cfg).stdout  # idempotent

    store = open_store(db_url)
    try:
        store.check_schema()
        assert {"site-b", "site-c"} <= set(store.sites.site_numbers(refresh=True))
    finally:
        store.engine.dispose()


def test_init_db_check_reports_a_pending_upgrade_and_a_newer_database(
    tmp_path: Path, db_url: str
) -> None:
    cfg = write_config(tmp_path, db_url)
    ok("init-db", "--config", cfg)
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:  # as if a newer release had migrated it
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff'"))
        newer = lr("init-db", "--config", cfg, "--check")
        assert newer.exit_code == EXIT_NEWER
        assert "newer than this release" in newer.stderr
        no_traceback(newer)
        refused = lr("init-db", "--config", cfg)
        assert refused.exit_code == EXIT_FAILED
        assert "newer than this release" in refused.stderr
        no_traceback(refused)
        with engine.begin() as conn:  # back to this release's revision
            conn.execute(
                text(f"UPDATE {VERSION_TABLE} SET version_num = :v"), {"v": head_revision()}
            )
        assert "(current)" in ok("init-db", "--config", cfg, "--check").stdout
        with engine.begin() as conn:  # a database of the first release
            if conn.dialect.name == "postgresql":  # views, functions, sequences too
                schema = conn.execute(text("SELECT current_schema()")).scalar_one()
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            for table in reversed(conn.dialect.get_table_names(conn)):
                conn.execute(text(f'DROP TABLE "{table}"'))
        make_legacy_v1(engine)
        legacy = lr("init-db", "--config", cfg, "--check", "--json")
        assert legacy.exit_code == EXIT_PENDING
        assert json.loads(legacy.stdout)["current"] == LEGACY_REVISION
        assert json.loads(legacy.stdout)["pending"][-1] == head_revision()
        ok("init-db", "--config", cfg)
        assert "(current)" in ok("init-db", "--config", cfg, "--check").stdout
    finally:
        engine.dispose()


def test_check_fails_when_a_destination_is_not_registered(tmp_path: Path, db_url: str) -> None:
    cfg = write_config(tmp_path, db_url)
    ok("init-db", "--config", cfg)
    more = write_config(
        tmp_path, db_url, '\n[[destinations]]\nid = "site-d"\naddress = "h:1"\n', "more.toml"
    )
    result = lr("init-db", "--config", more, "--check")
    assert result.exit_code == EXIT_FAILED
    assert "site-d" in result.stderr


def test_read_commands_on_an_empty_database_say_init_db(tmp_path: Path, db_url: str) -> None:
    cfg = write_config(tmp_path, db_url)
    for args in (["status"], ["browse"], ["snapshot", "list"], ["trim"]):
        result = lr(*args, "--config", cfg)
        assert result.exit_code == EXIT_FAILED, args
        assert "init-db" in result.stderr
        no_traceback(result)


# -- status ---------------------------------------------------------------------------
def test_status_per_destination_and_client(site: Path, store: SQLAlchemyQueueStore) -> None:
    transmit(
        store,
        "policy",
        [(b"p1", ["site-b", "site-c"]), (b"p2", ["site-b"]), (b"p3" * 50, ["site-b", "site-c"])],
    )
    transmit(store, "inventory", [(b"i1", ["site-b"]), (b"i2", ["site-b"])])
    store.shipping.set_cursor("site-b", "policy", 1)  # b acked p1
    snapshot_id = store.snapshots.request_snapshot(None, "site-c", "policy", "test")
    assert store.retention.drop_stream("site-b", "inventory", "too slow") is not None
    store.recv.apply_log_batch(
        "site-x",
        "policy",
        [WireEntry(position=p, type=ReplicationType.LOG_ENTRY_SYNC, payload=b"x") for p in (4, 7)],
    )
    has_sessions = hasattr(store.inspection, "save_session_status")
    if has_sessions:
        store.inspection.save_session_status(
            "site-b", "streaming", connected=True, inflight_batches=3, inflight_bytes=4096
        )

    report = as_json("status", "--config", site)
    assert report["site"] == "site-a"
    assert report["head_position"] == 5
    send = {(x["destination"], x["client"]): x for x in report["send"]}
    assert set(send) == {("site-b", "policy"), ("site-b", "inventory"), ("site-c", "policy")}

    bp = send[("site-b", "policy")]
    assert bp["state"] == "log entry sync"
    assert (bp["cursor"], bp["lag_entries"], bp["lag_bytes"]) == (1, 2, 2 + 100)
    assert bp["last_ack"] is not None and bp["lag_seconds"] >= 0
    if has_sessions:
        assert bp["inflight_batches"] == 3
        assert report["sessions"][0]["connected"] is True

    cp = send[("site-c", "policy")]
    assert cp["state"] == "snapshot sync"
    assert cp["snapshot"]["snapshot_id"] == snapshot_id
    assert cp["snapshot"]["status"] == "requested"
    assert cp["snapshot"]["state"] == "requested" and cp["snapshot"]["client_name"] == "policy"
    assert cp["snapshot"]["rows_total"] is None and cp["snapshot"]["rows_shipped"] == 0
    assert cp["lag_entries"] == 2 and cp["last_ack"] is None

    bi = send[("site-b", "inventory")]
    assert bi["state"] == "dropped"
    assert bi["drop"]["first_dropped_position"] == 1 and bi["drop"]["reason"] == "too slow"

    (sink,) = report["sink"]
    assert sink["source"] == "site-x" and sink["client"] == "policy"
    assert sink["queue"] == "LRQ_Recv_policy__site-x"
    assert (sink["last_position"], sink["entries_received"], sink["queue_depth"]) == (7, 2, 2)
    assert sink["snapshot_state"] == "none" and sink["configured"] is True
    stored = {"send": 0, "receive": 0}
    for x in report["slots"]:
        stored[x["queue"]] += x["entries"]
    if store.dialect == "postgresql":  # its queues are partitions retired by TRUNCATE
        assert stored == {"send": 5, "receive": 2}
        assert {x["queue"] for x in report["slots"] if x["current"]} == {"send", "receive"}
    else:
        assert report["slots"] == []

    text = ok("status", "--config", site).stdout
    for word in ("site-b", "site-c", "log entry sync", "snapshot sync", "dropped", "too slow"):
        assert word in text
    assert snapshot_id[:8] in text
    assert "site-x" in text
    assert ("queue slots" in text) == (store.dialect == "postgresql")
    assert max(len(line) for line in text.splitlines()) <= 80


def test_status_slow_and_backpressure(
    tmp_path: Path, db_url: str, store: SQLAlchemyQueueStore
) -> None:
    cfg = write_config(tmp_path, db_url, "\n[retention]\nmax_entries = 4\nsoft_fraction = 0.5\n")
    ok("init-db", "--config", cfg)
    transmit(store, "policy", [(b"x", ["site-b", "site-c"])] * 2)
    store.shipping.set_cursor("site-b", "policy", 2)
    send = {(x["destination"], x["client"]): x for x in as_json("status", "--config", cfg)["send"]}
    assert send[("site-c", "policy")]["slow"] is True  # 2 of max 4 entries: at the soft limit
    assert send[("site-b", "policy")]["slow"] is False
    assert {x["state"] for x in send.values()} == {"log entry sync"}
    assert "! slow" in ok("status", "--config", cfg).stdout
    # As the server's retention policy records it: backpressure on for policy, site-c slow.
    store.retention.set_flow_state("policy", True, ["site-c"])
    send = {(x["destination"], x["client"]): x for x in as_json("status", "--config", cfg)["send"]}
    assert send[("site-c", "policy")]["state"] == "backpressure"
    assert send[("site-b", "policy")]["state"] == "log entry sync"
    assert send[("site-b", "inventory")]["state"] == "log entry sync"
    store.retention.set_flow_state("policy", False, [])
    send = {(x["destination"], x["client"]): x for x in as_json("status", "--config", cfg)["send"]}
    assert send[("site-c", "policy")]["state"] == "log entry sync"


# -- browse ---------------------------------------------------------------------------
def test_browse_send_queue_decoded(site: Path, store: SQLAlchemyQueueStore) -> None:
    transmit(
        store,
        "policy",
        [
            (b"hello b and c", ["site-b", "site-c"]),
            (b"only b", ["site-b"]),
            (b"\x00\xff", ["site-c"]),
        ],
    )
    entries = as_json("browse", "--config", site, "LRQ_Send_LogEntries")
    assert [e["position"] for e in entries] == [1, 2, 3]
    assert entries[0]["destinations"] == ["site-b", "site-c"]
    assert entries[0]["type"] == "LOG_ENTRY_SYNC"
    assert entries[0]["size"] == 13 and entries[0]["preview"] == "hello b and c"
    assert entries[2]["preview"] == "0x00ff"

    store.shipping.set_cursor("site-b", "policy", 1)
    tagged = as_json(
        "browse", "--config", site, "LRQ_Send_LogEntries", "--tag", "lrq_logentry_site-b"
    )
    assert [e["position"] for e in tagged] == [2]
    tagged = as_json(
        "browse", "--config", site, "LRQ_Send_LogEntries", "--tag", "lrq_logentry_site-c"
    )
    assert [e["position"] for e in tagged] == [1, 3]
    paged = as_json(
        "browse", "--config", site, "LRQ_Send_LogEntries", "--after", "1", "--limit", "1"
    )
    assert [e["position"] for e in paged] == [2]
    assert as_json("browse", "--config", site, "LRQ_Send_LogEntries", "--client", "inventory") == []

    text = ok("browse", "--config", site, "LRQ_Send_LogEntries").stdout
    assert "hello b and c" in text and "site-b,site-c" in text

    queues = {q["queue"]: q for q in as_json("browse", "--config", site)}
    assert queues["LRQ_Send_LogEntries"]["entries"] == 3
    assert "lrq_logentry_site-b" in queues["LRQ_Send_LogEntries"]["tags"]


def test_browse_snapshot_and_receive_queues(site: Path, store: SQLAlchemyQueueStore) -> None:
    snapshot_id = store.snapshots.request_snapshot(None, "site-c", "policy")
    assert store.snapshots.start_snapshot(snapshot_id) is not None
    with store.engine.begin() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, snapshot_id, 0, [b"row-1", b"row-2"])
    assert store.snapshot_entries.finish_snapshot(snapshot_id) == 2

    snap = as_json("browse", "--config", site, "LRQ_Send_SnapSync", "--tag", "lrq_snapsync_site-c")
    assert [e["type"] for e in snap] == ["SNAPSHOT_SYNC", "SNAPSHOT_SYNC", "LAST_FULL_SYNC_ENTRY"]
    assert {e["snapshot_id"] for e in snap} == {snapshot_id}
    assert snap[0]["destinations"] == ["site-c"] and snap[0]["preview"] == "row-1"
    assert (
        as_json("browse", "--config", site, "LRQ_Send_SnapSync", "--tag", "lrq_snapsync_site-b")
        == []
    )

    store.recv.apply_log_batch(
        "site-x",
        "policy",
        [
            WireEntry(position=p, type=ReplicationType.LOG_ENTRY_SYNC, payload=b"r%d" % p)
            for p in (3, 9)
        ],
    )
    recv = as_json(
        "browse", "--config", site, "LRQ_Recv_policy__site-x", "--tag", "lrq_recv_policy"
    )
    assert [(e["position"], e["preview"]) for e in recv] == [(3, "r3"), (9, "r9")]
    assert recv[0]["seq"] < recv[1]["seq"]
    assert "LRQ_Recv_policy__site-x" in {q["queue"] for q in as_json("browse", "--config", site)}


@pytest.mark.parametrize(
    "args",
    [
        ["NoSuchQueue"],
        ["LRQ_Recv_policy__nowhere"],
        ["LRQ_Recv_bad_name"],
        ["LRQ_Send_LogEntries", "--tag", "lrq_snapsync_site-b"],
        ["LRQ_Send_LogEntries", "--tag", "lrq_logentry_Bad_Site"],
        ["LRQ_Send_LogEntries", "--limit", "0"],
    ],
)
def test_browse_bad_queue_or_tag_is_a_usage_error(site: Path, args: list[str]) -> None:
    result = lr("browse", "--config", site, *args)
    assert result.exit_code == EXIT_USAGE, result.stdout
    assert "Traceback" not in result.stdout + result.stderr


# -- snapshots --------------------------------------------------------------------------
def test_snapshot_request_list_cancel(site: Path, store: SQLAlchemyQueueStore) -> None:
    first = ok("snapshot", "request", "--config", site, "-d", "site-b", "--client", "policy")
    first_id = first.stdout.strip()
    listed = as_json("snapshot", "list", "--config", site)
    assert [(x["snapshot_id"], x["status"]) for x in listed] == [(first_id, "requested")]
    assert listed[0]["reason"] == "operator request"
    # SnapshotInfo's keys, and for one more release the old ones with the same values
    for old, new in DEPRECATED_SNAPSHOT_KEYS.items():
        assert listed[0][old] == listed[0][new], old
    assert (listed[0]["client_name"], listed[0]["state"]) == ("policy", "requested")

    # A second request for the same stream supersedes the first.
    second_id = ok(
        "snapshot", "request", "--config", site, "-d", "site-b", "--client", "policy"
    ).stdout.strip()
    statuses = {
        x["snapshot_id"]: x["status"] for x in as_json("snapshot", "list", "--config", site)
    }
    assert statuses == {first_id: "cancelled", second_id: "requested"}
    assert [x["snapshot_id"] for x in as_json("snapshot", "list", "--config", site, "--open")] == [
        second_id
    ]
    assert second_id[:8] in ok("snapshot", "list", "--config", site).stdout

    cancelled = ok("snapshot", "cancel", "--config", site, second_id[:10])
    assert second_id in cancelled.stdout
    got = store.snapshots.get_snapshot(second_id)
    assert got is not None and got.status.value == "cancelled"

    again = lr("snapshot", "cancel", "--config", site, second_id)
    assert again.exit_code == EXIT_FAILED and "not open" in again.stderr
    missing = lr("snapshot", "cancel", "--config", site, "ffffffffff")
    assert missing.exit_code == EXIT_FAILED and "no snapshot" in missing.stderr


def test_snapshot_cancel_for_one_destination_leaves_the_shared_one(
    site: Path, store: SQLAlchemyQueueStore
) -> None:
    sid = ok("snapshot", "request", "--config", site, "-d", "site-b", "--client", "policy")
    shared = sid.stdout.strip()
    joined = ok("snapshot", "request", "--config", site, "-d", "site-c", "--client", "policy")
    assert joined.stdout.strip() == shared  # one snapshot for both
    listed = as_json("snapshot", "list", "--config", site)
    assert sorted((x["snapshot_id"], x["destination"]) for x in listed) == [
        (shared, "site-b"),
        (shared, "site-c"),
    ]
    cancelled = ok("snapshot", "cancel", "--config", site, shared[:10], "--dest", "site-b")
    assert f"{shared} for site-b" in cancelled.stdout
    assert store.snapshots.get_snapshot(shared, "site-b").status.value == "cancelled"  # type: ignore[union-attr]
    assert store.snapshots.get_snapshot(shared, "site-c").status.value == "requested"  # type: ignore[union-attr]
    again = lr("snapshot", "cancel", "--config", site, shared, "--dest", "site-b")
    assert again.exit_code == EXIT_FAILED and "not open" in again.stderr
    assert store.snapshots.get_snapshot(shared).status.value == "requested"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("dest", "client", "word"),
    [
        ("site-z", "policy", "site-z"),
        ("site-c", "inventory", "inventory"),
        ("site-b", "Bad", "Bad"),
    ],
)
def test_snapshot_request_unknown_stream_is_a_usage_error(
    site: Path, store: SQLAlchemyQueueStore, dest: str, client: str, word: str
) -> None:
    result = lr("snapshot", "request", "--config", site, "-d", dest, "--client", client)
    assert result.exit_code == EXIT_USAGE
    assert word in result.stderr
    assert store.snapshots.list_snapshots() == []


def test_snapshot_run_builds_the_spark_job_command(site: Path) -> None:
    dry = ok("snapshot", "run", "--config", site, "-d", "site-b", "--client", "policy", "--dry-run")
    env, *cmd = shlex.split(dry.stdout)
    assert env == "LR_DATABASE_URL=..."  # the URL stays out of argv
    assert cmd[1:3] == ["-m", "spark_jobs.snapshot_job"]
    assert "--database-url" not in cmd and "--snapshot-id" not in cmd
    assert cmd[cmd.index("--source") + 1] == "csv:/data/policy.csv"
    assert cmd[cmd.index("--destination") + 1] == "site-b"
    assert cmd[cmd.index("--client") + 1] == "policy"
    assert cmd[cmd.index("--master") + 1] == "local[*]"

    args = ["snapshot", "run", "--config", site, "-d", "site-b", "--client", "inventory"]
    args += ["--source", "parquet:/x", "--snapshot-id", "abc", "--dry-run", "--", "--parts", "4"]
    given = shlex.split(ok(*args).stdout)[1:]
    assert "--start" in given and "--destination" not in given
    assert given[given.index("--source") + 1] == "parquet:/x"
    assert given[given.index("--snapshot-id") + 1] == "abc"
    assert given[-2:] == ["--parts", "4"]

    nosource = lr("snapshot", "run", "--config", site, "-d", "site-b", "--client", "inventory")
    assert nosource.exit_code == EXIT_USAGE and "spark_source" in nosource.stderr


# -- trim -----------------------------------------------------------------------------
def test_trim_deletes_what_every_destination_acked(site: Path, store: SQLAlchemyQueueStore) -> None:
    transmit(
        store, "policy", [(b"a", ["site-b", "site-c"]), (b"b", ["site-b"]), (b"c", ["site-b"])]
    )
    assert ok("trim", "--config", site).stdout.strip() == "trimmed 0 entries"
    store.shipping.set_cursor("site-b", "policy", 3)
    assert ok("trim", "--config", site).stdout.strip() == "trimmed 2 entries"
    assert store.shipping.oldest_position() == 1  # site-c still needs position 1
    store.shipping.set_cursor("site-c", "policy", 1)
    assert ok("trim", "--config", site, "--batch", "1").stdout.strip() == "trimmed 1 entries"
    assert store.shipping.oldest_position() is None


# -- errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("\n[replication]\nbatch_max_entrys = 5\n", "replication.batch_max_entrys"),
        ('\n[[destinations]]\nid = "Site_D"\naddress = "h:1"\n', "destinations[2].id"),
        ('\n[[destinations]]\nid = "site-d"\naddress = "nowhere"\n', "destinations[2].address"),
        ('\n[[destinations]]\nid = "site-b"\naddress = "h:1"\n', "destinations"),
    ],
)
def test_bad_config_exits_2_naming_the_key(
    tmp_path: Path, sqlite_url: str, extra: str, key: str
) -> None:
    cfg = write_config(tmp_path, sqlite_url, extra)
    for args in (["init-db"], ["status", "--json"], ["server"], ["trim"]):
        result = lr(*args, "--config", cfg)
        assert result.exit_code == EXIT_USAGE, (args, result.stdout, result.stderr)
        assert result.stderr.startswith(f"lr: error: {key}"), result.stderr
        no_traceback(result)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_missing_config_and_bad_database_url(tmp_path: Path) -> None:
    missing = lr("status", "--config", tmp_path / "nope.toml")
    assert missing.exit_code == EXIT_USAGE and "nope.toml" in missing.stderr
    no_traceback(missing)

    bad = write_config(tmp_path, "nosuchdb://x/y")
    result = lr("init-db", "--config", bad)
    assert result.exit_code == EXIT_USAGE and "site.database_url" in result.stderr
    no_traceback(result)

    assert lr("status").exit_code == EXIT_USAGE  # --config is required


def test_unreachable_database_exits_1(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, f"postgresql://nobody@127.0.0.1:{free_port()}/x?connect_timeout=2")
    result = lr("status", "--config", cfg)
    assert result.exit_code == EXIT_FAILED
    no_traceback(result)


def test_config_from_environment(site: Path) -> None:
    result = CliRunner().invoke(cli, ["status", "--json"], env={"LR_CONFIG": str(site)})
    assert result.exit_code == 0 and json.loads(result.stdout)["site"] == "site-a"


# -- lr server --------------------------------------------------------------------------
def test_server_runs_until_sigterm(tmp_path: Path, sqlite_url: str) -> None:
    """The console script starts a real server process that stops cleanly on SIGTERM."""
    cfg = write_config(tmp_path, sqlite_url)
    ok("init-db", "--config", cfg)
    lr_bin = Path(sys.executable).with_name("lr")
    cmd = [str(lr_bin)] if lr_bin.exists() else [sys.executable, "-m", "lr_server.cli"]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "server", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    track("lr server (console script)", log, proc)
    try:

        def running() -> bool:
            assert proc.poll() is None, log.read_text()
            return "running" in log.read_text()

        wait_for(running, 60, what="the server's 'running' log line")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=scaled(30)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the example config set ---------------------------------------------------------------
def _received(url: str) -> dict[str, list[bytes]]:
    """{receive queue name: payloads} of a sink."""
    store = open_store(url)
    try:
        out: dict[str, list[bytes]] = {}
        for q in store.queues.list_queues():
            with store.read() as conn:
                out[q.queue_name] = [
                    e.payload for e in store.queues.read_queue(conn, q.queue_id, 1000)
                ]
        return out
    finally:
        store.engine.dispose()


@pytest.mark.slow
def test_example_configs_replicate_over_mtls(tmp_path: Path) -> None:
    """examples/configs as documented: make-pki.sh, init-db, three servers, mTLS traffic."""
    need(shutil.which("openssl"), "make-pki.sh needs openssl")
    src = ROOT / "examples" / "configs"
    subprocess.run(["bash", str(src / "make-pki.sh"), str(tmp_path / "pki")], check=True)
    ports = {"7442": str(free_port()), "7443": str(free_port()), "9461": str(free_port())}
    cfgs = {}
    for site in ("a", "b", "c"):
        text = (src / f"site-{site}.toml").read_text()
        for old, new in ports.items():
            text = text.replace(old, new)
        text = text.replace("metrics_port = 9462", "").replace("metrics_port = 9463", "")
        cfgs[site] = tmp_path / f"site-{site}.toml"
        cfgs[site].write_text(text)
        ok("init-db", "--config", cfgs[site])
    urls = {s: f"sqlite:///{tmp_path / 'data' / f'site-{s}.db'}" for s in cfgs}
    assert all(Path(u.removeprefix("sqlite:///")).exists() for u in urls.values())

    servers = [LrServer(cfgs[s], tmp_path).start() for s in ("b", "c", "a")]
    try:
        servers[0].wait_listening(int(ports["7442"]))
        servers[1].wait_listening(int(ports["7443"]))
        for site, client, rows in (
            ("a", "policy", [(b"policy-%d" % i, ["site-b", "site-c"]) for i in range(20)]),
            ("a", "inventory", [(b"inv-a-%d" % i, ["site-b"]) for i in range(10)]),
            ("c", "inventory", [(b"inv-c-%d" % i, ["site-b"]) for i in range(10)]),
        ):
            store = open_store(urls[site])
            try:
                sender = RoutingQueueClient(store, source_id=f"site-{site}", client_name=client)
                with store.engine.begin() as conn:
                    sender.transmit_log_entry_messages(
                        conn, [LRMessageWithDestinations(p, d) for p, d in rows]
                    )
            finally:
                store.engine.dispose()
        want_b = {
            "LRQ_Recv_policy__site-a": [b"policy-%d" % i for i in range(20)],
            "LRQ_Recv_inventory__site-a": [b"inv-a-%d" % i for i in range(10)],
            "LRQ_Recv_inventory__site-c": [b"inv-c-%d" % i for i in range(10)],
        }
        want_c = {"LRQ_Recv_policy__site-a": want_b["LRQ_Recv_policy__site-a"]}
        wait_for(lambda: _received(urls["b"]) == want_b and _received(urls["c"]) == want_c, 60)

        def caught_up() -> bool:
            send = as_json("status", "--config", cfgs["a"])["send"]
            return len(send) == 3 and all(x["lag_entries"] == 0 for x in send)

        wait_for(caught_up, 30)
        sink = as_json("status", "--config", cfgs["b"])["sink"]
        assert {(x["source"], x["client"], x["entries_received"]) for x in sink} == {
            ("site-a", "policy", 20),
            ("site-a", "inventory", 10),
            ("site-c", "inventory", 10),
        }
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['9461']}/metrics") as resp:
            exposed = resp.read().decode()
        assert 'lr_entries_shipped_total{client="policy",destination="site-c"} 20.0' in exposed
    finally:
        codes = stop_all(servers)
    assert codes == [0, 0, 0], [s.log() for s in servers]


def test_snapshot_request_for_a_client_without_provider_is_refused(
    site: Path, store: SQLAlchemyQueueStore
) -> None:
    result = lr("snapshot", "request", "--config", site, "-d", "site-b", "--client", "inventory")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("lr: error: client 'inventory' has no snapshot provider")
    no_traceback(result)
    assert store.snapshots.list_snapshots() == []


def test_accept_loss_of_a_stream_that_is_not_stopped_fails(
    site: Path, store: SQLAlchemyQueueStore
) -> None:
    result = lr("accept-loss", "--config", site, "-d", "site-b", "--client", "inventory")
    assert result.exit_code == EXIT_FAILED
    assert result.stderr == "lr: error: stream site-b/inventory is not stopped\n"
    store.retention.stop_stream("site-b", "inventory", "test loss [/x]", 7)
    shown_text = ok("status", "--config", site).stdout
    assert "stopped" in shown_text and "test loss [/x]" in shown_text
    accepted = ok("accept-loss", "--config", site, "-d", "site-b", "--client", "inventory")
    assert "resume after position 7" in accepted.stdout
    stop = store.retention.get_stream_stop("site-b", "inventory")
    assert stop is not None and stop.accepted_at is not None
    shown = as_json("status", "--config", site)
    (stream,) = [
        x for x in shown["send"] if x["client"] == "inventory" and x["destination"] == "site-b"
    ]
    assert stream["stop"]["accepted"] is True and stream["state"] != "stopped"


def test_replay_records_a_request_that_status_shows_or_refuses_a_trimmed_position(
    site: Path, store: SQLAlchemyQueueStore
) -> None:
    transmit(store, "inventory", [(b"a", ["site-b"]), (b"b", ["site-b"]), (b"c", ["site-b"])])
    store.shipping.set_cursor("site-b", "inventory", 3)
    args = ("replay", "--config", site, "-d", "site-b", "--client", "inventory")
    requested = ok(*args, "--from", "2")
    assert "replay 1 of site-b/inventory from position 2 requested" in requested.stdout
    assert "replays" in ok("status", "--config", site).stdout
    (shown,) = as_json("status", "--config", site)["replays"]
    assert (shown["from_position"], shown["status"]) == (2, "pending")
    past = lr(*args, "--from", "4")
    assert past.exit_code == EXIT_USAGE and "--from" in past.stderr
    store.shipping.set_cursor("site-c", "policy", 3)
    ok("trim", "--config", site)
    trimmed = lr(*args, "--from", "2")
    assert trimmed.exit_code == EXIT_FAILED
    assert "a full sync is needed: lr snapshot request" in trimmed.stderr
    no_traceback(trimmed)


# -- members ------------------------------------------------------------------------------
def test_members_lists_the_servers_and_changes_a_weight(
    site: Path, store: SQLAlchemyQueueStore
) -> None:
    assert as_json("members", "--config", site) == []
    assert "no members" in ok("members", "--config", site).stdout
    store.members.join_member("a-1", "i1", "127.0.0.1:7443", 1)
    store.members.join_member("a-2", "i2", "127.0.0.1:7444", 2)
    assert store.members.acquire_unit("stream/site-b/policy", "a-2", "i2", 5.0) is not None
    listed = {m["member_id"]: m for m in as_json("members", "--config", site)}
    assert set(listed) == {"a-1", "a-2"}
    assert listed["a-2"]["address"] == "127.0.0.1:7444" and listed["a-2"]["weight"] == 2
    assert listed["a-2"]["units"] == ["stream/site-b/policy"] and listed["a-2"]["alive"]
    assert listed["a-1"]["units"] == []
    text_out = ok("members", "--config", site).stdout
    assert "a-1" in text_out and "alive" in text_out
    assert "weight 0" in ok("members", "weight", "a-2", "0", "--config", site).stdout
    assert {m.member_id: m.weight for m in store.members.list_members(5.0)} == {"a-1": 1, "a-2": 0}
    # Bad input: a clear error, nothing changed.
    gone = lr("members", "weight", "nobody", "3", "--config", site)
    assert gone.exit_code == EXIT_FAILED and "no member 'nobody'" in gone.stderr
    negative = lr("members", "weight", "a-1", "-1", "--config", site)
    assert negative.exit_code == EXIT_USAGE
    assert {m.member_id: m.weight for m in store.members.list_members(5.0)} == {"a-1": 1, "a-2": 0}
    assert "removed" in ok("members", "remove", "a-2", "--config", site).stdout
    assert [m["member_id"] for m in as_json("members", "--config", site)] == ["a-1"]
    assert all(x.owner is None for x in store.members.list_leases())  # its unit was released


def test_status_names_each_streams_owner(site: Path, store: SQLAlchemyQueueStore) -> None:
    store.members.join_member("a-1", "i1", "", 1)
    store.members.join_member("a-2", "i2", "", 1)
    store.members.acquire_unit("stream/site-b/policy", "a-1", "i1", 5.0)
    store.members.acquire_unit("stream/site-c/policy", "a-2", "i2", 5.0)
    send = {(s["destination"], s["client"]): s for s in as_json("status", "--config", site)["send"]}
    assert send[("site-b", "policy")]["owner"] == "a-1"
    assert send[("site-c", "policy")]["owner"] == "a-2"
    assert send[("site-b", "inventory")]["owner"] == ""
    assert "owner" in ok("status", "--config", site).stdout
