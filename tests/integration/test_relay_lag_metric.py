"""``lr_relay_lag_seconds{client,origin}``: origin transmit time -> applied here, per entry."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY

from lr_client.store import SQLAlchemyQueueStore
from lr_server.receiving.receiver import Receiver
from tests.integration.test_sink_exactly_once import CLIENT, SOURCE, log_batch


def _lag(suffix: str) -> float:
    value = REGISTRY.get_sample_value(
        f"lr_relay_lag_seconds_{suffix}", {"client": CLIENT, "origin": SOURCE}
    )
    return value or 0.0


def test_each_applied_entry_with_an_origin_time_is_observed(store: SQLAlchemyQueueStore) -> None:
    receiver = Receiver(store, "sink-b", [SOURCE])
    count, total = _lag("count"), _lag("sum")
    batch = log_batch(0, [1, 2, 3])
    stamped = time.time() - 2.0
    batch.entries[0].origin_time = stamped
    batch.entries[1].origin_time = stamped  # the third carries none: not a cascaded entry
    before = time.time()
    receiver.apply(SOURCE, batch)
    after = time.time()
    assert _lag("count") - count == 2
    assert 2 * (before - stamped) <= _lag("sum") - total <= 2 * (after - stamped)
    # A duplicate is not applied again, so not observed again.
    receiver.apply(SOURCE, batch)
    assert _lag("count") - count == 2


def test_entries_without_an_origin_time_are_not_observed(store: SQLAlchemyQueueStore) -> None:
    receiver = Receiver(store, "sink-b", [SOURCE])
    count = _lag("count")
    receiver.apply(SOURCE, log_batch(0, [1, 2]))
    assert _lag("count") == count


def test_a_recent_entry_observes_its_lag_and_a_skewed_clock_observes_zero(
    store: SQLAlchemyQueueStore,
) -> None:
    receiver = Receiver(store, "sink-b", [SOURCE])
    count, total = _lag("count"), _lag("sum")
    batch = log_batch(0, [1, 2])
    stamped = time.time() - 0.25
    batch.entries[0].origin_time = stamped
    batch.entries[1].origin_time = stamped + 60.0  # the origin's clock runs ahead
    before = time.time()
    receiver.apply(SOURCE, batch)
    after = time.time()
    assert _lag("count") - count == 2
    # The first's own lag (not rounded up to a second); the second's is 0, not -60.
    assert before - stamped <= _lag("sum") - total <= after - stamped
