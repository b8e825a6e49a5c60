"""Every read of entries loads no more than its byte limit (invariant I9).

A queue of 1 MiB payloads is read with a limit of 500 entries and 2 MiB: each
read returns the two entries that fit, and the Python memory it allocates
(``tracemalloc``: the driver's copies and the entries) stays a small multiple
of the limit, not the 24 MiB the queue holds.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.byte_bounds import ENTRY_OVERHEAD
from lr_server.sending.fanout import LogFanout

MIB = 1024 * 1024
COUNT = 24
LIMIT = 2 * (MIB + ENTRY_OVERHEAD)  # exactly two entries
#: Allocated by one read at most: the entries it returns and the driver's copy of them.
READ_PEAK = 3 * LIMIT


def _payloads() -> list[bytes]:
    return [i.to_bytes(2, "big") + os.urandom(MIB - 2) for i in range(COUNT)]


def _traced(read: Callable[[], Any]) -> tuple[Any, int]:
    """The read's result and the most memory it allocated at once."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = read()
        return result, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


@pytest.fixture
def queued(store: SQLAlchemyQueueStore) -> list[bytes]:
    payloads = _payloads()
    nums = store.sites.register_sites(["b", "c"])
    with store.write() as conn:
        store.send.append_log_entries(
            conn, "policy", [(p, [nums["b"], nums["c"]]) for p in payloads]
        )
    return payloads


def test_a_destinations_reads_load_only_what_fits(
    store: SQLAlchemyQueueStore, queued: list[bytes]
) -> None:
    got: list[bytes] = []
    while len(got) < COUNT:
        after = len(got)
        batch, peak = _traced(
            lambda a=after: store.shipping.read_log_entries("b", "policy", a, 500, max_bytes=LIMIT)
        )
        assert [e.position for e in batch] == [after + 1, after + 2]
        assert peak < READ_PEAK, peak
        got += [e.payload for e in batch]
    assert got == queued


def test_the_shared_readers_reads_load_only_what_fits(
    store: SQLAlchemyQueueStore, queued: list[bytes]
) -> None:
    rows, peak = _traced(lambda: store.shipping.read_client_log("policy", 0, 500, max_bytes=LIMIT))
    assert [e.payload for e in rows] == queued[:2] and not rows.complete
    assert peak < READ_PEAK, peak
    rest = store.shipping.read_client_log("policy", 2, 500)
    assert [e.payload for e in rest] == queued[2:] and rest.complete


def test_snapshot_reads_load_only_what_fits(store: SQLAlchemyQueueStore) -> None:
    payloads = _payloads()
    sid = store.snapshots.request_snapshot(None, "b", "policy", "test")
    assert store.snapshots.start_snapshot(sid) is not None
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, sid, 0, payloads)
    store.snapshot_entries.finish_snapshot(sid)
    got: list[bytes] = []
    while True:
        after = len(got)
        batch, peak = _traced(
            lambda a=after: store.snapshot_entries.read_snapshot_entries(
                sid, a, 500, max_bytes=LIMIT
            )
        )
        assert peak < READ_PEAK, peak
        if batch[-1].type is ReplicationType.LAST_FULL_SYNC_ENTRY:
            assert [e.position for e in batch] == [after + 1]
            break
        assert [e.position for e in batch] == [after + 1, after + 2]
        got += [e.payload for e in batch]
    assert got == payloads


def test_the_subscribers_reads_load_only_what_fits(store: SQLAlchemyQueueStore) -> None:
    payloads = _payloads()
    log = ReplicationType.LOG_ENTRY_SYNC
    store.recv.apply_log_batch(
        "a", "policy", [WireEntry(i + 1, log, p) for i, p in enumerate(payloads)]
    )
    (queue,) = store.queues.list_queues("policy")
    with store.read() as conn:
        head, peak = _traced(lambda: store.heads.read_head(conn, queue.queue_id, 500, LIMIT))
        assert [e.source_position for e in head] == [1, 2]
        assert [e.payload for e in head] == payloads[:2]
        assert peak < READ_PEAK, peak
        assert len(store.heads.read_head(conn, queue.queue_id, 500)) == COUNT
        assert len(store.heads.read_head(conn, queue.queue_id, 500, 1)) == 1  # never empty


def test_the_shared_window_and_its_reads_stay_within_its_bytes(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the shared reader holds, counting the read in progress, never passes its limit."""
    nums = store.sites.register_sites(["b", "c"])
    payloads = [b"%04d" % i + bytes(996) for i in range(200)]
    with store.write() as conn:
        store.send.append_log_entries(
            conn, "policy", [(p, [nums["b"], nums["c"]]) for p in payloads]
        )
    fanout = LogFanout(store.shipping, max_bytes=10_000, read_batch=100, min_refresh_interval=0)
    held: list[int] = []
    real = store.shipping.read_client_log

    def watched(client: str, after: int, limit: int, max_bytes: int | None) -> Any:
        rows = real(client, after, limit, max_bytes)
        held.append(fanout._windows[client].nbytes + sum(len(e.payload) for e in rows))
        return rows

    monkeypatch.setattr(store.shipping, "read_client_log", watched)
    got: dict[str, list[bytes]] = {"b": [], "c": []}
    while any(len(v) < len(payloads) for v in got.values()):
        for dest, out in got.items():
            batch = fanout.read(dest, "policy", len(out), 500, max_bytes=3_000)
            # Two entries of 1,000 bytes (+ overhead) fit in 3,000, a third does not.
            assert len(batch) == min(2, len(payloads) - len(out)), (dest, len(out))
            out += [e.payload for e in batch]
    assert got == {"b": payloads, "c": payloads}
    assert held and max(held) <= fanout.max_bytes, max(held)
    assert max(w.nbytes for w in fanout._windows.values()) <= fanout.max_bytes


class _Batches(RoutingQueueListener):
    """Records the source positions of each callback batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.batches.append([m.source_position for m in messages])
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        raise AssertionError("no snapshot here")


def test_the_subscriber_delivers_batches_within_its_byte_limit(
    store: SQLAlchemyQueueStore,
) -> None:
    log = ReplicationType.LOG_ENTRY_SYNC
    sizes = [100, 100, 900, 100, 2_000, 100, 100, 100]
    entries = [WireEntry(i + 1, log, bytes(n)) for i, n in enumerate(sizes)]
    store.recv.apply_log_batch("a", "policy", entries)
    listener = _Batches()
    with RoutingQueueSubscriber(
        store, "policy", listener, batch_size=500, batch_max_bytes=1_000
    ) as sub:
        assert sub.poll_once() == len(sizes)
    # Entries gather while they fit in 1,000 bytes (with the per-entry overhead);
    # the 2,000-byte entry comes alone.
    assert listener.batches == [[1, 2], [3], [4], [5], [6, 7, 8]]


@pytest.mark.parametrize("value", [0, -1])
def test_the_subscribers_byte_limit_is_validated(store: SQLAlchemyQueueStore, value: int) -> None:
    with pytest.raises(ValueError, match="batch_max_bytes"):
        RoutingQueueSubscriber(store, "policy", _Batches(), batch_max_bytes=value)
