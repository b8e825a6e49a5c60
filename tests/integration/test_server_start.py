"""A server's start while its database cannot be reached: the database steps and the
member's join are retried (a connection cut, a database not up yet), other errors
are not."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lr_client.errors import StoreUnavailableError
from lr_client.store import open_store
from lr_server.config import load_config
from lr_server.server import SiteServer
from tests.kit.sites import Sites, SiteSpec, write_config
from tests.kit.wait import wait_for


def failing(
    times: int, real: Callable[..., Any], calls: list[str], after: bool = False
) -> Callable[..., Any]:
    """``real``, failing its first ``times`` calls as a cut connection does: before it
    ran, or (``after``) once it committed and before its answer came."""

    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(real.__name__)
        if calls.count(real.__name__) > times:
            return real(*args, **kwargs)
        if after:
            real(*args, **kwargs)
        raise StoreUnavailableError("terminating connection due to administrator command")

    return call


def test_a_start_retries_the_database_steps_and_the_join_through_cut_connections(
    tmp_path: Path, sites: Sites, caplog: pytest.LogCaptureFixture
) -> None:
    spec = SiteSpec("a", sites.url("a"), destinations=[("b", sites.port("b"))])
    config = load_config(write_config(tmp_path, spec))
    store = open_store(config.database_url)
    calls: list[str] = []
    store.sites.register_sites = failing(2, store.sites.register_sites, calls)  # type: ignore[method-assign]
    # The join committed, its answer lost: the retry finds the member's row alive.
    store.members.join_member = failing(1, store.members.join_member, calls, after=True)  # type: ignore[method-assign]
    server = SiteServer(config, store=store, member_id="a-1")
    try:
        with caplog.at_level(logging.WARNING):
            server.start()
        assert calls == ["register_sites"] * 3 + ["join_member"] * 2
        assert "b" in store.sites.site_numbers(refresh=True)
        assert [m.member_id for m in store.members.list_members(5.0) if m.alive] == ["a-1"]
        retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert len(retried) == 3 and "administrator command" in retried[0]
        # Its own row, from the attempt that was cut: not another process to take over.
        assert not [r for r in caplog.records if "takes it over" in r.getMessage()]
    finally:
        server.stop()
        store.engine.dispose()


def test_a_session_restarted_while_the_database_is_away_starts_once_it_is_back(
    tmp_path: Path, sites: Sites, caplog: pytest.LogCaptureFixture
) -> None:
    """A child's adoption restarts its session: stopped, then started from the cascades
    read anew. A database away at that moment (a crash) delays the start, never loses
    it (the session was gone for good: nothing shipped to that child again)."""
    spec = SiteSpec("a", sites.url("a"), destinations=[("b", sites.port("b"))])
    server = SiteServer(load_config(write_config(tmp_path, spec)), member_id="a-1")
    try:
        server.start()
        wait_for(lambda: "b" in server._runs, timeout=30)
        before = server._runs["b"][1]
        calls: list[str] = []
        server.cascade_for = failing(2, server.cascade_for, calls)  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING):
            server._restart_session("b")
        assert calls == ["cascade_for"] * 3
        stop, thread = server._runs["b"]
        assert thread is not before and thread.is_alive() and not stop.is_set()
        assert not before.is_alive()
        retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
        assert len(retried) == 2 and "session to b" in retried[0]
    finally:
        server.stop()
