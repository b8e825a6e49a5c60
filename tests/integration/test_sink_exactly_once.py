"""The sink from the wire to the listener, on SQLite and PostgreSQL.

Batches go through the receiver as the gRPC service hands them over (protobuf
messages), entries reach a listener through the subscriber. Resent batches are
acknowledged as duplicates and delivered once; a batch right after what the sink
has is applied; a snapshot batch never mixes snapshots; a replayed batch of a
snapshot whose end was delivered never reaches the listener again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy.orm import Session

from lr_client import ProtocolError, RoutingQueueListener, RoutingQueueMessage
from lr_client._proto import replication_pb2 as pb
from lr_client.store import SQLAlchemyQueueStore
from lr_client.subscriber import RoutingQueueSubscriber
from lr_server.receiving.receiver import Receiver
from tests.kit.aio import SyncDriven

SOURCE = "src-a"
CLIENT = "policy"

Event = tuple[str, str, tuple[int, ...]]  # (callback, snapshot id, source positions)


class Recorder(RoutingQueueListener):
    """Records every callback, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.payloads: list[bytes] = []

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.events.append(("start", snapshot_id, ()))

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        self.events.append(("end", snapshot_id, ()))

    def _got(self, kind: str, messages: Sequence[RoutingQueueMessage]) -> bool:
        assert {m.source_id for m in messages} == {SOURCE}
        self.events.append(
            (kind, messages[0].snapshot_id, tuple(m.source_position for m in messages))
        )
        self.payloads += [m.payload for m in messages]
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return self._got("snapshot", messages)

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return self._got("log", messages)

    def on_error(self, error: BaseException) -> None:
        raise AssertionError(f"unexpected delivery error: {error!r}")


@pytest.fixture
def receiver(store: SQLAlchemyQueueStore) -> Receiver:
    return Receiver(store, "sink-b", [SOURCE])


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(params=["sync", "aio"])
def subscriber(
    request: pytest.FixtureRequest, store: SQLAlchemyQueueStore, recorder: Recorder
) -> Iterator[RoutingQueueSubscriber]:
    """The sync subscriber, or the async one driven from these tests (:mod:`tests.kit.aio`)."""
    sub: RoutingQueueSubscriber
    if request.param == "aio":
        url = store.engine.url.render_as_string(hide_password=False)
        settings = {"batch_size": 100, "retry_initial": 0.0}
        sub = SyncDriven(url, CLIENT, recorder, **settings)  # type: ignore[assignment]
    else:
        sub = RoutingQueueSubscriber(store, CLIENT, recorder, batch_size=100, retry_initial=0.0)
    yield sub
    sub.close()


_batch_ids = iter(range(1, 1_000_000))


def log_batch(previous: int, positions: Sequence[int]) -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=next(_batch_ids),
        source_id=SOURCE,
        client_name=CLIENT,
        kind=pb.BATCH_LOG_ENTRY,
        first_position=positions[0],
        last_position=positions[-1],
        previous_position=previous,
        entries=[
            pb.RoutingTableEntryMsg(
                type="LOG_ENTRY_SYNC", opaque_payload=b"log-%d" % p, position=p, client_name=CLIENT
            )
            for p in positions
        ],
    )


def snapshot_batch(
    snapshot_id: str,
    previous: int,
    positions: Sequence[int],
    end: bool = False,
    base: int = 0,
    entry_snapshot_id: str | None = None,
) -> pb.ReplicationBatch:
    """Snapshot entries at ``positions``; with ``end`` the last one is the end marker."""
    entries = [
        pb.RoutingTableEntryMsg(
            type="SNAPSHOT_SYNC",
            opaque_payload=b"%s-%d" % (snapshot_id.encode(), p),
            position=p,
            snapshot_id=entry_snapshot_id or snapshot_id,
            client_name=CLIENT,
        )
        for p in positions
    ]
    if end:
        last = entries[-1]
        last.type = "LAST_FULL_SYNC_ENTRY"
        last.opaque_payload = b""
        last.snapshot_count = len(positions) - 1
        last.base_position = base
    return pb.ReplicationBatch(
        batch_id=next(_batch_ids),
        source_id=SOURCE,
        client_name=CLIENT,
        kind=pb.BATCH_SNAPSHOT,
        snapshot_id=snapshot_id,
        first_position=positions[0],
        last_position=positions[-1],
        previous_position=previous,
        entries=entries,
    )


def deliver(sub: RoutingQueueSubscriber) -> None:
    """Deliver everything queued (one poll delivers up to max_batches per queue)."""
    while sub.poll_once():
        pass


def test_resent_log_batches_are_duplicates_and_delivered_once(
    receiver: Receiver, subscriber: RoutingQueueSubscriber, recorder: Recorder
) -> None:
    first = log_batch(0, [1, 2, 3])
    ack = receiver.apply(SOURCE, first)
    assert (ack.batch_id, ack.last_position, ack.duplicate) == (first.batch_id, 3, False)
    assert ack.client_name == CLIENT
    # The next batch starts right after the recorded position: applied.
    second = log_batch(3, [4, 5])
    ack = receiver.apply(SOURCE, second)
    assert (ack.last_position, ack.duplicate) == (5, False)
    deliver(subscriber)
    assert recorder.events == [("log", "", (1, 2, 3, 4, 5))]
    # Resent after delivery (a lost acknowledgement): acknowledged, never applied again.
    for again in (second, first, log_batch(3, [4, 5])):
        ack = receiver.apply(SOURCE, again)
        assert (ack.batch_id, ack.last_position, ack.duplicate) == (again.batch_id, 5, True)
    # A resent batch that overlaps new entries appends only the new ones.
    ack = receiver.apply(SOURCE, log_batch(3, [4, 5, 6]))
    assert (ack.last_position, ack.duplicate) == (6, False)
    deliver(subscriber)
    assert recorder.events == [("log", "", (1, 2, 3, 4, 5)), ("log", "", (6,))]
    assert recorder.payloads == [b"log-%d" % p for p in range(1, 7)]


def test_a_log_batch_after_a_gap_is_refused(
    receiver: Receiver, subscriber: RoutingQueueSubscriber, recorder: Recorder
) -> None:
    receiver.apply(SOURCE, log_batch(0, [1, 2]))
    with pytest.raises(ProtocolError):
        receiver.apply(SOURCE, log_batch(3, [4]))  # position 3 never arrived
    deliver(subscriber)
    assert recorder.events == [("log", "", (1, 2))]


def test_resent_snapshot_batches_are_duplicates_and_delivered_once(
    receiver: Receiver, subscriber: RoutingQueueSubscriber, recorder: Recorder
) -> None:
    first = snapshot_batch("s1", 0, [1, 2])
    assert receiver.apply(SOURCE, first).duplicate is False
    again = receiver.apply(SOURCE, first)  # resent while the snapshot is still coming
    assert (again.last_position, again.duplicate) == (2, True)
    # The next batch starts right after the recorded position: applied.
    end = snapshot_batch("s1", 2, [3, 4], end=True, base=9)
    ack = receiver.apply(SOURCE, end)
    assert (ack.last_position, ack.duplicate) == (4, False)
    assert receiver.apply(SOURCE, end).duplicate is True
    ack = receiver.apply(SOURCE, log_batch(9, [10]))
    assert (ack.last_position, ack.duplicate) == (10, False)
    deliver(subscriber)
    assert recorder.events == [
        ("start", "s1", ()),
        ("snapshot", "s1", (1, 2, 3)),
        ("end", "s1", ()),
        ("log", "", (10,)),
    ]
    assert recorder.payloads == [b"s1-1", b"s1-2", b"s1-3", b"log-10"]


def test_a_snapshot_batch_with_another_snapshots_entry_is_refused(
    store: SQLAlchemyQueueStore,
    receiver: Receiver,
    subscriber: RoutingQueueSubscriber,
    recorder: Recorder,
) -> None:
    receiver.apply(SOURCE, snapshot_batch("s1", 0, [1]))
    mixed = snapshot_batch("s1", 1, [2, 3])
    mixed.entries[1].snapshot_id = "s2"
    with pytest.raises(ProtocolError, match="snapshot"):
        receiver.apply(SOURCE, mixed)
    foreign = snapshot_batch("s1", 1, [2], entry_snapshot_id="s2")
    with pytest.raises(ProtocolError, match="snapshot"):
        receiver.apply(SOURCE, foreign)
    # Nothing of them was stored: the sink still has entry 1 of s1 only.
    progress = store.recv.sink_progress(SOURCE, CLIENT)
    assert (progress.snapshot_id, progress.snapshot_position) == ("s1", 1)
    receiver.apply(SOURCE, snapshot_batch("s1", 1, [2, 3], end=True))
    deliver(subscriber)
    assert recorder.events == [("start", "s1", ()), ("snapshot", "s1", (1, 2)), ("end", "s1", ())]


def test_a_replayed_batch_of_a_delivered_snapshot_is_never_delivered_again(
    receiver: Receiver, subscriber: RoutingQueueSubscriber, recorder: Recorder
) -> None:
    receiver.apply(SOURCE, snapshot_batch("s1", 0, [1, 2]))
    receiver.apply(SOURCE, snapshot_batch("s1", 2, [3], end=True, base=5))
    deliver(subscriber)
    assert recorder.events == [("start", "s1", ()), ("snapshot", "s1", (1, 2)), ("end", "s1", ())]
    # A newer snapshot begins; then an old batch of s1 arrives once more (a replay
    # from an earlier connection) before the listener saw anything of s2.
    receiver.apply(SOURCE, snapshot_batch("s2", 0, [1]))
    receiver.apply(SOURCE, snapshot_batch("s1", 0, [1, 2]))
    deliver(subscriber)
    # s1 ended at the listener: none of its entries, and no second start, ever again.
    assert recorder.events == [("start", "s1", ()), ("snapshot", "s1", (1, 2)), ("end", "s1", ())]
    assert recorder.payloads == [b"s1-1", b"s1-2"]


def _bad_batches() -> list[tuple[str, pb.ReplicationBatch, str]]:
    """(case, batch, the start of the error's message)."""
    cases: list[tuple[str, pb.ReplicationBatch, str]] = []

    def case(name: str, batch: pb.ReplicationBatch, message: str) -> None:
        cases.append((name, batch, message))

    b = log_batch(0, [1])
    b.source_id = "src-z"
    case("another source", b, "batch claims source 'src-z', sender is 'src-a'")
    b = log_batch(0, [1])
    b.client_name = "Bad_Name"
    case("bad client name", b, "invalid client name 'Bad_Name'")
    case("too many entries", log_batch(0, [1, 2, 3]), "batch of 3 entries exceeds the limit")
    case("repeated position", log_batch(0, [1, 1]), "batch positions must be strictly increasing")
    case("position not after previous", log_batch(2, [2]), "batch positions must be strictly")
    b = log_batch(0, [1])
    b.entries[0].destinations.append("sink-b")
    case("destinations kept", b, "entries must arrive with destinations stripped")
    b = log_batch(0, [1])
    b.entries[0].type = 0  # type: ignore[assignment]
    case("entry without a type", b, "entry without a type")
    b = log_batch(0, [1])
    b.entries[0].type = 99  # type: ignore[assignment]
    case("unknown entry type", b, "unknown entry type 99")
    b = log_batch(0, [1])
    b.entries[0].type = "SNAPSHOT_SYNC"
    case("snapshot entry in a log batch", b, "log entry batch holds entries of another type")
    b = snapshot_batch("s1", 0, [1])
    b.entries[0].type = "LOG_ENTRY_SYNC"
    case("log entry in a snapshot batch", b, "snapshot batch holds entries of another type")
    b = snapshot_batch("s1", 0, [1])
    b.snapshot_id = ""
    case("no snapshot id", b, "snapshot batch without snapshot_id")
    case("snapshot id too long", snapshot_batch("a" * 65, 0, [1]), "invalid snapshot id 'aaa")
    case("snapshot id not ascii", snapshot_batch("sé", 0, [1]), "invalid snapshot id 'sé'")
    case("snapshot id not alnum", snapshot_batch("s-1", 0, [1]), "invalid snapshot id 's-1'")
    case("snapshot gap", snapshot_batch("s1", 2, [3]), "a new snapshot must start at its first")
    b = log_batch(0, [1])
    b.kind = 7  # type: ignore[assignment]
    case("unknown kind", b, "unknown batch kind 7")
    return cases


@pytest.mark.parametrize(
    "batch, message",
    [pytest.param(b, m, id=name.replace(" ", "-")) for name, b, m in _bad_batches()],
)
def test_a_bad_batch_is_refused_with_its_reason_and_stores_nothing(
    store: SQLAlchemyQueueStore, batch: pb.ReplicationBatch, message: str
) -> None:
    receiver = Receiver(store, "sink-b", [SOURCE], max_batch_entries=2)
    with pytest.raises(ProtocolError) as caught:
        receiver.apply(SOURCE, batch)
    assert str(caught.value).startswith(message), str(caught.value)
    assert store.queues.list_queues() == [] and store.recv.list_sink_progress() == []


def test_batch_limits_are_inclusive(store: SQLAlchemyQueueStore) -> None:
    receiver = Receiver(store, "sink-b", [SOURCE], max_batch_entries=2)
    assert receiver.apply(SOURCE, log_batch(0, [1, 2])).last_position == 2
    longest = "a" * 64  # the longest snapshot id accepted
    ack = receiver.apply(SOURCE, snapshot_batch(longest, 0, [1]))
    assert (ack.last_position, ack.duplicate) == (1, False)
    with pytest.raises(ProtocolError, match="gap in snapshot batch"):
        receiver.apply(SOURCE, snapshot_batch(longest, 2, [3]))
    assert store.recv.sink_progress(SOURCE, CLIENT).snapshot_position == 1
