"""The shared Spark session's start: a JVM that dies while starting is started again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark import conftest


@pytest.fixture(autouse=True)
def _pyspark() -> Iterator[None]:
    conftest.require_spark()
    yield


def _error(condition: str) -> Exception:
    from pyspark.errors import PySparkRuntimeError

    return PySparkRuntimeError(errorClass=condition, messageParameters={})


class Builder:
    def __init__(self, failures: list[str], leak: bool = False) -> None:
        self.failures = failures
        self.leak = leak
        self.calls = 0

    def getOrCreate(self) -> Any:
        self.calls += 1
        if self.failures:
            # PySpark leaves its pipe to a gateway that died open.
            pipe = open(os.devnull, "wb") if self.leak else None  # noqa: SIM115
            assert pipe is None or not pipe.closed
            raise _error(self.failures.pop(0))
        return "session"


def test_a_gateway_that_exits_while_starting_is_started_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    builder = Builder(["JAVA_GATEWAY_EXITED", "JAVA_GATEWAY_EXITED"])
    assert conftest._start(builder) == "session"
    assert builder.calls == 3
    assert capsys.readouterr().err.count("JAVA_GATEWAY_EXITED") == 2


def test_the_pipe_a_failed_start_leaves_open_is_no_error() -> None:
    """Its ResourceWarning is PySpark's: with warnings as errors, the start still succeeds."""
    builder = Builder(["JAVA_GATEWAY_EXITED"], leak=True)
    assert conftest._start(builder) == "session"
    assert builder.calls == 2


def test_the_last_failed_start_is_raised() -> None:
    builder = Builder(["JAVA_GATEWAY_EXITED"] * conftest.START_ATTEMPTS)
    with pytest.raises(Exception, match="JAVA_GATEWAY_EXITED"):
        conftest._start(builder)
    assert builder.calls == conftest.START_ATTEMPTS


def test_other_failures_are_not_retried() -> None:
    builder = Builder(["CONTEXT_ONLY_VALID_ON_DRIVER"])
    with pytest.raises(Exception, match="CONTEXT_ONLY_VALID_ON_DRIVER"):
        conftest._start(builder)
    assert builder.calls == 1
