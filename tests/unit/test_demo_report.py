"""The demo's mismatch report names the keys that differ; its notices print verbatim."""

from __future__ import annotations

import sys

import pytest

from lr_server.demo import star as demo
from lr_server.demo.sites import demo_console, differences, report_check
from spark_jobs import demo as spark_demo


def test_differences_name_changed_missing_and_extra_keys() -> None:
    expected = {"k1": 1, "k2": 2, "k3": 3}
    actual = {"k1": 1, "k2": 5, "k4": 4}
    assert differences(expected, actual) == [
        "k2: expected 2, found 5",
        "k3: expected 3, found None",
        "k4: expected None, found 4",
    ]
    assert differences(expected, dict(expected)) == []


def test_differences_are_capped() -> None:
    expected = {f"k{i}": i for i in range(10)}
    lines = differences(expected, {}, limit=3)
    assert len(lines) == 4 and lines[-1] == "... and 7 more keys"


def test_without_pyspark_the_demo_says_how_to_install_the_spark_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spark_demo.shutil, "which", lambda _name: "/usr/bin/java")
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError
    available, reason = spark_demo.spark_available()
    assert not available
    console = demo_console()
    with console.capture() as shown:
        console.print(demo.spark_skipped_notice(reason))
    text = " ".join(shown.get().split())
    assert "pip install 'lr-routing-queue[spark]', or -e '.[spark]' in a checkout" in text


def test_the_check_names_each_sink_and_its_differing_keys() -> None:
    console = demo_console()
    with console.capture() as shown:
        report_check(
            console,
            False,
            "All sinks match their source.",
            {"b": {"k1": 1}, "c": {"k2": 2}},
            {"b": {"k1": 1}, "c": {"k2": 3}},
        )
    assert shown.get().splitlines() == ["Mismatch.", "  c: k2: expected 2, found 3"]
    with console.capture() as shown:
        report_check(console, True, "All sinks match their source.", {"b": {}}, {"b": {}})
    assert shown.get().splitlines() == ["All sinks match their source."]
