"""``/ready``: whether this ``lr server`` should be given traffic (a load balancer's or
Kubernetes' readiness probe), on the metrics endpoint (:mod:`lr_server.ops.metrics_http`).

Ready (200) only when the server is not stopping, its database answers (the schema is
read and current) and, as a member of its site, its heartbeat was recorded lately (its
leases are live: :meth:`~lr_server.cluster.membership.Membership.valid`); otherwise 503 with
one line per reason. The probe needs no credentials, also when ``/metrics`` does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from lr_client.store import QueueStore
from lr_server.cluster.membership import Membership

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Serving(Protocol):
    """What the probe reads of a running server (:class:`~lr_server.server.SiteServer`)."""

    @property
    def store(self) -> QueueStore: ...
    @property
    def membership(self) -> Membership | None: ...
    @property
    def stop_event(self) -> threading.Event: ...


def problems(server: Serving) -> list[str]:
    """Why ``server`` is not ready; empty: ready."""
    if server.stop_event.is_set():
        return ["stopping"]
    out: list[str] = []
    try:
        server.store.check_schema()
    except Exception as exc:  # any failure of the database is "not ready"
        out.append(f"database: {type(exc).__name__}: {exc}".splitlines()[0][:300])
    membership = server.membership
    if membership is None:
        out.append("members: not joined yet")
    elif not membership.valid():
        out.append("members: no heartbeat recorded lately: its leases are not live")
    return out


def ready_app(check: Callable[[], list[str]]) -> WSGIApp:
    """A WSGI app answering 200 ``ready`` or 503 with ``check()``'s reasons."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        reasons = check()
        status = "503 Service Unavailable" if reasons else "200 OK"
        body = ("\n".join(reasons) if reasons else "ready").encode() + b"\n"
        start_response(
            status,
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Cache-Control", "no-store"),
                ("Content-Length", str(len(body))),
            ],
        )
        return [body]

    return app


def route_ready(app: WSGIApp, ready: WSGIApp) -> WSGIApp:
    """``ready`` at ``/ready``, ``app`` everywhere else."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("PATH_INFO", "")).rstrip("/") == "/ready":
            return ready(environ, start_response)
        return app(environ, start_response)

    return routed


__all__ = ["Serving", "problems", "ready_app", "route_ready"]
