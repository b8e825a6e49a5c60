"""Sender sessions and sink receivers over real gRPC on loopback, on both backends."""

from __future__ import annotations

from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.store import SQLAlchemyQueueStore
from tests.kit.sites import Sites, wait_for


def transmit(store: SQLAlchemyQueueStore, source: str, rows: list[tuple[bytes, list[str]]]) -> None:
    client = RoutingQueueClient(store, source_id=source, client_name="policy")
    client.register_destinations(sorted({d for _, ds in rows for d in ds}))
    with Session(store.engine) as session, session.begin():
        for payload, dests in rows:
            client.transmit_log_entry_message(session, payload, dests)


def received(store: SQLAlchemyQueueStore, source: str, client: str = "policy") -> list[bytes]:
    queues = [q for q in store.queues.list_queues(client) if q.source_id == source]
    if not queues:
        return []
    with store.read() as conn:
        return [e.payload for e in store.queues.read_queue(conn, queues[0].queue_id, 100_000)]


def test_one_source_three_sinks_with_overlapping_destinations(sites: Sites) -> None:
    for sink in ("b", "c", "d"):
        sites.start(sink, sources=["a"])
    server = sites.start("a", dests=["b", "c", "d"])
    src = sites.store("a")
    rows = [
        (b"bc", ["b", "c"]),
        (b"cd", ["c", "d"]),
        (b"bd", ["b", "d"]),
        (b"bcd", ["b", "c", "d"]),
    ]
    transmit(src, "a", rows * 10)
    expect = {s: [p for p, ds in rows * 10 if s in ds] for s in ("b", "c", "d")}
    stores = {s: sites.store(s) for s in expect}
    wait_for(lambda: all(received(stores[s], "a") == expect[s] for s in expect))
    progress = stores["b"].recv.sink_progress("a", "policy")
    assert progress.entries_received == len(expect["b"])
    assert server.reader is not None and server.reader.hits > 0  # the shared reader served


def test_three_sources_one_sink(sites: Sites) -> None:
    sites.start("sink", sources=["s1", "s2", "s3"])
    for src in ("s1", "s2", "s3"):
        sites.start(src, dests=["sink"])
        transmit(sites.store(src), src, [(f"{src}-{i}".encode(), ["sink"]) for i in range(20)])
    sink = sites.store("sink")
    wait_for(
        lambda: all(
            received(sink, src) == [f"{src}-{i}".encode() for i in range(20)]
            for src in ("s1", "s2", "s3")
        )
    )
    names = sorted(q.queue_name for q in sink.queues.list_queues("policy"))
    assert names == ["LRQ_Recv_policy__s1", "LRQ_Recv_policy__s2", "LRQ_Recv_policy__s3"]


def test_sink_restarted_mid_stream_loses_and_duplicates_nothing(sites: Sites) -> None:
    sites.start("b", sources=["a"])
    sites.start("a", dests=["b"])
    src, sink = sites.store("a"), sites.store("b")
    expected: list[bytes] = []
    for round_ in range(4):
        batch = [(f"{round_}-{i}".encode(), ["b"]) for i in range(50)]
        transmit(src, "a", batch)
        expected += [p for p, _ in batch]
        if round_ % 2 == 0:
            sites.stop("b")
        else:
            sites.start("b", sources=["a"])
    if "b" not in sites.running:
        sites.start("b", sources=["a"])
    wait_for(lambda: len(received(sink, "a")) >= len(expected))
    wait_for(lambda: src.shipping.get_cursor("b", "policy").position == src.send.head_position())
    assert received(sink, "a") == expected


def test_a_destination_that_never_comes_up_does_not_stop_others(sites: Sites) -> None:
    sites.start("c", sources=["a"])
    sites.start("a", dests=["b", "c"])  # b never starts
    src, sink_c = sites.store("a"), sites.store("c")
    transmit(src, "a", [(b"%d" % i, ["b", "c"]) for i in range(30)])
    wait_for(lambda: len(received(sink_c, "a")) == 30)
    assert src.shipping.get_cursor("b", "policy").position == 0
    assert src.shipping.backlog("b", "policy").entries == 30
    wait_for(
        lambda: any(
            s["destination"] == "b" and not s["connected"]
            for s in src.inspection.list_session_status()
        )
    )
