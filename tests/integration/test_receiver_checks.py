"""The receiver without the transport, on SQLite and PostgreSQL: negotiation, drop notices,
what an applied batch counts and stores, field by field.

Batches go in as the gRPC service hands them over (protobuf messages); what
comes back (responses, acknowledgements, errors) and what the store then holds
is compared whole.
"""

from __future__ import annotations

import logging
import time
import types

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import IncompatibleVersionError, ProtocolError
from lr_client.records import ReplicationType, SinkSnapshotState
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.core import StoreCore
from lr_client.store.schema import tables as schema
from lr_server.protocol import versions as protocol
from lr_server.receiving.receiver import Receiver
from tests.integration.test_sink_exactly_once import CLIENT, SOURCE, log_batch, snapshot_batch


@pytest.fixture
def receiver(store: SQLAlchemyQueueStore) -> Receiver:
    return Receiver(store, "sink-b", [SOURCE])


def _queued(store: SQLAlchemyQueueStore, client: str = CLIENT) -> list[tuple[object, ...]]:
    """(type, position, payload, snapshot id, snapshot count) of the client's queue, in order."""
    (queue,) = store.queues.list_queues(client)
    with store.read() as conn:
        got = store.queues.read_queue(conn, queue.queue_id, 100)
    return [(e.type, e.source_position, e.payload, e.snapshot_id, e.snapshot_count) for e in got]


def notice(
    notice_id: str = "d1",
    position: int = 6,
    reason: bytes = b"lost",
    kind: str = "STREAM_DROPPED",
    count: int = 1,
    batch_id: int = 41,
) -> pb.ReplicationBatch:
    entries = [
        pb.RoutingTableEntryMsg(type=kind, position=position + i, opaque_payload=reason)  # type: ignore[arg-type]
        for i in range(count)
    ]
    return pb.ReplicationBatch(
        batch_id=batch_id,
        client_name=CLIENT,
        kind=pb.BATCH_DROP_NOTICE,
        snapshot_id=notice_id,
        entries=entries,
    )


def _applied(metric: str, source: str, client: str) -> float:
    value = REGISTRY.get_sample_value(f"{metric}_total", {"source": source, "client": client})
    return value or 0.0


# -- negotiation ------------------------------------------------------------------------------
def test_negotiation_reports_what_the_sink_holds_of_each_client_of_that_source(
    store: SQLAlchemyQueueStore, receiver: Receiver
) -> None:
    receiver.apply(SOURCE, log_batch(0, [1, 2, 5]))
    orders = snapshot_batch("s1", 0, [1, 2])
    orders.client_name = "orders"
    receiver.apply(SOURCE, orders)
    audit = snapshot_batch("s7", 0, [1, 2, 3], end=True, base=9)
    audit.client_name = "audit"
    receiver.apply(SOURCE, audit)
    other = log_batch(0, [1, 2, 3, 4])
    other.source_id = "src-c"
    other.client_name = "fresh"
    Receiver(store, "sink-b", ["src-c"]).apply("src-c", other)

    request = pb.NegotiateRequest(
        source_id=SOURCE, clients=["orders", CLIENT, "fresh", "audit"], protocol_version=2
    )
    response = receiver.negotiate(SOURCE, request)
    assert (response.sink_id, response.drop_notices) == ("sink-b", True)
    assert response.protocol_version == protocol.PROTOCOL_VERSION
    got = [
        (c.client_name, c.last_position, c.snapshot_state, c.snapshot_id, c.snapshot_position)
        for c in response.clients
    ]
    assert got == [
        ("orders", 0, pb.SNAPSHOT_ONGOING, "s1", 2),
        (CLIENT, 5, pb.SNAPSHOT_NONE, "", 0),
        ("fresh", 0, pb.SNAPSHOT_NONE, "", 0),  # src-c's progress is not src-a's
        ("audit", 9, pb.SNAPSHOT_COMPLETED, "s7", 3),
    ]
    # A request without a source id is the caller's; one naming another source is refused.
    unnamed = receiver.negotiate(SOURCE, pb.NegotiateRequest(clients=[CLIENT]))
    assert [(c.client_name, c.last_position) for c in unnamed.clients] == [(CLIENT, 5)]
    # A relayed client's progress is its origin's, and the answer names that origin.
    relayed = pb.NegotiateRequest(
        clients=["fresh", CLIENT], relays=[pb.RelayedClient(client_name="fresh", origin_id="src-c")]
    )
    got = [
        (c.client_name, c.last_position, c.origin_id)
        for c in receiver.negotiate(SOURCE, relayed).clients
    ]
    assert got == [("fresh", 4, "src-c"), (CLIENT, 5, "")]
    for relay, error in (
        (
            pb.RelayedClient(client_name="Bad_Name", origin_id="src-c"),
            "invalid client name 'Bad_Name'",
        ),
        (pb.RelayedClient(client_name="fresh", origin_id="-c"), "invalid origin id '-c'"),
    ):
        with pytest.raises(ProtocolError) as caught:
            receiver.negotiate(SOURCE, pb.NegotiateRequest(clients=["fresh"], relays=[relay]))
        assert str(caught.value).startswith(error)
    # It answers with the codecs offered that it can decode, and its own message limit.
    offered = pb.NegotiateRequest(clients=[CLIENT], codecs=["brotli", "zlib"])
    answer = Receiver(store, "sink-b", [SOURCE], max_message_bytes=4096).negotiate(SOURCE, offered)
    assert (list(answer.codecs), answer.max_message_bytes) == (["zlib"], 4096)
    assert list(unnamed.codecs) == [] and unnamed.max_message_bytes == 65 * 1024 * 1024
    with pytest.raises(ProtocolError) as caught:
        receiver.negotiate(SOURCE, pb.NegotiateRequest(source_id="src-z", clients=[CLIENT]))
    assert str(caught.value) == "negotiation names source 'src-z', not 'src-a'"
    with pytest.raises(ProtocolError) as caught:
        receiver.negotiate(SOURCE, pb.NegotiateRequest(clients=[CLIENT, "Bad_Name"]))
    assert str(caught.value).startswith("invalid client name 'Bad_Name'")


def test_a_receiver_keeps_its_settings(store: SQLAlchemyQueueStore) -> None:
    receiver = Receiver(store, "sink-b", [SOURCE, "src-c", SOURCE])
    assert receiver.store is store and receiver.sink_id == "sink-b"
    assert receiver.accepted_sources == frozenset({SOURCE, "src-c"})
    assert receiver.max_batch_entries == 100_000


def test_a_sink_that_serves_no_cascade_refuses_a_report_and_says_which_sink(
    receiver: Receiver,
) -> None:
    with pytest.raises(ProtocolError) as caught:
        receiver.cascade("leaf-c", pb.CascadeReport())
    assert str(caught.value) == "sink-b does not serve cascade reports"


# -- drop notices -----------------------------------------------------------------------------
def test_a_drop_notice_is_queued_once_acknowledged_and_logged(
    store: SQLAlchemyQueueStore, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.apply(SOURCE, log_batch(0, [1, 2, 3, 7]))
    caplog.set_level(logging.WARNING, logger="lr.receiver")
    ack = receiver.apply(SOURCE, notice("d1", 6, "lost ✓".encode(), batch_id=41))
    assert (ack.batch_id, ack.client_name, ack.last_position, ack.duplicate) == (
        41,
        CLIENT,
        6,
        False,
    )
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("lr.receiver", "WARNING", "src-a/policy: stream dropped from position 6: lost ✓")
    ]
    caplog.clear()
    again = receiver.apply(SOURCE, notice("d1", 6, "lost ✓".encode(), batch_id=42))
    assert (again.batch_id, again.client_name, again.last_position, again.duplicate) == (
        42,
        CLIENT,
        6,
        True,
    )
    assert caplog.records == []
    log_entry = ReplicationType.LOG_ENTRY_SYNC
    assert _queued(store) == [
        (log_entry, 1, b"log-1", "", 0),
        (log_entry, 2, b"log-2", "", 0),
        (log_entry, 3, b"log-3", "", 0),
        (log_entry, 7, b"log-7", "", 0),
        (ReplicationType.STREAM_DROPPED, 6, "lost ✓".encode(), "d1", 0),
    ]
    (drop,) = store.recv.list_sink_drops()
    assert (drop.source_id, drop.client_name, drop.notice_id) == (SOURCE, CLIENT, "d1")
    assert (drop.first_dropped_position, drop.reason) == (6, "lost ✓")
    assert store.recv.sink_progress(SOURCE, CLIENT).last_position == 5


def _bad_notices() -> list[tuple[str, pb.ReplicationBatch, str]]:
    claims = notice()
    claims.source_id = "src-z"
    bad_client = notice()
    bad_client.client_name = "Bad_Name"
    empty = notice(count=0)
    return [
        ("another source", claims, "batch claims source 'src-z', sender is 'src-a'"),
        ("bad client name", bad_client, "invalid client name 'Bad_Name'"),
        ("no entry", empty, "a drop notice holds exactly one STREAM_DROPPED entry"),
        ("two entries", notice(count=2), "a drop notice holds exactly one STREAM_DROPPED entry"),
        (
            "a log entry",
            notice(kind="LOG_ENTRY_SYNC"),
            "a drop notice holds exactly one STREAM_DROPPED entry",
        ),
        ("id not alnum", notice("d-1"), "invalid snapshot id 'd-1'"),
        ("no id", notice(""), "invalid snapshot id ''"),
        ("id too long", notice("d" * 65), "invalid snapshot id '%s'" % ("d" * 65)),
        ("reason not UTF-8", notice(reason=b"\xff\xfe"), "drop notice reason is not UTF-8"),
    ]


@pytest.mark.parametrize(
    "batch, message",
    [pytest.param(b, m, id=name.replace(" ", "-")) for name, b, m in _bad_notices()],
)
def test_a_bad_drop_notice_is_refused_with_its_reason_and_stores_nothing(
    store: SQLAlchemyQueueStore, receiver: Receiver, batch: pb.ReplicationBatch, message: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        receiver.apply(SOURCE, batch)
    assert str(caught.value) == message or (
        message.startswith("invalid client name") and str(caught.value).startswith(message)
    ), str(caught.value)
    assert store.recv.list_sink_drops() == [] and store.queues.list_queues() == []


def test_a_drop_notice_of_the_longest_id_is_accepted(
    store: SQLAlchemyQueueStore, receiver: Receiver
) -> None:
    longest = "D" * 64
    assert receiver.apply(SOURCE, notice(longest, 1, b"")).duplicate is False
    assert [(d.notice_id, d.reason) for d in store.recv.list_sink_drops()] == [(longest, "")]


# -- what an applied batch stores and counts ---------------------------------------------------
def test_a_refused_snapshot_id_is_quoted_up_to_80_characters(receiver: Receiver) -> None:
    sid = "".join(chr(ord("a") + i % 26) for i in range(100))
    with pytest.raises(ProtocolError) as caught:
        receiver.apply(SOURCE, snapshot_batch(sid, 0, [1]))
    assert str(caught.value) == f"invalid snapshot id {sid[:80]!r}"


def test_snapshot_entries_are_stored_with_their_count_and_the_end_sets_the_base(
    store: SQLAlchemyQueueStore, receiver: Receiver
) -> None:
    ack = receiver.apply(SOURCE, snapshot_batch("s1", 0, [1, 2, 3, 4], end=True, base=17))
    assert (ack.client_name, ack.last_position, ack.duplicate) == (CLIENT, 4, False)
    snap, end = ReplicationType.SNAPSHOT_SYNC, ReplicationType.LAST_FULL_SYNC_ENTRY
    assert _queued(store) == [
        (snap, 1, b"s1-1", "s1", 0),
        (snap, 2, b"s1-2", "s1", 0),
        (snap, 3, b"s1-3", "s1", 0),
        (end, 4, b"", "s1", 3),
    ]
    progress = store.recv.sink_progress(SOURCE, CLIENT)
    assert (progress.last_position, progress.snapshot_state) == (17, SinkSnapshotState.COMPLETED)
    assert (progress.snapshot_id, progress.snapshot_position) == ("s1", 4)


def test_applied_entries_and_bytes_are_counted_per_source_and_client_once(
    store: SQLAlchemyQueueStore, receiver: Receiver
) -> None:
    client = "metered"
    before = (
        _applied("lr_entries_applied", SOURCE, client),
        _applied("lr_bytes_applied", SOURCE, client),
    )

    def counted() -> tuple[float, float]:
        return (
            _applied("lr_entries_applied", SOURCE, client) - before[0],
            _applied("lr_bytes_applied", SOURCE, client) - before[1],
        )

    batch = log_batch(0, [1, 2, 3])  # payloads log-1..log-3: 5 bytes each
    batch.client_name = client
    receiver.apply(SOURCE, batch)
    assert counted() == (3.0, 15.0)
    receiver.apply(SOURCE, batch)  # a duplicate: not counted again
    assert counted() == (3.0, 15.0)
    snap = snapshot_batch("s1", 0, [1, 2], end=True)  # b"s1-1" (4 bytes) and the empty end
    snap.client_name = client
    receiver.apply(SOURCE, snap)
    assert counted() == (5.0, 19.0)
    drop = notice("d1", 9, b"gone")
    drop.client_name = client
    receiver.apply(SOURCE, drop)  # a drop notice is not an applied entry
    assert counted() == (5.0, 19.0)
    assert _applied("lr_entries_applied", "None", client) == 0.0
    assert _applied("lr_entries_applied", SOURCE, "None") == 0.0


def test_negotiation_refuses_a_source_older_than_the_oldest_version_accepted(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    monkeypatch.setattr(protocol, "MIN_PEER_VERSION", 2)
    with pytest.raises(IncompatibleVersionError) as caught:
        receiver.negotiate(SOURCE, pb.NegotiateRequest(clients=[CLIENT]))  # no version: 1
    assert str(caught.value) == (
        "source 'src-a' speaks wire protocol 1; this release needs 2 or newer "
        f"(it speaks {protocol.PROTOCOL_VERSION}): upgrade source 'src-a'"
    )
    response = receiver.negotiate(SOURCE, pb.NegotiateRequest(clients=[CLIENT], protocol_version=2))
    assert [c.client_name for c in response.clients] == [CLIENT]


def _portable(store: SQLAlchemyQueueStore) -> SQLAlchemyQueueStore:
    """The same store with the portable receive insert instead of its dialect's fast path."""
    portable = open_store(store.engine)
    core = portable.core
    core.append_recv = types.MethodType(StoreCore.append_recv, core)  # type: ignore[method-assign]
    return portable


def test_the_portable_receive_insert_stores_what_the_fast_paths_store(
    store: SQLAlchemyQueueStore,
) -> None:
    batches = [
        log_batch(0, [1, 2]),
        snapshot_batch("s1", 0, [1, 2, 3], end=True, base=2),
        notice("d1", 3, b"gone"),
    ]
    portable = _portable(store)
    before = time.time()
    for batch in batches:
        Receiver(portable, "sink-b", [SOURCE]).apply(SOURCE, batch)
        batch.client_name = "fast"
        Receiver(store, "sink-b", [SOURCE]).apply(SOURCE, batch)
    assert _queued(store, CLIENT) == _queued(store, "fast")
    snap, end = ReplicationType.SNAPSHOT_SYNC, ReplicationType.LAST_FULL_SYNC_ENTRY
    log_entry = ReplicationType.LOG_ENTRY_SYNC
    assert _queued(store, CLIENT) == [
        (log_entry, 1, b"log-1", "", 0),
        (log_entry, 2, b"log-2", "", 0),
        (snap, 1, b"s1-1", "s1", 0),
        (snap, 2, b"s1-2", "s1", 0),
        (end, 3, b"", "s1", 2),
        (ReplicationType.STREAM_DROPPED, 3, b"gone", "d1", 0),
    ]
    (queue,) = store.queues.list_queues(CLIENT)
    r = schema.recv_entries
    with store.read() as conn:
        times = conn.execute(
            select(r.c.received_at).where(r.c.queue_id == queue.queue_id).order_by(r.c.seq)
        ).scalars()
        stamped = [t for t in times]
    assert len(stamped) == 6 and stamped[0] == stamped[1]  # one time stamp per batch
    assert all(before <= t <= time.time() for t in stamped)


# -- replayed batches -------------------------------------------------------------------------
def _replayed(positions: list[int], batch_id: int = 51, **fields: object) -> pb.ReplicationBatch:
    batch = log_batch(0, positions)
    batch.batch_id, batch.replay = batch_id, True
    if "lane" in fields:
        batch.lane = fields["lane"]  # type: ignore[assignment]
    if fields.get("empty"):
        del batch.entries[:]
    return batch


def test_a_replayed_batch_is_queued_again_acknowledged_counted_and_logged(
    store: SQLAlchemyQueueStore, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.apply(SOURCE, log_batch(0, [1, 2, 3]))
    before = _applied("lr_entries_replayed", SOURCE, CLIENT)
    caplog.set_level(logging.INFO, logger="lr.receiver")
    # Negotiated or not (a sink restarted since), a source may replay.
    ack = receiver.apply(SOURCE, _replayed([2, 3]))
    assert (ack.batch_id, ack.client_name, ack.last_position, ack.duplicate) == (
        51,
        CLIENT,
        3,
        False,
    )
    assert _applied("lr_entries_replayed", SOURCE, CLIENT) == before + 2
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "src-a/policy: replayed 2..3 queued again")
    ]
    assert [q[1] for q in _queued(store)] == [1, 2, 3, 2, 3]
    assert store.recv.sink_progress(SOURCE, CLIENT).last_position == 3  # the position stays
    caplog.clear()
    beyond = receiver.apply(SOURCE, _replayed([9], batch_id=52))  # nothing held there
    assert (beyond.batch_id, beyond.client_name, beyond.last_position, beyond.duplicate) == (
        52,
        CLIENT,
        9,
        True,
    )
    assert _applied("lr_entries_replayed", SOURCE, CLIENT) == before + 2
    assert caplog.records == []


def test_a_replayed_batch_the_sink_cannot_take_is_refused_with_its_reason(
    store: SQLAlchemyQueueStore, receiver: Receiver
) -> None:
    receiver.apply(SOURCE, log_batch(0, [1, 2]))
    held = _queued(store)
    snapshot = snapshot_batch("s1", 0, [1])
    snapshot.replay = True
    bad = [
        (_replayed([2], lane=1), "a replayed batch holds log entries, on no lane"),
        (snapshot, "a replayed batch holds log entries, on no lane"),
        (_replayed([2], empty=True), "a replayed batch holds log entries, on no lane"),
    ]
    wrong_type = _replayed([2])
    wrong_type.entries[0].type = "SNAPSHOT_SYNC"  # type: ignore[assignment]
    bad.append((wrong_type, "log entry batch holds entries of another type"))
    for batch, reason in bad:
        with pytest.raises(ProtocolError) as refused:
            receiver.apply(SOURCE, batch)
        assert str(refused.value) == reason
    old = pb.NegotiateRequest(source_id=SOURCE, clients=[CLIENT], protocol_version=5)
    receiver.negotiate(SOURCE, old)
    with pytest.raises(ProtocolError) as refused:
        receiver.apply(SOURCE, _replayed([2]))
    assert str(refused.value) == f"{SOURCE} negotiated a protocol without replay"
    assert _queued(store) == held
