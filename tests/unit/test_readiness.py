"""``/ready``'s verdict (:mod:`lr_server.ops.readiness`) from a server's parts, without sockets."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from lr_client.errors import SchemaError, StoreUnavailableError
from lr_server.ops.readiness import Serving, problems, ready_app, route_ready


class _Store:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def check_schema(self) -> None:
        if self.error is not None:
            raise self.error


class _Members:
    def __init__(self, valid: bool) -> None:
        self._valid = valid

    def valid(self) -> bool:
        return self._valid


@dataclass
class _Server:
    store: _Store = field(default_factory=_Store)
    membership: _Members | None = field(default_factory=lambda: _Members(True))
    stop_event: threading.Event = field(default_factory=threading.Event)


def _problems(server: _Server) -> list[str]:
    return problems(cast(Serving, server))


def test_ready_when_the_database_answers_and_the_heartbeat_is_recent() -> None:
    assert _problems(_Server()) == []


def test_each_reason_is_told() -> None:
    down = _Server(store=_Store(StoreUnavailableError("connection refused\nat ...")))
    assert _problems(down) == ["database: StoreUnavailableError: connection refused"]
    old = _Server(store=_Store(SchemaError("schema revision 3, this release needs 4")))
    assert _problems(old)[0].startswith("database: SchemaError: schema revision 3")
    lapsed = _Server(membership=_Members(False))
    assert _problems(lapsed) == ["members: no heartbeat recorded lately: its leases are not live"]
    assert _problems(_Server(membership=None)) == ["members: not joined yet"]
    both = _Server(store=_Store(StoreUnavailableError("gone")), membership=_Members(False))
    assert [p.split(":")[0] for p in _problems(both)] == ["database", "members"]


def test_a_stopping_server_is_not_ready_whatever_else() -> None:
    server = _Server()
    server.stop_event.set()
    assert _problems(server) == ["stopping"]


def _call(app: Any, path: str) -> tuple[str, bytes]:
    got: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got.append(status)

    body = b"".join(cast(Iterable[bytes], app({"PATH_INFO": path}, start_response)))
    return got[0], body


def test_ready_answers_200_or_503_with_the_reasons_and_other_paths_go_to_the_app() -> None:
    reasons: list[str] = []

    def other(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("401 Unauthorized", [])
        return [b"metrics"]

    app = route_ready(other, ready_app(lambda: list(reasons)))
    assert _call(app, "/ready") == ("200 OK", b"ready\n")
    assert _call(app, "/ready/") == ("200 OK", b"ready\n")
    reasons[:] = ["database: gone", "members: lapsed"]
    assert _call(app, "/ready") == (
        "503 Service Unavailable",
        b"database: gone\nmembers: lapsed\n",
    )
    assert _call(app, "/metrics") == ("401 Unauthorized", b"metrics")
    assert _call(app, "/") == ("401 Unauthorized", b"metrics")
