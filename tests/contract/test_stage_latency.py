"""The per-stage latency rows (:mod:`lr_client.store.ops.latency`) on each backend."""

from __future__ import annotations

import time

from lr_client.store.contract import QueueStore
from lr_client.store.ops.latency import StageLatency


def test_rows_are_written_replaced_and_listed_in_order(store: QueueStore) -> None:
    assert store.latency.list_stage_latency() == []
    before = time.time()
    store.latency.save_stage_latency(
        [
            StageLatency("b", "policy", "stored", 3, 0.004, 0.009, 0.012),
            StageLatency("a", "policy", "applied", 1, 0.02, 0.02, 0.02),
        ]
    )
    store.latency.save_stage_latency([StageLatency("b", "policy", "stored", 5, 0.003, 0.008, 0.01)])
    rows = store.latency.list_stage_latency()
    assert [(r.peer, r.stage, r.batches, r.p50, r.p99, r.max) for r in rows] == [
        ("a", "applied", 1, 0.02, 0.02, 0.02),
        ("b", "stored", 5, 0.003, 0.008, 0.01),
    ]
    assert all(r.updated_at >= before for r in rows)
    assert rows[0].to_dict()["client_name"] == "policy"
