"""The embedded site (:class:`lr_server.Site`): start, wait until serving, stop; real gRPC."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from lr_client import ConfigError, RoutingQueueClient, SchemaError, create_engine
from lr_server import Site, SiteError, SiteStartError, SiteTimeoutError, load_config
from tests.conftest import PgSchema
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.wait import scaled, wait_for

LOCK = text("SELECT pg_advisory_lock(hashtextextended('lrq_schema:' || current_schema(), 0))")
UNLOCK = text("SELECT pg_advisory_unlock(hashtextextended('lrq_schema:' || current_schema(), 0))")


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def test_two_embedded_sites_replicate_and_stop(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    port = free_port()
    sink_path = write_config(tmp_path, SiteSpec("b", db_url_factory("b"), port, sources=["a"]))
    source_config = load_config(
        write_config(tmp_path, SiteSpec("a", db_url_factory("a"), destinations=[("b", port)]))
    )
    with Site(sink_path) as sink, Site(source_config) as source:  # a path, then a config
        assert sink.serving and source.serving
        assert _accepts(port)  # serving means the receiver's port accepts
        client = RoutingQueueClient(source.store, "a", "policy")
        with Session(source.store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, b"hello", ["b"])
        wait_for(lambda: sink.store.recv.sink_progress("a", "policy").entries_received == 1)
        (queue,) = sink.store.queues.list_queues("policy")
        with sink.store.read() as conn:
            assert [e.payload for e in sink.store.queues.read_queue(conn, queue.queue_id, 10)] == [
                b"hello"
            ]
        assert set(source.server.sessions) == {"b"}
    assert not sink.serving and not source.serving
    assert not _accepts(port)  # stopped: the receiver is gone
    sink.stop()  # again: a no-op


def test_a_port_in_use_is_a_start_error_with_its_cause(tmp_path: Path, sqlite_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        site = Site(write_config(tmp_path, SiteSpec("b", sqlite_url, port, sources=["a"])))
        site.start()
        with pytest.raises(SiteStartError, match=f"127.0.0.1:{port}") as info:
            site.wait_serving(scaled(30))
        assert isinstance(info.value.__cause__, OSError)
        assert not site.serving
        site.stop()


def test_a_database_of_a_newer_release_fails_the_start(tmp_path: Path, sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:  # as a newer release would leave it
        conn.execute(text("CREATE TABLE lrq_schema_migrations (version_num VARCHAR(32))"))
        conn.execute(text("INSERT INTO lrq_schema_migrations VALUES ('9999')"))
    engine.dispose()
    path = write_config(tmp_path, SiteSpec("a", sqlite_url, destinations=[("b", free_port())]))
    with pytest.raises(SiteStartError, match="failed to start: SchemaError") as info, Site(path):
        pass
    assert isinstance(info.value.__cause__, SchemaError)


def test_a_bad_config_file_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[site]\nid = "a"\n')
    with pytest.raises(ConfigError, match=r"site\.database_url"):
        Site(path)
    with pytest.raises(ConfigError, match="not found"):
        Site(tmp_path / "missing.toml")


def test_wait_serving_needs_a_start_and_a_stopped_site_stays_stopped(
    tmp_path: Path, sqlite_url: str
) -> None:
    site = Site(write_config(tmp_path, SiteSpec("a", sqlite_url)))
    with pytest.raises(SiteError, match="call start"):
        site.wait_serving(1.0)
    with pytest.raises(SiteError, match="not started"):
        _ = site.store
    site.start()
    with pytest.raises(SiteError, match="already started"):
        site.start()
    site.wait_serving(scaled(30))
    site.stop()
    with pytest.raises(SiteError, match="stopped"):
        site.start()
    with pytest.raises(SiteError, match="is stopped"):
        site.wait_serving(1.0)


@pytest.mark.postgres
def test_wait_serving_times_out_while_the_start_is_held_then_succeeds(
    tmp_path: Path, pg_schema: PgSchema
) -> None:
    """A schema upgrade held by another process: not serving yet, then serving once it ends."""
    holder = pg_schema.engine()
    port = free_port()
    site = Site(write_config(tmp_path, SiteSpec("b", pg_schema.url, port, sources=["a"])))
    with holder.connect() as conn:
        conn.execute(LOCK)  # the lock every schema set-up of this schema takes first
        site.start()
        with pytest.raises(SiteTimeoutError, match=r"did not start within 0\.5 s"):
            site.wait_serving(0.5)
        assert not site.serving and not _accepts(port)
        conn.execute(UNLOCK)
        site.wait_serving(scaled(30))
    assert site.serving and _accepts(port)
    site.stop()


@pytest.mark.postgres
def test_a_stop_during_a_held_start_returns_and_the_start_then_stops_the_site(
    tmp_path: Path, pg_schema: PgSchema
) -> None:
    holder = pg_schema.engine()
    port = free_port()
    path = write_config(tmp_path, SiteSpec("b", pg_schema.url, port, sources=["a"]))
    site = Site(path)
    with holder.connect() as conn:
        conn.execute(LOCK)
        site.start()
        site.stop(grace=0.1)  # returns although the start is still held
        other = Site(path, start_timeout=0.2)
        with pytest.raises(SiteTimeoutError), other:
            pass  # the context manager gives up on its start as well, without waiting
        conn.execute(UNLOCK)
    for started in (site, other):  # each start ends, and stops its site
        wait_for(lambda s=started: s._thread is not None and not s._thread.is_alive())
        assert not started.serving
    assert not _accepts(port)  # they started, then stopped at once
    with pytest.raises(SiteError, match="is stopped"):
        site.wait_serving(1.0)


def test_stopping_ends_the_snapshot_jobs_it_launched(tmp_path: Path, sqlite_url: str) -> None:
    # A job that ends within the grace is waited for; one that does not is
    # terminated: nothing the site started outlives it unreaped.
    path = write_config(tmp_path, SiteSpec("a", sqlite_url, destinations=[("b", free_port())]))
    site = Site(path)
    site.start()
    site.wait_serving(scaled(30))
    # /bin/sleep, not a Python process: it starts at once, so a shorter grace still holds it.
    finishing = subprocess.Popen(["sleep", "0.2"])
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    site.server.children.extend([finishing, stuck])
    site.stop(grace=scaled(1.5))
    assert finishing.returncode == 0
    assert stuck.returncode == -signal.SIGTERM
    assert site.server.children == []
