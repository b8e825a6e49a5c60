"""Read a running ``lr server``'s Prometheus metrics (its ``--metrics-port``)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric_sum(port: int, sample: str, **labels: str) -> float | None:
    """The sum of ``sample`` over the series matching ``labels`` (None: not reachable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return None
    return sum(
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )
