"""The ``/metrics`` endpoint: Prometheus' WSGI app on a threaded HTTP(S) server.

Bound where the config says (``site.metrics_listen``, else 127.0.0.1 at
``site.metrics_port``); with ``site.metrics_username`` and ``metrics_password``
a request needs HTTP basic auth, with ``site.metrics_tls`` the endpoint is
HTTPS with the site's certificate (``security.cert_file`` and ``key_file``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

from lr_client.sink_metrics import SinkCollector, SinkReads
from lr_server.config import SiteConfig
from lr_server.ops.readiness import ready_app, route_ready

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: The realm a 401 names.
REALM = "lr metrics"


class ThreadingServer(ThreadingMixIn, WSGIServer):
    """A WSGI server answering each request in a daemon thread."""

    daemon_threads = True


class ThreadingServer6(ThreadingServer):
    """The same, on an IPv6 address."""

    address_family = socket.AF_INET6


class QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


def basic_auth(app: WSGIApp, username: str, password: str) -> WSGIApp:
    """``app`` behind HTTP basic auth: 401 unless the request carries these credentials
    (compared in constant time)."""
    expected = f"{username}:{password}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = str(environ.get("HTTP_AUTHORIZATION", ""))
        scheme, _, value = header.partition(" ")
        try:
            given = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            given = b""
        if scheme.lower() == "basic" and hmac.compare_digest(given, expected):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("WWW-Authenticate", f'Basic realm="{REALM}"'), ("Content-Type", "text/plain")],
        )
        return [b"unauthorized\n"]

    return guarded


class MetricsEndpoint:
    """A running ``/metrics`` endpoint; :meth:`close` stops it."""

    def __init__(self, server: ThreadingServer, thread: threading.Thread, tls: bool) -> None:
        self.server = server
        self.thread = thread
        self.tls = tls

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when 0 was asked)."""
        return int(self.server.server_address[1])

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5.0)


def serve_metrics(
    host: str,
    port: int,
    *,
    username: str = "",
    password: str = "",
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    registry: CollectorRegistry = REGISTRY,
    ready: Callable[[], list[str]] | None = None,
) -> MetricsEndpoint:
    """Serve ``registry`` on ``host:port`` from a daemon thread: HTTPS with
    ``cert_file`` and ``key_file``, basic auth with ``username``; with ``ready`` (why
    not ready: :mod:`lr_server.ops.readiness`), ``/ready`` too, without credentials. An
    ``OSError`` names the address (a port in use, a host not local)."""
    app: WSGIApp = make_wsgi_app(registry)
    if username:
        app = basic_auth(app, username, password)
    if ready is not None:
        app = route_ready(app, ready_app(ready))
    bind = host.strip("[]")
    server_class = ThreadingServer6 if ":" in bind else ThreadingServer
    try:
        server = make_server(bind, port, app, server_class, QuietHandler)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve {host}:{port}: {exc.strerror or exc}") from exc
    if cert_file:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="lr-metrics", daemon=True)
    thread.start()
    return MetricsEndpoint(server, thread, tls=bool(cert_file))


def site_registry(store: SinkReads) -> CollectorRegistry:
    """What a site serves: the process's metrics (``REGISTRY``) and its sink's, read from
    ``store`` at each scrape (:mod:`lr_client.sink_metrics`: the names an embedded
    subscriber's application exports too)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(REGISTRY)
    registry.register(SinkCollector(store))
    return registry


def serve_site_metrics(
    config: SiteConfig, store: object = None, ready: Callable[[], list[str]] | None = None
) -> MetricsEndpoint | None:
    """The site's endpoint as its config says, or None if it has none: the process's
    metrics, and its sink's if ``store`` reads them (:class:`SinkReads`); ``/ready``
    with ``ready``. An ``OSError`` names the key of the address it could not bind."""
    address = config.metrics_address()
    if address is None:
        return None
    registry = site_registry(store) if isinstance(store, SinkReads) else REGISTRY
    tls = config.metrics_tls
    try:
        return serve_metrics(
            *address,
            username=config.metrics_username,
            password=config.metrics_password,
            cert_file=config.security.cert_file if tls else None,
            key_file=config.security.key_file if tls else None,
            registry=registry,
            ready=ready,
        )
    except OSError as exc:
        key = "site.metrics_listen" if config.metrics_listen else "site.metrics_port"
        raise OSError(exc.errno, f"{key}: {exc.strerror}") from exc


__all__ = [
    "MetricsEndpoint",
    "basic_auth",
    "serve_metrics",
    "serve_site_metrics",
    "site_registry",
]
