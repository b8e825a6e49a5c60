"""``until_reachable``: what a server's start retries, and for how long."""

from __future__ import annotations

import threading

import pytest

from lr_client.errors import SchemaError, StoreUnavailableError
from lr_server.ops.startup import until_reachable


def test_a_database_that_stays_unreachable_fails_the_start_with_its_error() -> None:
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        raise StoreUnavailableError("connection refused")

    with pytest.raises(StoreUnavailableError, match="connection refused"):
        until_reachable(step, "preparing the database", threading.Event(), within=0.35)
    assert len(calls) >= 2  # retried (0.1 s, then 0.2 s) until the bound


def test_an_error_that_is_not_transient_is_not_retried() -> None:
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        raise SchemaError("the database is at revision 99, this release knows 17")

    with pytest.raises(SchemaError):
        until_reachable(step, "preparing the database", threading.Event())
    assert calls == [1]


def test_the_steps_result_is_returned() -> None:
    assert until_reachable(lambda: 7, "reading", threading.Event()) == 7


def test_a_stop_ends_the_retries_with_the_last_error() -> None:
    """SIGTERM during a start that waits for its database: no minute of retries."""
    stop = threading.Event()
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 2:
            stop.set()  # as the signal handler does, between two attempts
        raise StoreUnavailableError("connection refused")

    with pytest.raises(StoreUnavailableError):
        until_reachable(step, "preparing the database", stop, within=20)
    assert len(calls) == 2
