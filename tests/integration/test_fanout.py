"""The shared reader returns exactly what each session's own read would (both backends)."""

from __future__ import annotations

import random

import pytest

from lr_client.records import LogRange, SendEntry
from lr_client.store import SQLAlchemyQueueStore
from lr_server.fanout import LogFanout

DESTS = ["b", "c", "d", "e"]
CLIENTS = ["policy", "orders"]


def _key(entries: list[SendEntry]) -> list[tuple[int, str, bytes, float]]:
    return [(e.position, e.client_name, e.payload, e.created_at) for e in entries]


def _transmit(store: SQLAlchemyQueueStore, rng: random.Random, n: int) -> None:
    nums = store.site_numbers()
    with store.write() as conn:
        for _ in range(n):
            client = rng.choice(CLIENTS)
            dests = rng.sample(DESTS, rng.randint(1, len(DESTS)))
            payload = rng.randbytes(rng.randint(1, 300))
            store.append_log_entries(conn, client, [(payload, [nums[d] for d in dests])])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fanout_reads_equal_direct_reads(store: SQLAlchemyQueueStore, seed: int) -> None:
    """Random transmits and session reads, rewinds (reconnects) and jumps (snapshots).

    A tiny window (7 entries, 3 per refresh) makes every path run: serving from the
    window, refreshing at its end, evicting under a reader, restarting it, and
    falling back to direct reads for a stream behind it.
    """
    rng = random.Random(seed)
    store.register_sites(DESTS)
    fanout = LogFanout(store, max_entries=7, max_bytes=900, read_batch=3, min_refresh_interval=0)
    sent = {(d, c): 0 for d in DESTS for c in CLIENTS}
    acked = dict(sent)
    for _ in range(400):
        op = rng.random()
        if op < 0.3:
            _transmit(store, rng, rng.randint(1, 6))
            continue
        stream = rng.choice(sorted(sent))
        if op < 0.35:  # reconnect: resume from the last acknowledged position
            sent[stream] = acked[stream]
            continue
        if op < 0.38:  # a full sync: log entries resume after its base (the head)
            sent[stream] = acked[stream] = store.head_position()
            continue
        dest, client = stream
        limit = rng.randint(1, 6)
        max_bytes = rng.choice([None, 200, 700])
        expected = store.read_log_entries(dest, client, sent[stream], limit, max_bytes=max_bytes)
        got = fanout.read(dest, client, sent[stream], limit, max_bytes=max_bytes)
        assert _key(got) == _key(expected), (stream, sent[stream], limit, max_bytes)
        if got:
            sent[stream] = got[-1].position
            if rng.random() < 0.7:
                acked[stream] = sent[stream]
    assert fanout.hits > 0 and fanout.misses > 0  # both paths ran


def test_one_read_of_the_database_serves_every_destination(
    store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.register_sites(DESTS)
    nums = store.site_numbers()
    with store.write() as conn:
        store.append_log_entries(
            conn, "policy", [(b"x%d" % i, [nums[d] for d in DESTS]) for i in range(50)]
        )
    calls: list[int] = []
    real = store.read_client_log

    def counted(client_name: str, after: int, limit: int, max_bytes: int | None) -> LogRange:
        calls.append(after)
        return real(client_name, after, limit, max_bytes)

    monkeypatch.setattr(store, "read_client_log", counted)
    fanout = LogFanout(store, min_refresh_interval=60.0)
    for dest in DESTS:
        got = fanout.read(dest, "policy", 0, 100)
        assert [e.payload for e in got] == [b"x%d" % i for i in range(50)]
    assert calls == [0]  # read once, for all four destinations
    assert fanout.misses == 0
