"""The metrics endpoint: where it listens (``site.metrics_listen``), basic auth, TLS.

Real HTTP(S) requests to a real endpoint on the machine's sockets.
"""

from __future__ import annotations

import base64
import socket
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from lr_client.errors import ConfigError
from lr_server import Site, parse_config
from lr_server.config import SiteConfig
from lr_server.ops.metrics_http import MetricsEndpoint, serve_metrics, serve_site_metrics
from tests.kit.certs import Pki, make_pki
from tests.kit.ports import reserve_port

TIMEOUT = 10.0


def config(db_url: str = "sqlite:///unused.db", security: Any = None, **site: Any) -> SiteConfig:
    return parse_config(
        {
            "site": {"id": "site-a", "database_url": db_url, **site},
            "security": security or {"transport": "plaintext", "client_auth": "token"},
        }
    )


def get(url: str, auth: tuple[str, str] | None = None, context: Any = None) -> tuple[int, str]:
    """GET ``url``: the status and body (an HTTP error's too)."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


@pytest.fixture
def endpoints() -> Any:
    started: list[MetricsEndpoint] = []

    def serve(cfg: SiteConfig) -> MetricsEndpoint:
        endpoint = serve_site_metrics(cfg)
        assert endpoint is not None
        started.append(endpoint)
        return endpoint

    yield serve
    for e in started:
        e.close()


def outward_address() -> str | None:
    """An address of this host other than loopback, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects a route
        except OSError:
            return None
        host = str(probe.getsockname()[0])
    return None if host.startswith("127.") or host == "0.0.0.0" else host


def test_metrics_port_stays_on_loopback(endpoints: Any) -> None:
    port = reserve_port()
    cfg = config(metrics_port=port)
    assert cfg.metrics_address() == ("127.0.0.1", port)
    endpoint = endpoints(cfg)
    assert endpoint.server.server_address[0] == "127.0.0.1"
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and "lr_entries_shipped" in body
    assert config().metrics_address() is None  # no endpoint by default


def test_metrics_listen_binds_the_address_given(endpoints: Any) -> None:
    port = reserve_port("0.0.0.0")
    endpoint = endpoints(config(metrics_listen=f"0.0.0.0:{port}"))
    assert endpoint.server.server_address[:2] == ("0.0.0.0", port)
    assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    outward = outward_address()
    if outward is not None:  # reachable from another host: at the host's own address
        status, body = get(f"http://{outward}:{port}/metrics")
        assert status == 200 and "lr_lag_entries" in body


def test_an_ipv6_address_is_served() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        endpoint = serve_metrics("[::1]", 0)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert endpoint.server.server_address[0] == "::1"
        status, body = get(f"http://[::1]:{endpoint.port}/metrics")
        assert status == 200 and "lr_entries_shipped" in body
    finally:
        endpoint.close()


def test_basic_auth_refuses_a_request_without_the_credentials(endpoints: Any) -> None:
    port = reserve_port()
    cfg = config(
        metrics_listen=f"127.0.0.1:{port}", metrics_username="prom", metrics_password="s3cret"
    )
    endpoints(cfg)
    url = f"http://127.0.0.1:{port}/metrics"
    request = urllib.request.Request(url)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=TIMEOUT)
    with refused.value as reply:
        assert reply.code == 401
        assert reply.headers["WWW-Authenticate"] == 'Basic realm="lr metrics"'
        assert "lr_" not in reply.read().decode()
    assert get(url, ("prom", "wrong"))[0] == 401
    assert get(url, ("other", "s3cret"))[0] == 401
    status, body = get(url, ("prom", "s3cret"))
    assert status == 200 and "lr_entries_shipped" in body


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_security(pki: Pki) -> dict[str, str]:
    return {
        "transport": "tls",
        "client_auth": "mtls",
        "ca_file": str(pki.ca.cert),
        "cert_file": str(pki.server.cert),
        "key_file": str(pki.server.key),
    }


def test_tls_serves_https_with_the_sites_certificate(endpoints: Any, pki: Pki) -> None:
    port = reserve_port()
    cfg = config(
        security=tls_security(pki),
        metrics_listen=f"127.0.0.1:{port}",
        metrics_tls=True,
        metrics_username="prom",
        metrics_password="s3cret",
    )
    endpoint = endpoints(cfg)
    assert endpoint.tls
    trusted = ssl.create_default_context(cafile=str(pki.ca.cert))
    status, body = get(f"https://localhost:{port}/metrics", ("prom", "s3cret"), trusted)
    assert status == 200 and "lr_entries_shipped" in body
    assert get(f"https://localhost:{port}/metrics", None, trusted)[0] == 401
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
        get(f"http://127.0.0.1:{port}/metrics")
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(f"https://localhost:{port}/metrics", context=ssl.create_default_context())


def test_a_site_serves_its_metrics_where_configured_and_frees_the_port(sqlite_url: str) -> None:
    port = reserve_port()
    cfg = config(sqlite_url, metrics_listen=f"127.0.0.1:{port}")
    with Site(cfg):
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "lr_entries_shipped" in body
        assert "lr_sink_metrics_up 1.0" in body  # the sink's metrics, read from its database
    with pytest.raises(urllib.error.URLError):
        get(f"http://127.0.0.1:{port}/metrics")


@pytest.mark.parametrize(
    ("site", "fragment"),
    [
        ({"metrics_listen": "9464"}, "site.metrics_listen: expected host:port"),
        ({"metrics_listen": "0.0.0.0:1", "metrics_port": 2}, "give either metrics_listen"),
        ({"metrics_username": "prom"}, "site.metrics_password: basic auth needs"),
        ({"metrics_password": "x"}, "site.metrics_username: basic auth needs"),
        ({"metrics_tls": True}, "security.cert_file: required when site.metrics_tls"),
        ({"metrics_tls": "yes"}, "site.metrics_tls: expected true or false"),
    ],
)
def test_bad_metrics_keys_are_named(site: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        config(**site)


def test_a_port_in_use_names_the_key(endpoints: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"site.metrics_listen: cannot serve 127.0.0.1:{port}"):
            serve_site_metrics(config(metrics_listen=f"127.0.0.1:{port}"))
