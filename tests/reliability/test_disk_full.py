"""Disks that fill: a site's database runs out of space under traffic, then space returns.

* The application's transmit into a full store fails with the store's typed
  error (:class:`~lr_client.errors.StoreUnavailableError`, the database's
  message: "database or disk is full", PostgreSQL's SQLSTATE 53100) and
  writes nothing (SQLite via ``PRAGMA max_page_count``, in-process).
* A sink whose database fills (SQLite on a small ``tmpfs``; PostgreSQL: the
  sink's database in a tablespace on one) rejects the batches: its
  ``lr server`` keeps running without spinning, counts the rejections in
  ``lr_errors{kind="StoreUnavailableError"}``, and the source's session shows
  the error in ``lr status``. A source whose database fills (PostgreSQL) stops
  taking transmits with that typed error while its server keeps running.
* Once the filesystem grows (``mount -o remount,size=...``) everything resumes:
  the verifier finds nothing lost, duplicated or out of order.

Mounting needs root; without it these tests skip (CI: fail, see tests/kit/guards.py).
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.errors import StoreUnavailableError
from lr_client.store import create_engine, open_store
from lr_client.store.schema import tables as lrq
from tests.kit.guards import need
from tests.kit.pgcluster import PgCluster, pg_bindir
from tests.kit.procs import LrServer
from tests.kit.scrape import metric_sum
from tests.kit.sites import free_port
from tests.kit.smallfs import SmallFs, mount_allowed, small_fs
from tests.kit.traffic import SourceApp
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import Deployment

pytestmark = pytest.mark.slow

FULL = ("database or disk is full", "No space left on device", "could not extend file")


def is_full(text: str) -> bool:
    return any(f in text for f in FULL)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- transmit -----------------------------------------------------------------------------
def test_transmit_into_a_full_sqlite_store_raises_the_typed_error_and_writes_nothing(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'a.db'}")
    limit: list[int] = [1 << 30]

    @event.listens_for(engine, "connect")
    def _cap(dbapi: object, _record: object) -> None:
        dbapi.execute(f"PRAGMA max_page_count = {limit[0]}")  # type: ignore[attr-defined]

    store = open_store(engine)
    store.create_schema()
    api = RoutingQueueClient(store, "a", "policy")
    api.register_destinations(["b"])
    with engine.connect() as conn:
        pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
    limit[0] = pages + 8  # a few pages left: the database fills after a few transmits
    engine.dispose()

    def count() -> int:
        with engine.connect() as conn:
            rows = conn.execute(select(func.count()).select_from(lrq.send_log_entries))
            return int(rows.scalar_one())

    committed = 0
    with pytest.raises(StoreUnavailableError, match="full"):
        for _ in range(1000):
            with Session(engine) as session, session.begin():
                api.transmit_log_entry_message(session, b"x" * 3000, ["b"])
            committed += 1
    assert 0 < committed < 1000
    assert count() == committed  # the failed transmit's transaction wrote nothing
    with pytest.raises(StoreUnavailableError), Session(engine) as session, session.begin():
        api.transmit_log_entry_message(session, b"x" * 3000, ["b"])
    assert count() == committed
    limit[0] = 1 << 30  # space returns (new connections)
    engine.dispose()
    with Session(engine) as session, session.begin():
        ref = api.transmit_log_entry_message(session, b"x" * 3000, ["b"])
    assert count() == committed + 1 and ref.position == committed + 1
    engine.dispose()


# -- servers ------------------------------------------------------------------------------
def with_metrics(dep: Deployment, site: str) -> int:
    """Serve ``site``'s metrics on a port of its own; the port."""
    port = free_port()
    dep.servers[site] = LrServer(dep.configs[site], args=["--metrics-port", str(port)], name=site)
    return port


def session_error(dep: Deployment) -> str:
    rows = open_store(dep.engine("a")).inspection.list_session_status()
    return " ".join(str(r["last_error"]) for r in rows if r["destination"] == "b")


def fill_then_grow(dep: Deployment, source: SourceApp, fs: SmallFs, full_site: str) -> None:
    """Traffic until ``full_site``'s database is full; check how the servers wait; grow."""
    metrics = with_metrics(dep, full_site)
    dep.start()
    source.start()
    server = dep.servers[full_site]
    assert server.proc is not None
    if full_site == "a":
        wait_for(
            lambda: any(is_full(e) for e in source.errors),
            scaled(60),
            0.1,
            what="a transmit refused: the source's database is full",
            detail=lambda: f"{source.errors[-3:]}\n{dep.logs()}",
        )
        # The transmits fail with the store's typed error; the application's own statements
        # in the same transactions (its rel_sent row) with the driver's.
        assert all(is_full(e) for e in source.errors), source.errors[:3]
        wait_for(
            lambda: any(e.startswith("StoreUnavailableError") for e in source.errors),
            scaled(60),
            0.1,
            what="a transmit refused with StoreUnavailableError",
            detail=lambda: f"{source.errors[-3:]}",
        )

        # lr_errors tells nothing of the full disk here: the source's server writes little
        # (positions of what committed, a slot rotation now and then), and what it counts
        # may be only its session's first attempts, made before b listened. Settled when it
        # shipped every committed entry, or when its tick found no room for their positions
        # and its session counts the store's error.
        def settled() -> str | None:
            if (metric_sum(metrics, "lr_errors_total", kind="StoreUnavailableError") or 0) > 0:
                return "sequencing refused"
            return "all shipped" if dep.verify(source).lost == 0 else None

        state = wait_for(
            settled,
            scaled(60),
            0.25,
            what="the source's server shipping what committed, or counting the store's error",
            detail=dep.logs,
        )
        print(f"a full: {state}")
    else:
        wait_for(
            lambda: is_full(session_error(dep)),
            scaled(60),
            0.1,
            what="the source's session showing the sink's full database",
            detail=lambda: f"{session_error(dep)}\n{dep.logs()}",
        )
        wait_for(
            lambda: (metric_sum(metrics, "lr_errors_total", kind="StoreUnavailableError") or 0) > 0,
            scaled(30),
            0.2,
            what="the sink's receiver counting a rejection",
        )
    # Full: the server runs on, retrying at its backoff, not in a busy loop.
    before, cpu = fs.used_bytes(), cpu_seconds(server.proc.pid)
    window = 3.0
    time.sleep(window)  # the measurement: CPU time over a stretch of wall time while full
    spent = cpu_seconds(server.proc.pid) - cpu
    assert server.proc.poll() is None, server.log()
    assert spent < 0.6 * window, f"{full_site} used {spent:.2f}s of CPU in {window}s while full"
    errors = metric_sum(metrics, "lr_errors_total", kind="StoreUnavailableError") or 0
    if full_site != "a":
        assert errors > 0, server.log()
    print(
        f"{full_site} full at {before} bytes: CPU {spent:.2f}s in {window}s,"
        f" lr_errors{{StoreUnavailableError}} {errors:.0f}, session: {session_error(dep)[:120]}"
    )
    fs.resize("256m")
    committed = source.committed
    wait_for(lambda: source.committed > committed + 20, scaled(60), 0.1, what="transmits again")
    source.stop()
    report = dep.wait_drained(source)
    print(f"after space returned: {report.counts()}")
    report.assert_clean()
    assert report.applied == report.expected == source.committed


@pytest.fixture
def fs() -> Iterator[SmallFs]:
    need(mount_allowed(), "mounting a tmpfs needs root")
    with small_fs("1m") as mounted:
        yield mounted


def test_a_full_sqlite_sink_waits_with_a_status_and_resumes_when_space_returns(
    tmp_path: Path, fs: SmallFs
) -> None:
    def url(site: str) -> str:
        return f"sqlite:///{(fs.path if site == 'b' else tmp_path) / (site + '.db')}"

    dep = Deployment(tmp_path, url, ("b",))
    source = SourceApp(
        dep.raw_urls["a"], "a", ["b"], rate=60, pad=2000, all_destinations=True, max_batch=2
    )
    try:
        fill_then_grow(dep, source, fs, "b")
        assert Path(f"{fs.path}/b.db-wal").exists()
    finally:
        source.close()
        dep.close()


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    need(pg_bindir() is not None, "PostgreSQL binaries (initdb, pg_ctl) not installed")
    made = PgCluster("full").init()
    made.start()
    yield made
    made.remove()


@pytest.mark.postgres
@pytest.mark.parametrize("full_site", ["b", "a"])
def test_a_full_postgres_tablespace_stops_the_site_with_a_status_and_resumes(
    tmp_path: Path, fs: SmallFs, cluster: PgCluster, full_site: str
) -> None:
    """The database of ``full_site`` lives in a tablespace on the small filesystem."""
    space = fs.path / "ts"
    space.mkdir()
    os.chown(space, *_postgres_ids())
    cluster.sql(f"CREATE TABLESPACE small LOCATION '{space}'")
    fs.resize("2m")  # the schema's tables fit; traffic fills the rest

    def url(site: str) -> str:
        name = f"full_{site}"
        cluster.sql(f'CREATE DATABASE "{name}"')
        if site == full_site:  # its tables (not the catalogs) go to the small tablespace
            cluster.sql(f'ALTER DATABASE "{name}" SET default_tablespace = small')
        return cluster.database_url(name)

    dep = Deployment(tmp_path, url, ("b",))
    source = SourceApp(
        dep.raw_urls["a"],
        "a",
        ["b"],
        rate=60,
        pad=4000,
        noise=True,
        all_destinations=True,
        max_batch=2,
    )
    try:
        fill_then_grow(dep, source, fs, full_site)
    finally:
        source.close()
        dep.close()


def _postgres_ids() -> tuple[int, int]:
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid
