"""The per-stage latency book (:mod:`lr_client.latency`): summaries of the last batches
of each stage, written at most once per interval, kept when the store cannot take them."""

from __future__ import annotations

from collections.abc import Sequence

from lr_client.errors import StoreUnavailableError
from lr_client.latency import StageBook, percentile
from lr_client.store.ops.latency import StageLatency


class Store:
    def __init__(self) -> None:
        self.saved: list[list[StageLatency]] = []
        self.fail = False

    def save_stage_latency(self, rows: Sequence[StageLatency]) -> None:
        if self.fail:
            raise StoreUnavailableError("down")
        self.saved.append(list(rows))

    def list_stage_latency(self) -> list[StageLatency]:
        return [r for rows in self.saved for r in rows]


def test_percentiles_are_nearest_ranks() -> None:
    ordered = [float(i) for i in range(1, 101)]
    assert (percentile(ordered, 0.5), percentile(ordered, 0.99)) == (51.0, 100.0)
    assert percentile([3.0], 0.99) == 3.0


def test_a_summary_covers_the_last_batches_of_each_stage() -> None:
    book = StageBook(samples=4)
    for s in (9.0, 1.0, 2.0, 3.0, 4.0):  # the first one falls out
        book.add("b", "policy", "stored", s)
    book.add("b", "policy", "queued", -0.001)  # clocks a little apart: never below 0
    assert book.rows() == [
        StageLatency("b", "policy", "queued", 1, 0.0, 0.0, 0.0),
        StageLatency("b", "policy", "stored", 4, 3.0, 4.0, 4.0),
    ]


def test_summaries_are_written_at_once_then_at_most_every_interval() -> None:
    now = [100.0]
    book, store = StageBook(flush_interval=10.0, clock=lambda: now[0]), Store()
    assert not book.flush(store)  # nothing to write
    book.add("b", "policy", "sent", 0.002)
    assert book.flush(store) and len(store.saved) == 1
    book.add("b", "policy", "sent", 0.004)
    assert not book.due() and not book.flush(store)
    assert book.flush(store, force=True) and len(store.saved) == 2
    now[0] += 10.0
    assert not book.flush(store)  # due, but nothing new came
    book.add("b", "policy", "sent", 0.001)
    store.fail = True
    assert not book.flush(store)  # kept for the next try
    store.fail = False
    assert book.flush(store)
    assert store.saved[-1] == [StageLatency("b", "policy", "sent", 3, 0.002, 0.004, 0.004)]
