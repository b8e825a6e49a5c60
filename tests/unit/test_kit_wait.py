"""The test kit's guard, waits, reserved ports and failure logs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from tests import conftest
from tests.kit import procs
from tests.kit.guards import need
from tests.kit.ports import reserve_port
from tests.kit.wait import SCALE_ENV, Deadline, scaled, wait_for


def test_need_skips_outside_ci_and_fails_on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    need(True, "never shown")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="no widget here"):
        need(False, "no widget here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no widget here"):
        need(None, "no widget here")


def test_deadlines_are_scaled_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCALE_ENV, "3")
    assert scaled(10) == 30
    assert Deadline(10).seconds == 30
    monkeypatch.setenv(SCALE_ENV, "0")
    with pytest.raises(ValueError, match=SCALE_ENV):
        scaled(1)


def test_wait_for_returns_the_first_true_value() -> None:
    values = iter([0, "", None, "done", "later"])
    assert wait_for(lambda: next(values), 10, 0.001) == "done"


def test_wait_for_names_what_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCALE_ENV, "0.5")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="the widget ready not reached within 0s\nstate: 7"):
        wait_for(lambda: False, 0.4, 0.01, what="the widget ready", detail=lambda: "state: 7")
    assert 0.2 <= time.monotonic() - started < 5


def test_a_reserved_port_is_taken_by_nobody_else_but_a_server_can_listen_on_it() -> None:
    port = reserve_port()
    assert port != reserve_port()
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # another process's bind fails the same way
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        assert server.add_insecure_port(f"127.0.0.1:{port}") == port
        server.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
    finally:
        server.stop(None)
    # Stopped (as after a kill): the port is still reserved, and a restart binds it again.
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    again = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        assert again.add_insecure_port(f"127.0.0.1:{port}") == port
    finally:
        again.stop(None)


def test_a_failed_test_report_shows_the_tail_of_each_process_log(tmp_path: Path) -> None:
    log = tmp_path / "b.log"
    log.write_text("x" * 10_000 + "\nthe server's last words\n")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    procs.track("lr server b", log, proc)
    try:
        for failed, want in ((False, []), (True, ["lr server b"])):
            report = SimpleNamespace(failed=failed, sections=[])
            hook = conftest.pytest_runtest_makereport(None, None)  # type: ignore[arg-type]
            next(hook)
            with pytest.raises(StopIteration) as done:
                hook.send(report)  # type: ignore[arg-type]
            assert done.value.value is report
            shown = [(t, text) for t, text in report.sections if "lr server b" in t]
            assert [t.split(" (")[0].removeprefix("log of ") for t, _ in shown] == want
            if failed:
                ((title, text),) = shown
                assert f"exit code 0): {log}" in title
                assert text.endswith("the server's last words\n")
                assert len(text) <= procs.LOG_TAIL_CHARS
    finally:
        procs.forget_exited()
