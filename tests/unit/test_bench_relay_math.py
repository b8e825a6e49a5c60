"""The relay benchmark's reading of the servers' histograms: differences and quantiles."""

from __future__ import annotations

import math

import pytest

from bench.relay import ServerHistogram, Stage

BUCKETS = (0.005, 0.01, 0.025, 0.05, math.inf)


def histogram(counts: list[float], total: float) -> ServerHistogram:
    """Cumulative buckets from per-bucket ``counts``."""
    cumulative, seen = {}, 0.0
    for bound, n in zip(BUCKETS, counts, strict=True):
        seen += n
        cumulative[bound] = seen
    return ServerHistogram(cumulative, total, seen)


def test_quantiles_interpolate_within_the_bucket_as_promql_does() -> None:
    h = histogram([0, 10, 10, 0, 0], 0.3)  # 10 in (5, 10] ms, 10 in (10, 25] ms
    assert h.quantile(0.5) == pytest.approx(0.010)
    assert h.quantile(0.25) == pytest.approx(0.0075)
    assert h.quantile(0.99) == pytest.approx(0.010 + 0.015 * 9.8 / 10)
    # Past the last finite bound: that bound (as histogram_quantile answers).
    assert histogram([0, 0, 0, 1, 1], 1.0).quantile(0.99) == pytest.approx(0.05)
    assert histogram([0, 0, 0, 0, 0], 0.0).quantile(0.5) is None


def test_a_phase_is_the_difference_of_two_scrapes() -> None:
    before = histogram([5, 0, 0, 0, 0], 0.01)
    after = histogram([5, 0, 4, 0, 0], 0.09)
    phase = after.since(before)
    assert phase.count == 4 and phase.sum == pytest.approx(0.08)
    stage = Stage.of(phase)
    assert stage.observations == 4 and stage.mean_ms == pytest.approx(20.0)
    assert stage.p50_ms == pytest.approx(17.5) and stage.p99_ms is not None
    assert stage.p99_ms <= 25.0
    assert Stage.of(before.since(before)) == Stage(0, None, None, None)
