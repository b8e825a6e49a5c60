"""The one place a test may skip: :func:`need`.

Outside CI a missing prerequisite (a database server, Java, a driver) skips
the test and says why. With ``CI=true`` it fails the test instead: CI installs
everything the tests need (``scripts/ci-deps``), so a skip there would only
hide a broken setup.
"""

from __future__ import annotations

import os

import pytest


def on_ci() -> bool:
    """Whether ``CI`` is set (``true``, ``1`` or ``yes``)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


ON_CI = on_ci()


def need(condition: object, reason: str) -> None:
    """Go on if ``condition`` holds; else skip with ``reason`` (on CI: fail with it)."""
    if condition:
        return
    if on_ci():
        pytest.fail(f"CI=true and {reason} (scripts/ci-deps installs it)", pytrace=False)
    pytest.skip(reason)
