"""``/ready`` of a running site (:mod:`lr_server.ops.readiness`) over real HTTP: 200 while its
database answers and its heartbeat is recorded; 503, saying why, once the database is
gone; no credentials needed where ``/metrics`` wants them."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lr_server import Site
from tests.conftest import PG_URL, PgSchema
from tests.kit.sites import SiteSpec, free_port, write_config
from tests.kit.templates import drop_pg_database
from tests.kit.wait import scaled, wait_for


def _get(port: int, path: str, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=scaled(10)) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except TimeoutError:  # a probe still waiting for a database that went away: ask again
        return 0, ""


def _config(tmp_path: Path, url: str, port: int, site_lines: str = "", extra: str = "") -> Path:
    spec = SiteSpec("a", url, metrics_port=port, extra=extra)
    path = write_config(tmp_path, spec, security="plaintext")
    if site_lines:
        text = path.read_text().replace(
            f"metrics_port = {port}\n", f"metrics_port = {port}\n{site_lines}\n"
        )
        path.write_text(text)
    return path


def test_ready_answers_200_without_credentials_where_metrics_wants_them(
    tmp_path: Path, sqlite_url: str
) -> None:
    port = free_port()
    config = _config(
        tmp_path, sqlite_url, port, 'metrics_username = "ops"\nmetrics_password = "s3cret"'
    )
    with Site(config, start_timeout=scaled(30)):
        status, body = wait_for(
            lambda: (r := _get(port, "/ready"))[0] == 200 and r, 30, what="ready"
        )
        assert status == 200
        assert body.strip() == "ready"
        assert _get(port, "/metrics")[0] == 401
        assert _get(port, "/metrics", ("ops", "s3cret"))[0] == 200
    # Stopped: nothing answers any more (a probe sees the endpoint gone).
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=scaled(5))


@pytest.mark.postgres
def test_ready_turns_503_when_the_database_is_dropped_then_the_leases_lapse(
    tmp_path: Path,
) -> None:
    pg = PgSchema(migrated=True)
    assert pg.database is not None
    port = free_port()
    members = "[members]\nlease_timeout = 2.0\nheartbeat_interval = 0.25"
    site = Site(_config(tmp_path, pg.url, port, extra=members), start_timeout=scaled(30))
    try:
        site.start()
        site.wait_serving(scaled(30))
        wait_for(lambda: _get(port, "/ready")[0] == 200, 30, what="ready")
        drop_pg_database(PG_URL, pg.database)  # queued: every connection closed, then gone
        body = wait_for(
            lambda: (r := _get(port, "/ready"))[0] == 503 and r[1],
            30,
            what="not ready once the database is gone",
        )
        assert body.startswith("database: "), body
        # Its heartbeats fail too: 3/4 of the lease timeout later its leases are not live.
        body = wait_for(
            lambda: (r := _get(port, "/ready"))[0] == 503 and "members:" in r[1] and r[1],
            30,
            what="the leases reported lapsed",
        )
        assert "database: " in body
    finally:
        site.stop(grace=scaled(5))
        pg.drop()
