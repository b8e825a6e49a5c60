"""The demo's mismatch report names the keys that differ."""

from __future__ import annotations

from lr_server.demo import _differences


def test_differences_name_changed_missing_and_extra_keys() -> None:
    expected = {"k1": 1, "k2": 2, "k3": 3}
    actual = {"k1": 1, "k2": 5, "k4": 4}
    assert _differences(expected, actual) == [
        "k2: expected 2, found 5",
        "k3: expected 3, found None",
        "k4: expected None, found 4",
    ]
    assert _differences(expected, dict(expected)) == []


def test_differences_are_capped() -> None:
    expected = {f"k{i}": i for i in range(10)}
    lines = _differences(expected, {}, limit=3)
    assert len(lines) == 4 and lines[-1] == "... and 7 more keys"
