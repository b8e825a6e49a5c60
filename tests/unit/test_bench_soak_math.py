"""The soak benchmark's arithmetic: latency buckets, target windows, the flatness rule."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench.common import least_squares_slope, process_rss
from bench.soak import FLAT_FRACTION, Histogram, flatness, windows


def samples(duration: float, period: float, values: list[float] | None = None) -> list[Any]:
    out = []
    i, start = 0, 0.0
    while start < duration - 1e-9:
        end = min(start + period, duration)
        s: dict[str, Any] = {"index": i, "start_s": start, "end_s": end, "minute": end / 60}
        if values is not None:
            s["size"] = values[i]
        out.append(s)
        i, start = i + 1, end
    return out


def test_histogram_quantiles_are_within_one_percent_and_memory_is_bounded() -> None:
    h = Histogram()
    for _ in range(3):
        for ms in range(1, 1001):  # 1 .. 1000 ms, three times each
            h.add(float(ms))
    assert h.n == 3000 and h.max == 1000.0
    assert h.quantile(0.50) == pytest.approx(500, rel=0.011)
    assert h.quantile(0.99) == pytest.approx(990, rel=0.011)
    assert h.quantile(1.0) == 1000.0
    assert len(h.counts) < 700  # 1 % buckets, however many values
    other = Histogram()
    other.add(5000.0)
    h.merge(other)
    assert h.n == 3001 and h.max == 5000.0 and h.quantile(1.0) == 5000.0
    assert Histogram().quantile(0.99) is None


def test_windows_of_a_long_run_are_minutes_2_to_6_and_the_last_5() -> None:
    early, late, how = windows(1800.0, samples(1800.0, 60.0))
    assert early == [1, 2, 3, 4, 5]
    assert late == [25, 26, 27, 28, 29]
    assert how == "minutes 2-6 against the last 5 minutes"


def test_windows_of_a_short_run_are_halves_without_the_first_sample() -> None:
    early, late, how = windows(180.0, samples(180.0, 15.0))
    assert early == [1, 2, 3, 4, 5]
    assert late == [6, 7, 8, 9, 10, 11]
    assert "shorter than 10 minutes" in how


def test_flat_allows_a_tenth_of_the_mean_plus_the_floor_over_the_second_half() -> None:
    n = 10  # 10 one-minute samples; the second half is minutes 6..10, 4 minutes apart
    level = [100.0] * n
    assert flatness(samples(600.0, 60.0, level), 600.0, "size", 0.0)["flat"] is True
    # Rising 4/min: 16 over the half's 4 minutes, against 10 % of its mean of 128.
    rising = [100.0 + 4 * i for i in range(n)]
    f = flatness(samples(600.0, 60.0, rising), 600.0, "size", 0.0)
    assert f["slope_per_min"] == pytest.approx(4.0) and f["mean"] == pytest.approx(128.0)
    assert f["rise_over_half"] == pytest.approx(16.0)
    assert f["allowed_rise"] == pytest.approx(FLAT_FRACTION * f["mean"])
    assert f["flat"] is False
    assert f["relative_slope_per_min"] == pytest.approx(4.0 / 128.0)
    # The same rise is within a floor of 5.
    assert flatness(samples(600.0, 60.0, rising), 600.0, "size", 5.0)["flat"] is True
    # Falling is flat; too few samples gives no verdict.
    falling = [200.0 - 10 * i for i in range(n)]
    assert flatness(samples(600.0, 60.0, falling), 600.0, "size", 0.0)["flat"] is True
    few = flatness(samples(120.0, 60.0, [1.0, 2.0]), 120.0, "size", 0.0)
    assert few["flat"] is None and few["samples"] == 1


def test_least_squares_slope_and_rss() -> None:
    assert least_squares_slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert least_squares_slope([(1, 1)]) is None
    assert least_squares_slope([(1, 1), (1, 2)]) is None
    rss = process_rss(os.getpid())
    assert rss is not None and rss > 1024 * 1024
    assert process_rss(2**22 + 12345) is None  # no such process


def test_panels_svg_draws_lines_markers_and_each_label_once() -> None:
    from bench.common import Panel, Series, panels_svg

    top = Panel(
        "size",
        [Series("a & b", "#111", [(0, 1), (1, 2)]), Series("c", "#222", [(0, 2)], dashed=True)],
        markers=[(0.5, "sink-2 dropped", "#222")],
    )
    bottom = Panel("dead", [Series("a & b", "#111", [(0, 5), (2, 0)], dashed=True)])
    svg = panels_svg("t <1>", "minutes", [top, bottom])
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert svg.count("<polyline") == 3
    assert svg.count(">a &amp; b</text>") == 1  # the legend names a label once
    assert "t &lt;1&gt;" in svg and ">sink-2 dropped</text>" in svg
    assert svg.count('stroke-dasharray="2 3"') == 1  # the marker's line
