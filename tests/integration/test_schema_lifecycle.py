"""The schema's lifecycle: versioned upgrades, concurrent set-up, nothing lost.

Every test runs on SQLite and PostgreSQL (the ``db_url`` fixture).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, event, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient, RoutingQueueListener, RoutingQueueSubscriber
from lr_client.errors import SchemaError
from lr_client.listener import RoutingQueueMessage
from lr_client.records import EntryRef, ReplicationType, SnapshotStatus, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store.postgres import PostgresCore
from lr_client.store.schema import lifecycle
from lr_client.store.schema import tables as s
from lr_client.store.schema.lifecycle import SchemaState
from lr_client.store.snapshots.pool import pg_make_partition
from tests.conftest import PgSchema
from tests.kit.procs import lr_env
from tests.kit.sites import Sites, SiteSpec, wait_for, write_config


def _dialect_metadata(dialect: str) -> MetaData:
    """The declared schema as the dialect gets it (tables for one backend only left out)."""
    md = MetaData()
    for table in s.metadata.sorted_tables:
        if dialect in (table.info.get("view_on"), table.info.get("partitioned_on")):
            continue  # a view or partitioned there, made in SQL: compared on its own
        if table.info.get("only") in (None, dialect):
            copy = table.to_metadata(md)
            skip = {i.name for i in table.indexes if i.info.get("only") not in (None, dialect)}
            copy.indexes -= {i for i in copy.indexes if i.name in skip}
    return md


def _made_in_sql(name: str, dialect: str) -> bool:
    """A table the revisions make in SQL, not declared for ``dialect`` (nor compared):
    on PostgreSQL the send queue's and its slots', the partitioned snapshot and
    receive queues' and their partitions."""
    if name == lifecycle.VERSION_TABLE:
        return True
    if dialect != "postgresql":
        return False
    if s.made_in_sql(name) or name.startswith(
        (s.SNAPSYNC_PARTITION_PREFIX, s.RECV_PARTITION_PREFIX)
    ):
        return True
    table = s.metadata.tables.get(name)
    return table is not None and table.info.get("partitioned_on") == dialect


def _diff(conn: Connection) -> list[object]:
    dialect = conn.dialect.name
    ctx = MigrationContext.configure(
        conn,
        opts={
            "compare_type": True,
            "compare_server_default": True,
            "include_name": lambda name, kind, _parent: (
                not (kind == "table" and _made_in_sql(name, dialect))
            ),
        },
    )
    return list(compare_metadata(ctx, _dialect_metadata(conn.dialect.name)))


def _indexes(conn: Connection) -> dict[str, list[tuple[str, tuple[str, ...], bool]]]:
    insp = inspect(conn)
    return {
        t: sorted(
            (i["name"] or "", tuple(c or "" for c in i["column_names"]), bool(i["unique"]))
            for i in insp.get_indexes(t)
        )
        for t in insp.get_table_names()
        if not _made_in_sql(t, conn.dialect.name)  # not declared: SQL
    }


def test_upgrading_an_empty_database_gives_the_declared_schema(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        assert lifecycle.schema_status(engine).state is SchemaState.EMPTY
        before = lifecycle.upgrade_schema(engine)
        assert before.state is SchemaState.EMPTY
        assert before.pending[-1] == lifecycle.head_revision()
        with engine.connect() as conn:
            assert _diff(conn) == []
            names = set(inspect(conn).get_table_names())
            views = set(inspect(conn).get_view_names())
        expected = {t.name for t in _dialect_metadata(engine.dialect.name).sorted_tables}
        if engine.dialect.name == "postgresql":
            made = {n for n in names if _made_in_sql(n, "postgresql")} - {lifecycle.VERSION_TABLE}
            assert made >= {
                *s.SEQUENCER_TABLES,
                *s.SLOT_TABLES,
                "lrq_send_entries_s0",
                s.send_snapsync.name,
                s.SNAPSYNC_PARTITION_PREFIX + "0",
                s.recv_entries.name,
                *(f"{s.RECV_PARTITION_PREFIX}{n}" for n in range(4)),
            }
            names -= made
            assert views == {s.send_log_entries.name}
        else:
            assert views == set()
        assert names == expected | {lifecycle.VERSION_TABLE}
        assert lifecycle.schema_status(engine).state is SchemaState.CURRENT
    finally:
        engine.dispose()


def test_migrated_and_created_schemas_match_index_for_index(
    db_url: str, db_url_factory: Callable[..., str]
) -> None:
    migrated = create_engine(db_url)
    created = create_engine(db_url_factory("created", migrated=False))
    try:
        lifecycle.upgrade_schema(migrated)
        with created.begin() as conn:
            s.metadata.create_all(
                conn, tables=list(_dialect_metadata(conn.dialect.name).sorted_tables)
            )
        with migrated.connect() as a, created.connect() as b:
            assert _indexes(a) == _indexes(b)
            for table in inspect(b).get_table_names():
                cols_a = [
                    (c["name"], str(c["type"]), c["nullable"])
                    for c in inspect(a).get_columns(table)
                ]
                cols_b = [
                    (c["name"], str(c["type"]), c["nullable"])
                    for c in inspect(b).get_columns(table)
                ]
                assert cols_a == cols_b, table
    finally:
        migrated.dispose()
        created.dispose()


def test_schema_version_constant_is_the_head_revision() -> None:
    assert int(lifecycle.head_revision()) == s.SCHEMA_VERSION


def test_the_newest_revision_file_is_alembics_only_head() -> None:
    """The check of a current schema reads the head from the file names, not Alembic."""
    script = lifecycle._script()
    assert script.get_heads() == [lifecycle.head_revision()]
    revisions = [rev.revision for rev in script.walk_revisions()]
    assert sorted(revisions) == [f"{n:04d}" for n in range(1, len(revisions) + 1)]


def test_a_version_table_with_two_rows_is_refused_not_guessed(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        lifecycle.upgrade_schema(engine)
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {lifecycle.VERSION_TABLE} VALUES ('0003')"))
        with pytest.raises(SchemaError, match="holds"):
            lifecycle.schema_status(engine)
    finally:
        engine.dispose()


def test_opening_a_current_store_imports_no_alembic(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        lifecycle.upgrade_schema(engine)
    finally:
        engine.dispose()
    code = (
        "import sys; from lr_client.store import create_engine, open_store; "
        f"e = create_engine({db_url!r}); open_store(e).check_schema(); e.dispose(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=lr_env(), check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_concurrent_setup_from_threads_succeeds_once(db_url: str) -> None:
    engines = [create_engine(db_url) for _ in range(8)]
    barrier = threading.Barrier(len(engines))
    results: list[object] = []

    def setup(engine: Engine) -> None:
        barrier.wait()
        try:
            results.append(lifecycle.upgrade_schema(engine).state)
        except Exception as exc:  # collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=setup, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not [t for t in threads if t.is_alive()], "set-up deadlocked"
        assert not [r for r in results if isinstance(r, Exception)], results
        assert sorted(str(r) for r in results) == sorted(["empty"] + ["current"] * 7)
        assert lifecycle.schema_status(engines[0]).state is SchemaState.CURRENT
    finally:
        for e in engines:
            e.dispose()


def test_concurrent_init_db_processes_all_succeed(db_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, SiteSpec("site-a", db_url, destinations=[("site-b", 1)]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "lr_server.cli", "init-db", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=lr_env(),
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=180)[0].decode() for p in procs]
    failed = [f"exit {p.returncode}:\n{out}" for p, out in zip(procs, outputs, strict=True)]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n---\n".join(failed)
    engine = create_engine(db_url)
    try:
        assert lifecycle.schema_status(engine).state is SchemaState.CURRENT
        assert open_store(engine).sites.site_numbers(refresh=True).keys() == {"site-b"}
    finally:
        engine.dispose()


def test_a_failed_upgrade_leaves_the_previous_version(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(db_url)
    real = command.upgrade

    def upgrade_then_fail(cfg: object, revision: str) -> None:
        real(cfg, revision)  # type: ignore[arg-type]
        raise RuntimeError("power cut")

    monkeypatch.setattr(command, "upgrade", upgrade_then_fail)
    try:
        with pytest.raises(RuntimeError, match="power cut"):
            lifecycle.upgrade_schema(engine)
        assert lifecycle.schema_status(engine).state is SchemaState.EMPTY
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == []
        monkeypatch.setattr(command, "upgrade", real)
        lifecycle.upgrade_schema(engine)  # simply run again
        assert lifecycle.schema_status(engine).state is SchemaState.CURRENT
    finally:
        engine.dispose()


def test_a_database_of_a_newer_release_is_refused(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        lifecycle.upgrade_schema(engine)
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {lifecycle.VERSION_TABLE} SET version_num = 'ffff'"))
        status = lifecycle.schema_status(engine)
        assert status.state is SchemaState.AHEAD
        with pytest.raises(SchemaError, match="newer than this release"):
            open_store(engine).check_schema()
        with pytest.raises(SchemaError, match="newer than this release"):
            open_store(engine).create_schema()
        with engine.connect() as conn:
            assert (
                conn.execute(text(f"SELECT version_num FROM {lifecycle.VERSION_TABLE}")).scalar()
                == "ffff"
            )
    finally:
        engine.dispose()


def test_check_schema_names_the_command_that_upgrades(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with pytest.raises(SchemaError, match="lr init-db"):
            open_store(engine).check_schema()
    finally:
        engine.dispose()


def test_a_first_release_database_is_told_to_upgrade_then_gets_every_revision(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    try:
        make_legacy_v1(engine)
        store = open_store(engine)
        with pytest.raises(SchemaError, match=r"revision 0001, this release needs .*lr init-db"):
            store.check_schema()
        store.create_schema()
        store.check_schema()
        with engine.connect() as conn:
            insp = inspect(conn)
            tables = set(insp.get_table_names())
            ends = {i["name"] for i in insp.get_indexes("lrq_recv_entries")}
        assert {"lrq_trim_marks", "lrq_stream_stops", "lrq_sink_drops"} <= tables
        assert "lrq_recv_entries_ends" in ends
        with engine.connect() as conn:
            assert _diff(conn) == []
    finally:
        engine.dispose()


# -- an upgrade of a first-release database loses nothing ----------------------------------
def make_legacy_v1(engine: Engine) -> None:
    """A database as the first release created it: revision 0001, no revision table."""
    with engine.connect() as conn, conn.begin():
        cfg = lifecycle._config(conn)
        command.upgrade(cfg, lifecycle.LEGACY_REVISION)
        conn.execute(text(f"DROP TABLE {lifecycle.VERSION_TABLE}"))
        conn.execute(text("INSERT INTO lrq_meta (key, value) VALUES ('schema_version', '1')"))


def _populate_source(conn: Connection) -> None:
    """Site a as a running first-release server leaves it.

    Entries 1..10 of client ``policy`` to b and c; b acknowledged 1..4; c was
    dropped and its full sync (base 10) is READY but not shipped yet.
    """
    pg = conn.dialect.name == "postgresql"
    conn.execute(text("INSERT INTO lrq_sites (site_num, site_id) VALUES (1, 'b'), (2, 'c')"))
    for pos in range(1, 11):
        dests = "{1,2}" if pg else ",1,2,"
        conn.execute(
            text(
                "INSERT INTO lrq_send_log_entries (position, client_name, payload, dest_nums,"
                " created_at) VALUES (:p, 'policy', :payload, "
                + ("CAST(:d AS smallint[])" if pg else ":d")
                + ", :now)"
            ),
            # Written just before the upgrade: not over a retention age (b must not be
            # dropped before the upgraded server ships them).
            {"p": pos, "payload": f"e{pos}".encode(), "d": dests, "now": time.time()},
        )
        if not pg:  # c's tags were released by its drop; b's remain
            conn.execute(text("INSERT INTO lrq_send_tags VALUES (1, :p)"), {"p": pos})
    if pg:
        conn.execute(text("SELECT setval('lrq_send_log_entries_position_seq', 10)"))
    conn.execute(
        text(
            "INSERT INTO lrq_cursors VALUES"
            " ('b', 'policy', 4, 1.0, :f), ('c', 'policy', 0, 1.0, :t)"
        ),
        {"f": False, "t": True},
    )
    conn.execute(text("INSERT INTO lrq_drops VALUES ('c', 'policy', 1, 1.0, 'over max_entries')"))
    conn.execute(
        text(
            "INSERT INTO lrq_snapshots VALUES ('snap1', 'c', 'policy', 'ready', 10, 'dropped',"
            " 3, 3, 0, 1.0, 1.0)"
        )
    )
    for seq, payload in enumerate([b"s1", b"s2", b"s3"]):
        conn.execute(
            text(
                "INSERT INTO lrq_send_snapsync (snapshot_id, part, seq, type, payload)"
                " VALUES ('snap1', 0, :seq, 2, :payload)"
            ),
            {"seq": seq, "payload": payload},
        )
    conn.execute(
        text(
            "INSERT INTO lrq_send_snapsync (snapshot_id, part, seq, type, payload)"
            " VALUES ('snap1', -1, 0, 3, '3')".replace("'3')", ":end)")
        ),
        {"end": b"3"},
    )


def _populate_sink_b(conn: Connection) -> None:
    """Sink b received 1..4 from a; its subscriber delivered 1 and 2."""
    conn.execute(
        text("INSERT INTO lrq_queue_registry VALUES (1, 'LRQ_Recv_policy__a', 'policy', 'a', 1.0)")
    )
    for seq, pos in ((3, 3), (4, 4)):
        conn.execute(
            text("INSERT INTO lrq_recv_entries VALUES (:seq, 1, 1, :pos, '', 0, :payload, 1.0)"),
            {"seq": seq, "pos": pos, "payload": f"e{pos}".encode()},
        )
    if conn.dialect.name == "postgresql":  # numbered by its sequence, as the server's were
        conn.execute(text("SELECT setval('lrq_recv_entries_seq_seq', 4)"))
    conn.execute(text("INSERT INTO lrq_sink_progress VALUES ('a', 'policy', 4, 0, '', 0, 4, 1.0)"))
    conn.execute(
        text("INSERT INTO lrq_subscriber_state VALUES (1, '', :f, 2, '', 0.0)"), {"f": False}
    )


class Recorder(RoutingQueueListener):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.seen.append(f"start:{snapshot_id}")

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.seen += [m.payload.decode() for m in messages]
        return True

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.seen.append(f"end:{snapshot_id}")

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.seen += [m.payload.decode() for m in messages]
        return True


def test_an_upgrade_marks_what_trim_may_have_deleted_before_marks_existed(db_url: str) -> None:
    """Before revision 0002 trim kept no marks: the cursors stand in, never zero."""
    engine = create_engine(db_url)
    try:
        make_legacy_v1(engine)
        with engine.begin() as conn:
            _populate_source(conn)
        lifecycle.upgrade_schema(engine)
        with engine.connect() as conn:
            marks = conn.execute(
                text("SELECT dest_num, client_name, trimmed_through FROM lrq_trim_marks")
            ).all()
        assert sorted(tuple(m) for m in marks) == [(1, "policy", 4), (2, "policy", 0)]
    finally:
        engine.dispose()


@pytest.fixture
def empty_sites(tmp_path: Path, db_url_factory: Callable[..., str]) -> Iterator[Sites]:
    """In-process sites on empty databases of the backend."""
    sites = Sites(tmp_path, lambda name: db_url_factory(name, migrated=False))
    yield sites
    sites.close()


def test_upgrading_a_running_sites_databases_loses_nothing(empty_sites: Sites) -> None:
    sites = empty_sites
    engines = {site: create_engine(sites.url(site)) for site in ("a", "b", "c")}
    try:
        for engine in engines.values():
            make_legacy_v1(engine)
            assert lifecycle.schema_status(engine).current == lifecycle.LEGACY_REVISION
        with engines["a"].begin() as conn:
            _populate_source(conn)
        with engines["b"].begin() as conn:
            _populate_sink_b(conn)

        # Servers start on the old databases and upgrade them.
        sites.start("b", sources=["a"])
        sites.start("c", sources=["a"])
        sites.start("a", dests=["b", "c"], snapshot="app")
        for engine in engines.values():
            assert lifecycle.schema_status(engine).state is SchemaState.CURRENT

        client = RoutingQueueClient(engines["a"], "a", "policy")
        with Session(engines["a"]) as session, session.begin():
            client.transmit_log_entry_message(session, b"e11", ["b", "c"])
            client.transmit_log_entry_message(session, b"e12", ["b", "c"])

        listeners = {site: Recorder() for site in ("b", "c")}
        subscribers = {
            site: RoutingQueueSubscriber(engines[site], "policy", listeners[site], poll_interval=0)
            for site in ("b", "c")
        }
        want_b = [f"e{i}" for i in range(3, 13)]
        want_c = ["start:snap1", "s1", "s2", "s3", "end:snap1", "e11", "e12"]

        def delivered() -> bool:
            for sub in subscribers.values():
                sub.poll_once()
            return len(listeners["b"].seen) >= len(want_b) and len(listeners["c"].seen) >= len(
                want_c
            )

        wait_for(delivered, timeout=90)
        assert listeners["b"].seen == want_b
        assert listeners["c"].seen == want_c
        for sub in subscribers.values():
            sub.close()
    finally:
        for engine in engines.values():
            engine.dispose()


def test_revision_0004_keeps_stored_positions_and_refuses_old_transmitters(
    pg_schema: PgSchema,
) -> None:
    """A PostgreSQL queue of revision 0003 keeps every entry at its position.

    Entries 1..3 were written, 3 was trimmed: the next position is 4, never
    a reused one. A transmitter of the previous release (an INSERT into the
    old table) fails after the upgrade instead of writing out of order.
    """
    engine = pg_schema.engine()
    with engine.connect() as conn, conn.begin():
        command.upgrade(lifecycle._config(conn), "0003")
        conn.execute(text("INSERT INTO lrq_sites (site_num, site_id) VALUES (1, 'b')"))
        for i in (1, 2, 3):
            conn.execute(
                text(
                    "INSERT INTO lrq_send_log_entries (client_name, payload, dest_nums,"
                    " created_at) VALUES ('policy', :p, '{1}', 1.0)"
                ),
                {"p": b"old%d" % i},
            )
        conn.execute(text("DELETE FROM lrq_send_log_entries WHERE position = 3"))
    store = open_store(engine)
    with pytest.raises(SchemaError, match="revision 0003"):
        store.check_schema()
    store.create_schema()
    read = store.shipping.read_log_entries("b", "policy", 0, 10)
    assert [(e.position, e.payload) for e in read] == [(1, b"old1"), (2, b"old2")]
    assert store.send.head_position() == 3
    client = RoutingQueueClient(store, "a", "policy")
    with engine.begin() as conn:
        ref = client.transmit_log_entry_message(conn, b"new", ["b"])
    assert client.positions_of([ref]) == [4]
    assert [e.payload for e in store.shipping.read_log_entries("b", "policy", 2, 10)] == [b"new"]
    with pytest.raises(DBAPIError, match="lrq_send_log_entries"), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO lrq_send_log_entries (client_name, payload, dest_nums, created_at)"
                " VALUES ('policy', 'x', '{1}', 1.0) RETURNING position"
            )
        )
    assert [e.payload for e in store.shipping.read_log_entries("b", "policy", 0, 10)] == [
        b"old1",
        b"old2",
        b"new",
    ]


class _BaseRecorder(RoutingQueueListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, int | None]] = []

    def on_full_sync_start(
        self, session: Session, source_id: str, snapshot_id: str, base_position: int | None = None
    ) -> None:
        self.events.append(("start", base_position))

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.events.append(("rows", len(messages)))
        return True

    def on_full_sync_end(
        self, session: Session, source_id: str, snapshot_id: str, base_position: int | None = None
    ) -> None:
        self.events.append(("end", base_position))

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def test_revision_0005_keeps_queued_snapshot_entries_without_a_base(db_url: str) -> None:
    """A snapshot queued at a sink of revision 0004 is delivered after the upgrade, base unknown."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0004")
            conn.execute(
                text(
                    "INSERT INTO lrq_queue_registry (queue_name, client_name, source_id,"
                    " created_at) VALUES ('LRQ_Recv_policy__a', 'policy', 'a', 1.0)"
                )
            )
            for pos, kind in ((1, 2), (2, 2), (3, 3)):  # two snapshot entries, the end
                conn.execute(
                    text(
                        "INSERT INTO lrq_recv_entries (queue_id, type, source_position,"
                        " snapshot_id, snapshot_count, payload, received_at)"
                        " VALUES (1, :t, :p, 's1', 0, :b, 1.0)"
                    ),
                    {"t": kind, "p": pos, "b": b"x"},
                )
        store = open_store(engine)
        assert store.create_schema().pending[0] == "0005"
        listener = _BaseRecorder()
        with RoutingQueueSubscriber(store, "policy", listener) as sub:
            assert sub.poll_once() == 2
        assert listener.events == [("start", None), ("rows", 2), ("end", None)]
    finally:
        engine.dispose()


def test_revision_0006_moves_the_send_queue_into_slots_keeping_every_position(
    pg_schema: PgSchema,
) -> None:
    """A PostgreSQL send queue of revision 0005 keeps its entries and positions in slot 0.

    Three transactions were sequenced before the upgrade (at positions 10..12,
    as a queue trimmed below them would have); a fourth committed without being
    sequenced and gets 13 after it; new transmissions follow; the old slot is
    retired once acknowledged.
    """
    engine = pg_schema.engine()
    insert = text(
        "INSERT INTO lrq_send_entries (client_name, payload, dest_nums, created_at)"
        " VALUES ('policy', :p, '{1}', 1.0) RETURNING CAST(CAST(txid AS text) AS bigint)"
    )
    with engine.connect() as conn, conn.begin():
        command.upgrade(lifecycle._config(conn), "0005")
        conn.execute(text("INSERT INTO lrq_sites (site_num, site_id) VALUES (1, 'b')"))
    txids = []
    for i in (1, 2, 3):
        with engine.begin() as conn:
            txids.append(conn.execute(insert, {"p": b"old%d" % i}).scalar_one())
    with engine.begin() as conn:  # what a tick of revision 0005 wrote for them
        for k, txid in enumerate(txids):
            params = {"t": str(txid), "pos": 10 + k}
            conn.execute(
                text(
                    "INSERT INTO lrq_send_blocks (txid, base, size, tick_id)"
                    " VALUES (CAST(:t AS xid8), :pos - 1, 1, 2)"
                ),
                params,
            )
            conn.execute(
                text(
                    "INSERT INTO lrq_send_positions (position, txid, ord, client_name, dest_nums,"
                    " created_at) VALUES (:pos, CAST(:t AS xid8), 1, 'policy', '{1}', 1.0)"
                ),
                params,
            )
        conn.execute(
            text(
                "INSERT INTO lrq_send_ticks (tick_id, snap, head, ticked_at)"
                " VALUES (2, pg_current_snapshot(), 12, 2.0)"
            )
        )
    with engine.begin() as conn:  # committed, not sequenced before the upgrade
        late = EntryRef(conn.execute(insert, {"p": b"late"}).scalar_one(), 1)
    store = open_store(engine)
    assert isinstance(store.core, PostgresCore)
    assert store.create_schema().pending[0] == "0006"
    client = RoutingQueueClient(store, "a", "policy")
    assert client.positions_of([late]) == [13]
    with engine.begin() as conn:
        ref = client.transmit_log_entry_message(conn, b"new", ["b"])
    assert client.positions_of([ref]) == [14]
    read = store.shipping.read_log_entries("b", "policy", 0, 10)
    assert [(e.position, e.payload) for e in read] == [
        (10, b"old1"),
        (11, b"old2"),
        (12, b"old3"),
        (13, b"late"),
        (14, b"new"),
    ]
    assert {x.slot for x in store.retention.send_slots() if x.entries} == {0}
    store.shipping.set_cursor("b", "policy", 14)
    store.retention.rotation_period = 0.0
    assert store.retention.trim() == 5
    assert store.shipping.read_client_log("policy", 0, 10) == []
    assert store.retention.trimmed_through("b", "policy") == 14


def _snapshot_row(conn: Connection, sid: str, dest: str, status: str, created: float) -> None:
    conn.execute(
        text(
            "INSERT INTO lrq_snapshots (snapshot_id, destination, client_name, status,"
            " base_position, reason, rows_written, entry_count, shipped_position, created_at,"
            " updated_at) VALUES (:sid, :dest, 'policy', :status, 0, '', 0, NULL, 0, :t, :t)"
        ),
        {"sid": sid, "dest": dest, "status": status, "t": created},
    )


def _snapsync_rows(conn: Connection, sid: str, payloads: Sequence[bytes]) -> None:
    for seq, payload in enumerate(payloads):
        conn.execute(
            text(
                "INSERT INTO lrq_send_snapsync (snapshot_id, part, seq, type, payload)"
                " VALUES (:sid, 0, :seq, 2, :payload)"
            ),
            {"sid": sid, "seq": seq, "payload": payload},
        )


def test_revision_0007_gives_a_running_snapshot_a_slot_and_its_entries_ship_once(
    db_url: str,
) -> None:
    """A source of revision 0005 mid-snapshot: the provider goes on after the upgrade.

    The running snapshot's entries move to its slot, the provider writes the
    rest and the end marker, and a read ships each entry once, in order. A
    finished snapshot's leftover entries are gone once trim ran.
    """
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0005")
            _snapshot_row(conn, "done", "c", "completed", 1.0)
            _snapshot_row(conn, "run", "b", "running", 2.0)
            _snapshot_row(conn, "asked", "d", "requested", 3.0)
            _snapsync_rows(conn, "done", [b"left over"])
            _snapsync_rows(conn, "run", [b"a", b"b"])
        store = open_store(engine)
        with pytest.raises(SchemaError, match="revision 0005"):
            store.check_schema()
        assert "0007" in store.create_schema().pending
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT snapshot_id, snap_slot FROM lrq_snapshots")).all()
        slots = {r[0]: r[1] for r in rows}
        assert slots == {"done": None, "run": 0, "asked": None}
        with store.write() as conn:  # the provider goes on where it was
            store.snapshot_entries.write_snapshot_entries(conn, "run", 0, [b"c"], first_seq=2)
        assert store.snapshot_entries.finish_snapshot("run") == 3
        entries = store.snapshot_entries.read_snapshot_entries("run", 0, 100)
        assert [e.payload for e in entries] == [b"a", b"b", b"c", b"3"]
        assert [e.position for e in entries] == [1, 2, 3, 4]
        assert store.snapshot_entries.read_snapshot_entries("run", 4, 100) == []
        store.retention.trim()
        assert store.snapshot_entries.count_snapshot_entries("done") == 0
        assert store.snapshots.start_snapshot("asked") is not None  # the next free slot
        with engine.connect() as conn:
            assert (
                conn.execute(
                    text("SELECT snap_slot FROM lrq_snapshots WHERE snapshot_id = 'asked'")
                ).scalar()
                == 1
            )
    finally:
        engine.dispose()


def test_revision_0007_partitions_the_snapshot_queue_and_refuses_old_writers(
    pg_schema: PgSchema,
) -> None:
    """PostgreSQL: positions go on above the stored ones; a writer giving no slot fails."""
    engine = pg_schema.engine()
    with engine.connect() as conn, conn.begin():
        command.upgrade(lifecycle._config(conn), "0005")
        _snapshot_row(conn, "run", "b", "running", 1.0)
        _snapsync_rows(conn, "run", [b"a", b"b"])
    store = open_store(engine)
    store.create_schema()
    with engine.connect() as conn:
        kind = conn.execute(
            text("SELECT relkind FROM pg_class WHERE oid = CAST('lrq_send_snapsync' AS regclass)")
        ).scalar()
        found = conn.execute(
            text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = CAST('lrq_send_snapsync' AS regclass)"
            )
        ).all()
        keys = {r[0]: r[1] for r in found}
        stored = conn.execute(
            text("SELECT max(position) FROM lrq_send_snapsync_p0 WHERE snapshot_id = 'run'")
        ).scalar()
    assert kind == "p"
    assert keys == {
        "lrq_send_snapsync_pkey": 'PRIMARY KEY ("position", snap_slot)',
        "lrq_send_snapsync_key": "UNIQUE (snapshot_id, part, seq, snap_slot)",
    }
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, "run", 1, [b"c"])
    with engine.connect() as conn:
        new = conn.execute(
            text("SELECT position FROM lrq_send_snapsync WHERE snapshot_id = 'run' AND part = 1")
        ).scalar()
    assert new > stored
    with pytest.raises(DBAPIError, match="snap_slot"), engine.begin() as conn:
        _snapsync_rows(conn, "run", [b"old writer"])


def test_revision_0008_delivers_what_a_0005_sink_had_queued_once(db_url: str) -> None:
    """Entries queued at a sink of revision 0005 are delivered once after the upgrade.

    Queue 1 (source a) delivered positions 1 and 2 (deleted then) and holds 3
    and 4; queue 2 (source b) delivered everything; queue 3 (source c) has no
    state row yet. New entries take sequence numbers above the stored ones.
    """
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0005")
            for qid, source in ((1, "a"), (2, "b"), (3, "c")):
                conn.execute(
                    text(
                        "INSERT INTO lrq_queue_registry (queue_id, queue_name, client_name,"
                        " source_id, created_at) VALUES (:q, :n, 'policy', :s, 1.0)"
                    ),
                    {"q": qid, "n": f"LRQ_Recv_policy__{source}", "s": source},
                )
            for qid, pos in ((1, 1), (1, 2), (2, 1), (1, 3), (1, 4), (3, 1)):
                conn.execute(
                    text(
                        "INSERT INTO lrq_recv_entries (queue_id, type, source_position,"
                        " snapshot_id, snapshot_count, payload, received_at)"
                        " VALUES (:q, 1, :p, '', 0, :b, 1.0)"
                    ),
                    {"q": qid, "p": pos, "b": f"{qid}:{pos}".encode()},
                )
            conn.execute(text("DELETE FROM lrq_recv_entries WHERE seq IN (1, 2, 3)"))  # delivered
            for source, pos in (("a", 4), ("b", 1), ("c", 1)):
                conn.execute(
                    text(
                        "INSERT INTO lrq_sink_progress VALUES (:s, 'policy', :p, 0, '', 0, :p, 1.0)"
                    ),
                    {"s": source, "p": pos},
                )
            conn.execute(
                text(
                    "INSERT INTO lrq_subscriber_state VALUES"
                    " (1, '', :f, 2, '', 0.0), (2, '', :f, 1, '', 0.0)"
                ),
                {"f": False},
            )
        store = open_store(engine)
        assert "0008" in store.create_schema().pending
        with store.read() as conn:
            assert [store.queues.load_state(conn, q).delivered_seq for q in (1, 2, 3)] == [3, 0, 0]
        assert store.inspection.queue_depths() == {1: 2, 3: 1}
        store.recv.apply_log_batch(
            "a", "policy", [WireEntry(5, ReplicationType.LOG_ENTRY_SYNC, b"1:5")]
        )
        with store.read() as conn:
            seqs = [e.seq for e in store.queues.read_queue(conn, 1, 10)]
        assert seqs[:2] == [4, 5] and seqs[2] > 6  # above every stored number
        listener = Recorder()
        with RoutingQueueSubscriber(store, "policy", listener) as sub:
            assert sub.poll_once() == 4
            assert sub.poll_once() == 0
        assert sorted(listener.seen) == ["1:3", "1:4", "1:5", "3:1"]
        assert store.inspection.queue_depths() == {}
        if store.dialect == "postgresql":
            with engine.connect() as conn:
                kinds = conn.execute(
                    text(
                        "SELECT relkind FROM pg_class WHERE relname = 'lrq_recv_entries'"
                        " AND relnamespace = CAST(current_schema() AS regnamespace)"
                    )
                ).scalar()
            assert kinds == "p"  # partitioned
    finally:
        engine.dispose()


def test_revision_0009_gives_each_snapshot_in_flight_its_destination_view(db_url: str) -> None:
    """A source of revision 0008 mid-snapshot: each snapshot goes on for its destination.

    ``ship`` is READY and half shipped to b, ``run`` is RUNNING for c, ``done``
    completed for d. After the upgrade each has one destination view with its
    status and shipped position; b ships the rest and completes, which
    releases the entries; a destination whose cursor is at ``run``'s base
    joins it, and both read its entries.
    """
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0008")
            rows = (
                ("ship", "b", "ready", 2, 1, 0, 1.0),
                ("run", "c", "running", None, 0, 1, 2.0),
                ("done", "d", "completed", 1, 1, None, 3.0),
            )
            for sid, dest, status, count, shipped, slot, created in rows:
                conn.execute(
                    text(
                        "INSERT INTO lrq_snapshots (snapshot_id, destination, client_name, status,"
                        " base_position, reason, rows_written, entry_count, shipped_position,"
                        " created_at, updated_at, snap_slot) VALUES (:sid, :dest, 'policy',"
                        " :status, 0, 'why', 0, :count, :shipped, :t, :t, :slot)"
                    ),
                    {
                        "sid": sid,
                        "dest": dest,
                        "status": status,
                        "count": count,
                        "shipped": shipped,
                        "t": created,
                        "slot": slot,
                    },
                )
            pg = conn.dialect.name == "postgresql"
            if pg:
                pg_make_partition(conn, 1)
            slot_col = ", snap_slot" if pg else ""
            slot_val = ", 0" if pg else ""
            for part, seq, kind, payload in ((0, 0, 2, b"a"), (0, 1, 2, b"b"), (-1, 0, 3, b"2")):
                conn.execute(
                    text(
                        f"INSERT INTO lrq_send_snapsync (snapshot_id, part, seq, type, payload"
                        f"{slot_col}) VALUES ('ship', :part, :seq, :kind, :payload{slot_val})"
                    ),
                    {"part": part, "seq": seq, "kind": kind, "payload": payload},
                )
        store = open_store(engine)
        with pytest.raises(SchemaError, match="revision 0008"):
            store.check_schema()
        assert "0009" in store.create_schema().pending
        views = {v.snapshot_id: v for v in store.snapshots.list_snapshots(client_name="policy")}
        assert {
            k: (v.destination, v.status.value, v.shipped_position) for k, v in views.items()
        } == {
            "ship": ("b", "ready", 1),
            "run": ("c", "running", 0),
            "done": ("d", "completed", 1),
        }
        assert views["ship"].reason == "why" and views["ship"].destinations == ("b",)
        # b ships the rest of its snapshot where it was, and completes it: released.
        assert [e.payload for e in store.snapshot_entries.read_snapshot_entries("ship", 1, 10)] == [
            b"b",
            b"2",
        ]
        assert store.snapshots.complete_snapshot("ship", "b")
        with engine.connect() as conn:
            left = conn.execute(
                text("SELECT count(*) FROM lrq_send_snapsync WHERE snapshot_id = 'ship'")
            ).scalar_one()
        assert left == 0
        # The running one is shared from now on: e (cursor at its base) joins it.
        store.shipping.set_cursor("e", "policy", 0)
        assert store.snapshots.request_snapshot(None, "e", "policy") == "run"
        with store.write() as conn:
            store.snapshot_entries.write_snapshot_entries(conn, "run", 0, [b"x"])
        assert store.snapshot_entries.finish_snapshot("run") == 1
        assert [e.payload for e in store.snapshot_entries.read_snapshot_entries("run", 0, 10)] == [
            b"x",
            b"1",
        ]
        assert {store.snapshots.get_snapshot("run", d).status for d in "ce"} == {
            SnapshotStatus.READY
        }  # type: ignore[union-attr]
    finally:
        engine.dispose()


def test_revision_0010_adds_members_and_leases_keeping_the_cursors(db_url: str) -> None:
    """A 0008 database gains the member and lease tables; its cursors stay as they were."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0008")
            conn.execute(
                text(
                    "INSERT INTO lrq_cursors (destination, client_name, position,"
                    " needs_snapshot, acked_at) VALUES ('b', 'policy', 7, :f, 1.0)"
                ),
                {"f": False},
            )
            assert not inspect(conn).has_table("lrq_members")
        store = open_store(engine)
        assert "0010" in store.create_schema().pending
        store.check_schema()
        assert store.shipping.get_cursor("b", "policy").position == 7
        store.members.join_member("m1", "i1", "127.0.0.1:1", 1)
        fence = store.members.acquire_unit("stream/b/policy", "m1", "i1", 5.0)
        assert fence is not None and fence.token == 1
        store.shipping.set_cursor("b", "policy", 8, fence=fence)
        assert store.shipping.get_cursor("b", "policy").position == 8
    finally:
        engine.dispose()


def test_revision_0011_keeps_queued_entries_unkeyed_and_adds_keys(db_url: str) -> None:
    """Entries queued before revision 0011 have no partition key: delivered by partition
    they keep their total order; entries after it carry their keys end to end."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0008")
            conn.execute(
                text(
                    "INSERT INTO lrq_queue_registry (queue_id, queue_name, client_name,"
                    " source_id, created_at) VALUES (1, 'LRQ_Recv_policy__a', 'policy', 'a', 1.0)"
                )
            )
            for pos in (1, 2, 3):
                conn.execute(
                    text(
                        "INSERT INTO lrq_recv_entries (queue_id, type, source_position,"
                        " snapshot_id, snapshot_count, payload, received_at)"
                        " VALUES (1, 1, :p, '', 0, :b, 1.0)"
                    ),
                    {"p": pos, "b": b"a:%d" % pos},
                )
            conn.execute(
                text("INSERT INTO lrq_sink_progress VALUES ('a', 'policy', 3, 0, '', 0, 3, 1.0)")
            )
        store = open_store(engine)
        assert "0011" in store.create_schema().pending
        with store.read() as conn:
            assert [e.key for e in store.queues.read_queue(conn, 1, 10)] == [None, None, None]
        keyed = [
            WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"a:%d" % p, key=b"k") for p in (4, 5)
        ]
        store.recv.apply_log_batch("a", "policy", keyed)
        listener = Recorder()
        with RoutingQueueSubscriber(store, "policy", listener, partitions=4) as sub:
            assert sub.poll_once() == 5
        assert listener.seen == ["a:1", "a:2", "a:3", "a:4", "a:5"]
        with store.read() as conn:
            assert store.queues.load_state(conn, 1).partitions == 4
        nums = store.sites.register_sites(["b"])
        with store.write() as conn:
            store.send.append_log_entries(
                conn, "policy", [(b"x", [nums["b"]], b"key-x"), (b"y", [nums["b"]])]
            )
        found = store.shipping.read_client_log("policy", 0, 10)
        assert [(e.payload, e.key) for e in found] == [(b"x", b"key-x"), (b"y", None)]
    finally:
        engine.dispose()


def test_revision_0012_keeps_a_sinks_progress_and_adds_lanes(db_url: str) -> None:
    """A sink upgraded to 0012 keeps what it received (its position skips repeats)
    and takes batches of lanes."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0011")
            conn.execute(
                text("INSERT INTO lrq_sink_progress VALUES ('a', 'policy', 3, 0, '', 0, 3, 1.0)")
            )
        store = open_store(engine)
        assert "0012" in store.create_schema().pending
        assert store.recv.sink_progress("a", "policy").last_position == 3
        entries = [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"%d" % p) for p in (2, 3, 4)]
        assert store.recv.apply_lane_batch("a", "policy", 1, 2, entries, 3, 3) == (True, 4)
        assert [p for p, _, _ in _queued_positions(store)] == [4]
    finally:
        engine.dispose()


def _queued_positions(store: SQLAlchemyQueueStore) -> list[tuple[int, bytes, str]]:
    (queue,) = store.queues.list_queues("policy")
    with store.read() as conn:
        got = store.queues.read_queue(conn, queue.queue_id, 100)
    return [(e.source_position, e.payload, e.snapshot_id) for e in got]


def test_revision_0013_keeps_a_sinks_progress_and_adds_cascade_tables(db_url: str) -> None:
    """A site upgraded to 0013 keeps what it received and gets the (empty) cascade tables."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0012")
            conn.execute(
                text("INSERT INTO lrq_sink_progress VALUES ('a', 'policy', 3, 0, '', 0, 3, 1.0)")
            )
        store = open_store(engine)
        assert "0013" in store.create_schema().pending
        assert store.recv.sink_progress("a", "policy").last_position == 3
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM lrq_cascade")).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM lrq_cascade_children")).scalar() == 0
    finally:
        engine.dispose()


class _HeadersRecorder(_BaseRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bytes, dict[str, str]]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.seen += [(m.payload, dict(m.headers)) for m in messages]
        return True


def test_revision_0016_adds_headers_keeping_every_entry(db_url: str) -> None:
    """Entries queued at revision 0013, sent and received, keep their rows and have no
    headers after the upgrade; new ones carry theirs."""
    engine = create_engine(db_url)
    postgres = engine.dialect.name == "postgresql"
    send = "lrq_send_entries" if postgres else "lrq_send_log_entries"
    dests = "'{1}'" if postgres else "',1,'"
    try:
        with engine.connect() as conn, conn.begin():
            command.upgrade(lifecycle._config(conn), "0013")
        # What a release of revision 0013 wrote, in a transaction of its own as its
        # transmitters did. Not in the migration's: PostgreSQL's first tick took its
        # snapshot there (revision 0004), and a snapshot leaves out its own
        # transaction, so the sequencer would take these entries for already seen
        # whenever another transaction of the server ended during the migration.
        with engine.connect() as conn, conn.begin():
            conn.execute(text("INSERT INTO lrq_sites (site_id) VALUES ('site-b')"))
            for payload in (b"old-1", b"old-2"):
                conn.execute(
                    text(
                        f"INSERT INTO {send} (client_name, payload, dest_nums, created_at)"
                        f" VALUES ('policy', :p, {dests}, :t)"
                    ),
                    {"p": payload, "t": time.time()},
                )
            conn.execute(
                text(
                    "INSERT INTO lrq_queue_registry (queue_name, client_name, source_id,"
                    " created_at) VALUES ('LRQ_Recv_policy__a', 'policy', 'a', 1.0)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO lrq_recv_entries (queue_id, type, source_position,"
                    " snapshot_id, snapshot_count, payload, received_at)"
                    " VALUES (1, 1, 1, '', 0, :b, 1.0)"
                ),
                {"b": b"got"},
            )
        store = open_store(engine)
        assert "0016" in store.create_schema().pending
        client = RoutingQueueClient(store, "site-a", "policy")
        with Session(engine) as session, session.begin():
            client.transmit_log_entry_message(session, b"new", ["site-b"], headers={"a": "1"})
        found = store.shipping.read_client_log("policy", 0, 10)
        assert [(e.payload, e.headers) for e in found] == [
            (b"old-1", None),
            (b"old-2", None),
            (b"new", b'{"a":"1"}'),
        ]
        store.recv.apply_log_batch(
            "a",
            "policy",
            [WireEntry(2, ReplicationType.LOG_ENTRY_SYNC, b"got-2", headers=b'{"b":"2"}')],
        )
        listener = _HeadersRecorder()
        with RoutingQueueSubscriber(store, "policy", listener) as sub:
            assert sub.poll_once() == 2
        assert listener.seen == [(b"got", {}), (b"got-2", {"b": "2"})]
    finally:
        engine.dispose()


def test_revision_0018_keeps_an_open_transactions_slot_and_plans_the_slot_once(
    pg_schema: PgSchema,
) -> None:
    """``lrq_send_slot`` becomes PL/pgSQL (a SQL function reading a table is planned
    again at every transmit; PL/pgSQL keeps its plan for the session) with the same
    results: a transaction that took its slot before the upgrade keeps it after a
    rotation, and a rolled back savepoint forgets the slot it took."""
    engine = pg_schema.engine()
    with engine.connect() as conn, conn.begin():
        command.upgrade(lifecycle._config(conn), "0017")
        conn.execute(text("INSERT INTO lrq_sites (site_num, site_id) VALUES (1, 'b')"))
    insert = text(
        "INSERT INTO lrq_send_entries (client_name, payload, dest_nums, created_at)"
        " VALUES ('policy', :p, '{1}', 1.0) RETURNING slot"
    )

    def make_current(slot: int) -> None:  # what a rotation writes
        with engine.begin() as conn:
            conn.execute(text("UPDATE lrq_send_state SET cur_slot = :s"), {"s": slot})

    def language() -> str:
        with engine.connect() as conn:
            return str(
                conn.execute(
                    text(
                        "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
                        " WHERE p.oid = CAST('lrq_send_slot' AS regproc)"
                    )
                ).scalar_one()
            )

    assert language() == "sql"
    with engine.connect() as app:
        app.begin()
        assert app.execute(insert, {"p": b"before"}).scalar_one() == 0
        assert open_store(engine).create_schema().pending == ("0018", "0019", "0020")
        assert language() == "plpgsql"
        make_current(1)
        assert app.execute(insert, {"p": b"after"}).scalar_one() == 0
        app.commit()
        outer = app.begin()
        savepoint = app.begin_nested()
        assert app.execute(insert, {"p": b"undone"}).scalar_one() == 1
        savepoint.rollback()
        assert outer.is_active
        make_current(2)
        assert app.execute(insert, {"p": b"kept"}).scalar_one() == 2
        make_current(3)
        assert app.execute(insert, {"p": b"kept too"}).scalar_one() == 2
        outer.commit()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT slot, payload FROM lrq_send_entries ORDER BY txid, ord"))
        assert [(r.slot, bytes(r.payload)) for r in rows] == [
            (0, b"before"),
            (0, b"after"),
            (2, b"kept"),
            (2, b"kept too"),
        ]


def test_revision_0019_ticks_in_one_statement_and_sequences_what_committed_before(
    pg_schema: PgSchema,
) -> None:
    """The sequencer's tick becomes one call of ``lrq_send_tick`` (five round trips
    before): entries committed under revision 0018 get their positions from it in
    commit order, the tick after them finds nothing, and a tick is one statement."""
    engine = pg_schema.engine()
    with engine.connect() as conn, conn.begin():
        command.upgrade(lifecycle._config(conn), "0018")
        conn.execute(text("INSERT INTO lrq_sites (site_num, site_id) VALUES (1, 'b')"))
    insert = text(
        "INSERT INTO lrq_send_entries (client_name, payload, dest_nums, created_at)"
        " VALUES ('policy', :p, '{1}', 1.0)"
    )
    for payload in (b"first", b"second"):
        with engine.begin() as conn:
            conn.execute(insert, {"p": payload})
    store = open_store(engine)
    assert store.create_schema().pending == ("0019", "0020")
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    core = store.core
    assert isinstance(core, PostgresCore)
    with engine.connect() as conn:
        core._tick_lock(conn)  # the lock's key, read once per store
    event.listen(engine, "before_cursor_execute", count)
    try:
        assert store.send.sequence() == 2
        assert store.send.sequence() == 0
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 2 and all("lrq_send_tick" in s for s in statements)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT position, payload FROM lrq_send_log_entries ORDER BY position")
        ).all()
    assert [(r.position, bytes(r.payload)) for r in rows] == [(1, b"first"), (2, b"second")]
