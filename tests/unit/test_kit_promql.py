"""The test kit's PromQL reading: metric names of expressions, sample names of a registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from tests.kit.promql import exported_samples, metric_names, rated_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("lr_lag_seconds > 300", {"lr_lag_seconds"}),
        (
            'sum by (instance, destination) (rate(lr_entries_shipped_total{client="a b"}[5m]))',
            {"lr_entries_shipped_total"},
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(lr_batch_latency_seconds_bucket[1m])))",
            {"lr_batch_latency_seconds_bucket"},
        ),
        (
            "increase(lr_drops_total[15m]) > 0 or time() - lr_drops_created < 15 * 60",
            {"lr_drops_total", "lr_drops_created"},
        ),
        (
            "lr_snapshot_active == 1 unless on (instance, job, destination, client) "
            "changes(lr_snapshot_rows[30m]) > 0",
            {"lr_snapshot_active", "lr_snapshot_rows"},
        ),
        # Keywords in any case, offsets, durations, numbers, subqueries, @ modifiers.
        (
            "a_total OFFSET 1h30m AND ON(x) b:rec[5m:30s] @ start() * 1.5e3 + 0x1F - Inf",
            {"a_total", "b:rec"},
        ),
        (
            'sum(x) by (le) / ignoring (kind) group_left (site) y{kind=~"a|b"} == bool NaN',
            {"x", "y"},
        ),
        # Label values, strings and Grafana variables are not names.
        (
            'label_replace(up{job="lr", instance=~"$instance"}, "site", "$1", "x", "(.*)")',
            {"up"},
        ),
        ("rate(process_cpu_seconds_total[$__rate_interval])", {"process_cpu_seconds_total"}),
        ('{__name__="lr_backpressure", client="policy"} == 1', {"lr_backpressure"}),
        ("vector(1) # a comment naming not_a_metric", set()),
    ],
)
def test_metric_names_of_expressions(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_name_matched_by_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="__name__"):
        metric_names('{__name__=~"lr_.*"}')


def test_rated_names() -> None:
    expr = "increase(lr_drops_total[5m]) + rate( x_bucket{a='b'}[1m]) - changes(g[5m])"
    assert rated_names(expr) == {"lr_drops_total", "x_bucket"}


def test_exported_samples_follow_what_the_registry_exposes() -> None:
    registry = CollectorRegistry()
    Counter("c", "a counter", ["k"], registry=registry)  # no child yet: no samples
    Counter("u", "an unlabelled counter", registry=registry)
    Gauge("g", "a gauge", registry=registry)
    Histogram("h", "a histogram", ["k"], registry=registry).labels("v").observe(1)
    Summary("s", "a summary", registry=registry)
    samples = exported_samples(registry)
    assert samples == {
        "c_total": "counter",
        "c_created": "counter",
        "u_total": "counter",
        "u_created": "counter",
        "g": "gauge",
        "h_bucket": "histogram",
        "h_count": "histogram",
        "h_sum": "histogram",
        "h_created": "histogram",
        "s": "summary",
        "s_count": "summary",
        "s_sum": "summary",
        "s_created": "summary",
    }
