"""The sink subscriber on SQLite and PostgreSQL: order, exactly-once, snapshots, leases."""

from __future__ import annotations

import gc
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from sqlalchemy import String, insert, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import lr_client.subscriber_settings as subscriber_settings
from lr_client import (
    InvalidInputError,
    ListenerError,
    ProtocolError,
    RoutingQueueListener,
    RoutingQueueMessage,
    RoutingQueueSubscriber,
    SnapshotDelivery,
    StoreUnavailableError,
)
from lr_client.errors import InvalidNameError
from lr_client.headers import encode_headers
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_client.store.schema import tables as s
from lr_client.subscriber import DEFAULT_BATCH_MAX_BYTES, default_owner
from tests.kit.aio import SyncDriven
from tests.kit.statements import recorded
from tests.kit.wait import join, wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC


class Base(DeclarativeBase):
    pass


class AppRow(Base):
    """What the sink application writes for each message (and each snapshot start/end)."""

    __tablename__ = "app_rows"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    source_id: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(16))
    snapshot_id: Mapped[str] = mapped_column(String(64), default="")
    position: Mapped[int] = mapped_column(default=0)


Event = tuple[str, str, str, tuple[int, ...]]  # (callback, source, snapshot id, positions)


class AppListener(RoutingQueueListener):
    """Writes one AppRow per message through the session; records the callbacks it saw.

    ``fail`` decides, per call, whether a callback fails: it gets the callback
    name and returns None (succeed), "false" (return False) or "raise".
    """

    def __init__(self, fail: Callable[[str, str, int], str | None] | None = None) -> None:
        self.events: list[Event] = []  # committed or not: an in-memory trace
        self.errors: list[BaseException] = []
        self.calls = 0
        self.fail = fail or (lambda callback, source, call: None)

    def _maybe_fail(self, session: Session, callback: str, source_id: str) -> bool:
        self.calls += 1
        how = self.fail(callback, source_id, self.calls)
        if how == "raise":
            raise RuntimeError(f"boom in {callback}")
        if how == "false":
            session.commit()  # must not commit the delivery transaction early
            return False
        return True

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        session.add(AppRow(source_id=source_id, kind="start", snapshot_id=snapshot_id))
        self.events.append(("start", source_id, snapshot_id, ()))
        self._maybe_fail(session, "on_full_sync_start", source_id)

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        session.add(AppRow(source_id=source_id, kind="end", snapshot_id=snapshot_id))
        self.events.append(("end", source_id, snapshot_id, ()))
        self._maybe_fail(session, "on_full_sync_end", source_id)

    def _apply(
        self, session: Session, kind: str, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        for m in messages:
            assert m.source_id == source_id and m.client_name == CLIENT
            session.add(
                AppRow(
                    source_id=source_id,
                    kind=kind,
                    snapshot_id=m.snapshot_id,
                    position=m.source_position,
                )
            )
        sid = messages[0].snapshot_id
        self.events.append((kind, source_id, sid, tuple(m.source_position for m in messages)))
        return self._maybe_fail(session, "process_" + kind, source_id)

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        assert {m.type for m in messages} == {ReplicationType.SNAPSHOT_SYNC}
        return self._apply(session, "full_sync", source_id, messages)

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        assert {m.type for m in messages} == {LOG}
        return self._apply(session, "log_entries", source_id, messages)

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


# -- helpers -------------------------------------------------------------------------
def log_entries(first: int, count: int) -> list[WireEntry]:
    return [WireEntry(p, LOG, b"log-%d" % p) for p in range(first, first + count)]


def snapshot_entries(snapshot_id: str, count: int, base: int = 0) -> list[WireEntry]:
    entries = [
        WireEntry(i, ReplicationType.SNAPSHOT_SYNC, b"snap-%d" % i, snapshot_id=snapshot_id)
        for i in range(1, count + 1)
    ]
    marker = WireEntry(
        count + 1,
        ReplicationType.LAST_FULL_SYNC_ENTRY,
        b"",
        snapshot_id=snapshot_id,
        snapshot_count=count,
        base_position=base,
    )
    return [*entries, marker]


def app_rows(store: SQLAlchemyQueueStore, kind: str | None = None) -> list[tuple[str, str, int]]:
    query = select(AppRow.source_id, AppRow.snapshot_id, AppRow.position).order_by(AppRow.id)
    if kind is not None:
        query = query.where(AppRow.kind == kind)
    with Session(store.engine) as session:
        return [(r[0], r[1], r[2]) for r in session.execute(query).all()]


def queued(store: SQLAlchemyQueueStore) -> int:
    """Entries received and not delivered yet, in every queue."""
    return sum(store.inspection.queue_depths().values())


def poll_until(
    sub: RoutingQueueSubscriber, done: Callable[[], bool], timeout: float = 20.0
) -> None:
    def step() -> bool:
        sub.poll_once()
        return done()

    wait_for(step, timeout, 0.01)


#: A test of the constructor's checks alone (they never read the database): on SQLite.
SETTINGS_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def app_store(store: SQLAlchemyQueueStore) -> SQLAlchemyQueueStore:
    Base.metadata.create_all(store.engine)
    return store


@pytest.fixture
def subscribers(app_store: SQLAlchemyQueueStore) -> Iterator[list[RoutingQueueSubscriber]]:
    made: list[RoutingQueueSubscriber] = []
    yield made
    for sub in made:
        sub.close()


@pytest.fixture(params=["sync", "aio"])
def api(request: pytest.FixtureRequest) -> str:
    """The subscriber under test: ``RoutingQueueSubscriber``, or ``AsyncRoutingQueueSubscriber``
    driven from these sync tests (:mod:`tests.kit.aio`) on the same database."""
    return str(request.param)


@pytest.fixture
def make_sub(
    app_store: SQLAlchemyQueueStore, subscribers: list[RoutingQueueSubscriber], api: str
) -> Callable[..., RoutingQueueSubscriber]:
    def make(listener: RoutingQueueListener, **kwargs: object) -> RoutingQueueSubscriber:
        kwargs.setdefault("retry_initial", 0.0)
        if "batch_size" in kwargs:  # these tests count full sync batches in batch_size too
            kwargs.setdefault("snapshot_batch_size", kwargs["batch_size"])
        sub: RoutingQueueSubscriber
        if api == "aio":
            url = app_store.engine.url.render_as_string(hide_password=False)
            sub = SyncDriven(url, CLIENT, listener, **kwargs)  # type: ignore[assignment]
        else:
            sub = RoutingQueueSubscriber(app_store, CLIENT, listener, **kwargs)  # type: ignore[arg-type]
        subscribers.append(sub)
        return sub

    return make


# -- order and exactly-once ------------------------------------------------------------
def test_log_entries_arrive_in_order_in_bounded_batches(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 12))
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(13, 13))
    listener = AppListener()
    sub = make_sub(listener, batch_size=10)

    assert sub.poll_once() == 25
    assert [e[3] for e in listener.events] == [
        tuple(range(1, 11)),
        tuple(range(11, 21)),
        tuple(range(21, 26)),
    ]
    assert [p for _, _, p in app_rows(app_store)] == list(range(1, 26))
    assert queued(app_store) == 0
    assert sub.poll_once() == 0
    assert len(app_rows(app_store)) == 25 and listener.errors == []


def test_messages_expose_the_entry(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, [WireEntry(7, LOG, b"\x00payload")])
    seen: list[RoutingQueueMessage] = []

    class Keep(AppListener):
        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            seen.extend(messages)
            return True

    assert make_sub(Keep()).poll_once() == 1
    assert seen == [RoutingQueueMessage(b"\x00payload", "src-a", CLIENT, 7, LOG, "")]


@pytest.mark.parametrize("partitions", [1, 2])
def test_messages_carry_their_headers_read_only(
    app_store: SQLAlchemyQueueStore,
    make_sub: Callable[..., RoutingQueueSubscriber],
    partitions: int,
) -> None:
    headers = encode_headers({"content-type": "application/json", "lr-traceparent": "00-x"})
    entries = [WireEntry(1, LOG, b"a", key=b"k", headers=headers), WireEntry(2, LOG, b"b")]
    app_store.recv.apply_log_batch("src-a", CLIENT, entries)
    seen: list[RoutingQueueMessage] = []

    class Keep(AppListener):
        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            seen.extend(messages)
            return True

    assert make_sub(Keep(), partitions=partitions).poll_once() == 2
    assert [dict(m.headers) for m in sorted(seen, key=lambda m: m.source_position)] == [
        {"content-type": "application/json", "lr-traceparent": "00-x"},
        {},
    ]
    with pytest.raises(TypeError):
        seen[0].headers["x"] = "y"  # type: ignore[index]


def test_other_clients_queues_are_not_delivered(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", "other", log_entries(1, 3))
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 2))
    listener = AppListener()
    assert make_sub(listener).poll_once() == 2
    assert queued(app_store) == 3
    assert listener.errors == []  # the other client's queue was not even tried


@pytest.mark.parametrize("how", ["false", "raise"])
def test_failed_batch_applies_nothing_and_is_redelivered(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber], how: str
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 8))
    listener = AppListener(fail=lambda cb, src, call: how if call <= 2 else None)
    sub = make_sub(listener, batch_size=5)

    assert sub.poll_once() == 0
    assert app_rows(app_store) == []  # the failed callback's writes were rolled back
    assert queued(app_store) == 8  # and nothing was deleted
    assert len(listener.errors) == 1
    err = listener.errors[0]
    assert isinstance(err, ListenerError)
    assert (err.source_id, err.client_name, err.callback) == (
        "src-a",
        CLIENT,
        "process_log_entries",
    )
    assert (err.first_seq, err.last_seq, err.attempt) == (1, 5, 1)
    if how == "raise":
        assert isinstance(err.__cause__, RuntimeError)

    poll_until(sub, lambda: queued(app_store) == 0)
    assert [p for _, _, p in app_rows(app_store)] == list(range(1, 9))
    assert [e.attempt for e in listener.errors if isinstance(e, ListenerError)] == [1, 2]
    # the same batch came three times, the rest once
    assert [e[3] for e in listener.events] == [tuple(range(1, 6))] * 3 + [(6, 7, 8)]


def test_failed_queue_waits_for_its_backoff(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    listener = AppListener(fail=lambda cb, src, call: "false" if call == 1 else None)
    sub = make_sub(listener, retry_initial=30.0, retry_max=100.0, retry_jitter=0.0)
    assert sub.poll_once() == 0
    assert sub.poll_once() == 0  # still backing off: not even tried
    assert listener.calls == 1
    assert [sub.backoff(n) for n in (1, 2, 3)] == [30.0, 60.0, 100.0]  # capped by retry_max


def test_an_idle_subscriber_woken_on_arrival_polls_less_and_less(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    """With a listening arrival watch, the idle poll only bounds a lost wake-up: it
    doubles from ``poll_interval`` to ``IDLE_POLL_MAX`` (a third of the lease at most),
    and a delivery starts it over. Without one, it stays ``poll_interval``."""
    sub = make_sub(AppListener(), poll_interval=0.5, lease_seconds=30.0)
    core = getattr(sub, "sub", sub)  # the async one, driven from this test
    assert [core._idle_wait() for _ in range(3)] == [0.5, 0.5, 0.5]  # no watch

    class Listening:
        listening = True

    core.arrival_watch = Listening()
    waits = [core._idle_wait() for _ in range(6)]
    assert waits == [0.5, 1.0, 2.0, 4.0, subscriber_settings.IDLE_POLL_MAX, 5.0]
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 2))
    assert sub.poll_once() == 2
    assert core._idle_wait() == 0.5  # a delivery: back to the fast poll
    core.lease_seconds = 3.0
    assert max(core._idle_wait() for _ in range(8)) == 1.0  # a third of the lease


def test_listener_that_rolls_back_the_session_fails_the_batch(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 2))

    class RollsBack(AppListener):
        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            session.execute(text("SELECT 1"))
            session.rollback()
            return True

    listener = RollsBack()
    assert make_sub(listener).poll_once() == 0
    assert queued(app_store) == 2
    (error,) = listener.errors
    assert isinstance(error, ListenerError) and error.callback == "process_log_entries"
    assert error.attempt == 1 and error.first_seq == 1 and error.last_seq == 2
    assert str(error).endswith("attempt 1): the listener rolled back the delivery transaction")


def test_one_failing_source_does_not_block_another(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("bad", CLIENT, log_entries(1, 4))
    app_store.recv.apply_log_batch("good", CLIENT, log_entries(1, 6))
    listener = AppListener(fail=lambda cb, src, call: "raise" if src == "bad" else None)
    sub = make_sub(listener, batch_size=2)

    assert sub.poll_once() == 6
    assert sub.poll_once() == 0
    assert {src for src, _, _ in app_rows(app_store)} == {"good"}
    assert len(app_rows(app_store)) == 6
    assert queued(app_store) == 4
    assert listener.errors and all(
        isinstance(e, ListenerError) and e.source_id == "bad" for e in listener.errors
    )


# -- full sync ---------------------------------------------------------------------------
def test_snapshot_batches_come_between_start_and_end_then_log_entries(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_snapshot_batch(
        "src-a", CLIENT, "snap-1", snapshot_entries("snap-1", 5, 10)
    )
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(11, 3))
    listener = AppListener()
    sub = make_sub(listener, batch_size=2)

    assert sub.poll_once() == 8
    assert listener.events == [
        ("start", "src-a", "snap-1", ()),
        ("full_sync", "src-a", "snap-1", (1, 2)),
        ("full_sync", "src-a", "snap-1", (3, 4)),
        ("full_sync", "src-a", "snap-1", (5,)),
        ("end", "src-a", "snap-1", ()),
        ("log_entries", "src-a", "", (11, 12)),
        ("log_entries", "src-a", "", (13,)),
    ]
    assert len(app_rows(app_store, "start")) == len(app_rows(app_store, "end")) == 1
    assert queued(app_store) == 0


def test_zero_row_snapshot_is_start_then_end(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "empty", snapshot_entries("empty", 0))
    listener = AppListener()
    assert make_sub(listener).poll_once() == 0
    assert listener.events == [("start", "src-a", "empty", ()), ("end", "src-a", "empty", ())]
    assert queued(app_store) == 0
    assert len(app_rows(app_store)) == 2


def test_a_snapshot_is_delivered_only_once_its_end_has_arrived(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    snap = snapshot_entries("s1", 4, base=3)
    app_store.recv.apply_snapshot_batch(
        "src-a", CLIENT, "s1", snap[:3]
    )  # the end is still on its way
    app_store.recv.apply_log_batch("src-b", CLIENT, log_entries(1, 2))
    listener = AppListener()
    sub = make_sub(listener, batch_size=2)

    # The log entries before the snapshot and another source's were delivered: the
    # poll ran past the snapshot and delivered nothing of it.
    assert sub.poll_once() == 5
    assert listener.events == [
        ("log_entries", "src-a", "", (1, 2)),
        ("log_entries", "src-a", "", (3,)),
        ("log_entries", "src-b", "", (1, 2)),
    ]
    assert sub._poll() == (0, False)  # no progress: run() waits its poll interval
    assert queued(app_store) == 3 and len(listener.events) == 3

    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "s1", snap[3:], previous_position=3)
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(4, 1))
    assert sub.poll_once() == 5
    assert listener.events[3:] == [
        ("start", "src-a", "s1", ()),
        ("full_sync", "src-a", "s1", (1, 2)),
        ("full_sync", "src-a", "s1", (3, 4)),
        ("end", "src-a", "s1", ()),
        ("log_entries", "src-a", "", (4,)),
    ]
    assert queued(app_store) == 0
    assert [r[2] for r in app_rows(app_store, "full_sync")] == [1, 2, 3, 4]


def test_a_snapshot_superseded_at_the_sink_never_reaches_the_listener(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 2))
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "old", snapshot_entries("old", 6)[:4])
    listener = AppListener()
    sub = make_sub(listener, batch_size=2)
    assert sub.poll_once() == 2  # the log entries before it
    new = snapshot_entries("new", 3, base=2)
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "new", new[:2])  # drops what "old" queued
    assert sub.poll_once() == 0
    assert listener.events == [("log_entries", "src-a", "", (1, 2))]
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "new", new[2:], previous_position=2)
    assert sub.poll_once() == 3

    assert listener.events == [
        ("log_entries", "src-a", "", (1, 2)),
        ("start", "src-a", "new", ()),
        ("full_sync", "src-a", "new", (1, 2)),
        ("full_sync", "src-a", "new", (3,)),
        ("end", "src-a", "new", ()),
    ]
    assert {sid for _, sid, _ in app_rows(app_store)} == {"", "new"}
    assert queued(app_store) == 0


def test_streaming_delivery_may_deliver_part_of_a_superseded_snapshot(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    old = snapshot_entries("old", 6)[:-1]  # interrupted: no end marker
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "old", old)
    listener = AppListener()
    sub = make_sub(listener, batch_size=2, max_batches=1, snapshot_delivery="streaming")
    assert sub.poll_once() == 2  # part of the old snapshot was delivered
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "new", snapshot_entries("new", 3))
    poll_until(sub, lambda: queued(app_store) == 0)

    assert listener.events == [
        ("start", "src-a", "old", ()),
        ("full_sync", "src-a", "old", (1, 2)),
        ("start", "src-a", "new", ()),  # a new start without an end: "old" was superseded
        ("full_sync", "src-a", "new", (1, 2)),
        ("full_sync", "src-a", "new", (3,)),
        ("end", "src-a", "new", ()),
    ]


def test_failed_first_snapshot_batch_rolls_back_its_start(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "s1", snapshot_entries("s1", 4))

    def fail(callback: str, source: str, call: int) -> str | None:
        # first transaction: start ok, batch fails; later the second batch fails once
        return "false" if call in (2, 5) else None

    listener = AppListener(fail=fail)
    sub = make_sub(listener, batch_size=2, max_batches=1)
    poll_until(sub, lambda: queued(app_store) == 0)

    assert [e[0] for e in listener.events] == [
        "start",  # rolled back with the failed batch...
        "full_sync",
        "start",  # ...so issued again
        "full_sync",
        "full_sync",  # second batch fails: start is not repeated
        "full_sync",
        "end",
    ]
    assert len(listener.errors) == 2
    assert len(app_rows(app_store, "start")) == 1
    assert sorted(p for _, _, p in app_rows(app_store, "full_sync")) == [1, 2, 3, 4]
    assert len(app_rows(app_store, "end")) == 1


def test_failing_end_callback_redelivers_the_end_only(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "s1", snapshot_entries("s1", 2))
    listener = AppListener(
        fail=lambda cb, src, call: "raise" if cb == "on_full_sync_end" and call < 5 else None
    )
    sub = make_sub(listener, batch_size=2)
    poll_until(sub, lambda: queued(app_store) == 0)
    assert len(app_rows(app_store, "full_sync")) == 2
    assert len(app_rows(app_store, "end")) == 1
    assert listener.errors and listener.errors[0].__cause__ is not None


def raw_append(store: SQLAlchemyQueueStore, rows: list[tuple[ReplicationType, int, str]]) -> None:
    """Append entries behind the receiver's back (what a faulty receiver could leave)."""
    qid = store.queues.list_queues(CLIENT)[0].queue_id
    with store.write() as conn:
        conn.execute(
            insert(s.recv_entries),
            [
                {
                    "queue_id": qid,
                    "type": int(t),
                    "source_position": pos,
                    "snapshot_id": sid,
                    "snapshot_count": 0,
                    "payload": b"x",
                    "received_at": 0.0,
                }
                for t, pos, sid in rows
            ],
        )


def test_entries_of_an_ended_snapshot_are_never_delivered(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "s1", snapshot_entries("s1", 2))
    listener = AppListener()
    sub = make_sub(listener)
    assert sub.poll_once() == 2
    raw_append(
        app_store,
        [
            (ReplicationType.SNAPSHOT_SYNC, 1, "s1"),
            (ReplicationType.LAST_FULL_SYNC_ENTRY, 2, "s1"),
            (LOG, 3, ""),
        ],
    )
    assert sub.poll_once() == 1
    assert [e[0] for e in listener.events] == ["start", "full_sync", "end", "log_entries"]
    assert queued(app_store) == 0


def test_an_entry_of_no_type_blocks_its_queue_with_a_protocol_error(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 1))
    raw_append(app_store, [(ReplicationType.NONE, 2, "")])
    listener = AppListener()
    sub = make_sub(listener)
    assert sub.poll_once() == 1  # the good entry before it is delivered
    assert sub.poll_once() == 0
    assert queued(app_store) == 1  # nothing skipped
    assert listener.errors and isinstance(listener.errors[0], ProtocolError)


# -- discovery and run() -------------------------------------------------------------------
def test_run_discovers_new_sources_without_restart(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    listener = AppListener()
    sub = make_sub(listener, poll_interval=0.02)
    stop = threading.Event()
    thread = threading.Thread(target=sub.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: len(app_rows(app_store)) == 3)
        app_store.recv.apply_log_batch("src-b", CLIENT, log_entries(1, 4))  # a source seen later
        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(4, 1))
        wait_for(lambda: len(app_rows(app_store)) == 8)
    finally:
        stop.set()
        join(thread, 30)
    rows = app_rows(app_store)
    assert sorted(p for src, _, p in rows if src == "src-b") == [1, 2, 3, 4]
    assert sorted(p for src, _, p in rows if src == "src-a") == [1, 2, 3, 4]
    with app_store.read() as conn:  # run() released its leases on the way out
        owners = conn.execute(select(s.subscriber_state.c.lease_owner)).scalars().all()
    assert owners and set(owners) == {""}


# -- leases ---------------------------------------------------------------------------------
def test_a_leased_queue_is_left_to_its_holder(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 4))
    first = make_sub(AppListener(), owner="first", batch_size=2, max_batches=1)
    second_listener = AppListener()
    second = make_sub(second_listener, owner="second")

    assert first.poll_once() == 2
    assert second.poll_once() == 0  # "first" holds the lease
    assert second_listener.calls == 0
    first.release_leases()
    assert second.poll_once() == 2
    assert [p for _, _, p in app_rows(app_store)] == [1, 2, 3, 4]


def test_an_expired_lease_is_taken_over(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 4))
    first = make_sub(AppListener(), owner="first", batch_size=2, max_batches=1, lease_seconds=0.2)
    second = make_sub(AppListener(), owner="second")
    assert first.poll_once() == 2
    poll_until(second, lambda: queued(app_store) == 0)  # after "first"'s lease expired
    assert [p for _, _, p in app_rows(app_store)] == [1, 2, 3, 4]


def test_delivery_rolls_back_when_the_lease_was_lost(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))

    class LosesLease(AppListener):
        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            ok = super().process_log_entries(session, source_id, messages)
            if self.calls == 1:  # another subscriber takes the lease meanwhile
                session.execute(update(s.subscriber_state).values(lease_owner="intruder"))
            return ok

    listener = LosesLease()
    sub = make_sub(listener, owner="me")
    assert sub.poll_once() == 0
    assert app_rows(app_store) == [] and queued(app_store) == 3
    assert listener.errors == []  # not the listener's fault
    assert sub.poll_once() == 3  # the lease row is free again: take it back
    assert len(app_rows(app_store)) == 3


def test_a_delivery_another_one_passed_meanwhile_rolls_back(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))

    class Overtaken(AppListener):
        def process_log_entries(
            self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
        ) -> bool:
            ok = super().process_log_entries(session, source_id, messages)
            if self.calls == 1:  # as if another delivery of the queue committed meanwhile
                st = s.subscriber_state
                session.execute(update(st).values(delivered_seq=st.c.delivered_seq + 1))
            return ok

    listener = Overtaken()
    sub = make_sub(listener)
    assert sub.poll_once() == 0
    assert app_rows(app_store) == [] and queued(app_store) == 3
    assert listener.errors == []  # not the listener's fault
    assert sub.poll_once() == 3
    assert len(app_rows(app_store)) == 3


@SETTINGS_ONLY
def test_settings_are_validated(app_store: SQLAlchemyQueueStore) -> None:
    with pytest.raises(InvalidInputError, match="snapshot_delivery"):
        RoutingQueueSubscriber(app_store, CLIENT, AppListener(), snapshot_delivery="whole")
    for mode in ("streaming", SnapshotDelivery.COMPLETE):
        sub = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), snapshot_delivery=mode)
        assert sub.snapshot_delivery is SnapshotDelivery(mode)
    default = RoutingQueueSubscriber(app_store, CLIENT, AppListener())
    assert default.snapshot_delivery is SnapshotDelivery.COMPLETE
    with pytest.raises(ValueError):
        RoutingQueueSubscriber(app_store, CLIENT, AppListener(), batch_size=0)
    with pytest.raises(ValueError):
        RoutingQueueSubscriber(app_store, CLIENT, AppListener(), lease_seconds=0)
    with pytest.raises(ValueError):
        RoutingQueueSubscriber(app_store, "Bad_Name", AppListener())


def stored_positions(store: SQLAlchemyQueueStore) -> list[int]:
    """Source positions of the receive queue rows still stored, delivered or not."""
    r = s.recv_entries
    with store.read() as conn:
        rows = conn.execute(select(r.c.source_position).order_by(r.c.seq)).scalars()
        return [int(x) for x in rows]


def test_whether_a_queue_is_relayed_is_read_once_per_lease_not_per_delivery(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 30))
    sub = make_sub(AppListener(), batch_size=5)
    # the async subscriber's engine: its sync facade
    with recorded(sub.store.engine) as statements:
        assert sub.poll_once() == 30  # six deliveries under one lease
    cascade_reads = [x for x in statements if "lrq_cascade " in x or "lrq_cascade\n" in x]
    # SQLite, which deletes delivered entries: once, when the lease was taken;
    # PostgreSQL keeps them until rotation and never asks.
    assert len(cascade_reads) == (0 if app_store.core.keeps_delivered else 1), cascade_reads
    assert len(app_rows(app_store)) == 30


def test_a_drained_queue_is_probed_not_delivered_again(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    """After a delivery, whether more is queued is one probe of the queue, not another
    delivery transaction (state read, head read, commit) that finds nothing; a queue
    with more than one batch is still delivered batch after batch."""
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    sub = make_sub(AppListener(), batch_size=5)
    assert sub.poll_once() == 3  # the lease is taken
    with recorded(sub.store.engine) as statements:

        def state_reads() -> int:  # one per delivery transaction
            state = f"SELECT {s.subscriber_state.name}."
            return sum(1 for x in statements if x.startswith(state))

        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(4, 3), previous_position=3)
        statements.clear()
        assert sub.poll_once() == 3
        assert state_reads() == 1  # one delivery, then the probe found the queue drained
        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(7, 12), previous_position=6)
        statements.clear()
        assert sub.poll_once() == 12  # batches of 5, 5 and 2 in one poll
        assert state_reads() == 3
    assert [r[2] for r in app_rows(app_store)] == list(range(1, 19))


def test_while_each_batch_is_full_the_next_goes_without_a_probe(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    """A full batch says more is likely queued: the next delivery goes ahead (it finds
    out as cheaply as a probe would); after a short one, a probe finds the queue
    drained."""
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    sub = make_sub(AppListener(), batch_size=5)
    assert sub.poll_once() == 3  # the lease is taken
    probe = re.compile(rf"SELECT {s.recv_entries.name}\.seq\s+FROM")
    with recorded(sub.store.engine) as statements:

        def counts() -> tuple[int, int]:  # (delivery transactions, probes)
            state = f"SELECT {s.subscriber_state.name}."
            return sum(x.startswith(state) for x in statements), sum(
                bool(probe.match(x)) for x in statements
            )

        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(4, 10), previous_position=3)
        statements.clear()
        assert sub.poll_once() == 10  # 5 and 5, then a delivery that finds nothing
        assert counts() == (3, 1)  # the one probe: the poll's, before the first
        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(14, 7), previous_position=13)
        statements.clear()
        assert sub.poll_once() == 7  # 5 and 2, then a probe
        assert counts() == (2, 2)
    assert [r[2] for r in app_rows(app_store)] == list(range(1, 21))


class _Listening:
    """An arrival watch that is listening: every batch stored wakes the subscriber."""

    listening = True


def test_a_drained_queue_waits_for_the_next_arrival_when_arrivals_wake_the_subscriber(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    """A poll says whether to poll again at once: after a delivery, yes if entries
    stored meanwhile would not wake the subscriber (no arrival watch listening) or
    the queue may hold more; a drained queue of a woken subscriber waits instead."""
    sub = make_sub(AppListener(), batch_size=5, max_batches=2)
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    assert sub._poll() == (3, True)  # no watch: entries may arrive unannounced
    sub.arrival_watch = _Listening()  # type: ignore[assignment]
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(4, 3), previous_position=3)
    assert sub._poll() == (3, False)  # drained: the next batch wakes it
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(7, 12), previous_position=6)
    assert sub._poll() == (10, True)  # two batches of 5, and more queued
    assert sub._poll() == (2, False)
    assert sub._poll() == (0, False)
    sub.arrival_watch = None
    assert [r[2] for r in app_rows(app_store)] == list(range(1, 19))


def test_a_configuration_that_relays_a_queue_takes_its_lease_so_delivery_keeps_it(
    db_url: str,
    app_store: SQLAlchemyQueueStore,
    make_sub: Callable[..., RoutingQueueSubscriber],
) -> None:
    """The answer read with the lease is not kept past a change made elsewhere (here
    through another engine, as the site's server applies its config): the change takes
    the lease, the delivery holding it rolls back, the next one reads the new answer."""
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 3))
    listener = AppListener()
    sub = make_sub(listener, owner="me", lease_seconds=600.0)
    assert sub.poll_once() == 3
    kept = [] if not app_store.core.keeps_delivered else [1, 2, 3]
    assert stored_positions(app_store) == kept  # SQLite deleted them at delivery

    server = open_store(create_engine(db_url))
    try:
        server.cascade.apply_cascade_config(CLIENT, "src-a", "branch", "src-a", ("below",))
        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(4, 3), previous_position=3)
        poll_until(sub, lambda: len(app_rows(app_store)) == 6)
        assert stored_positions(app_store) == [*kept, 4, 5, 6]  # relayed: kept for "below"

        # Back to a leaf: delivery deletes again from the next lease on.
        server.cascade.apply_cascade_config(CLIENT, "src-a", "leaf", "src-a")
        app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(7, 2), previous_position=6)
        poll_until(sub, lambda: len(app_rows(app_store)) == 8)
        expected = [*kept, 4, 5, 6, 7, 8] if app_store.core.keeps_delivered else [4, 5, 6]
        assert stored_positions(app_store) == expected
        # The same configuration again changes nothing, and takes no lease.
        server.cascade.apply_cascade_config(CLIENT, "src-a", "leaf", "src-a")
        with app_store.read() as conn:
            (state,) = [
                app_store.queues.load_state(conn, q.queue_id)
                for q in app_store.queues.list_queues()
            ]
        assert state.lease_owner == "me"
    finally:
        server.close()
    assert [p for _, _, p in app_rows(app_store)] == list(range(1, 9))  # each once, in order
    assert listener.errors == []


def test_the_batch_is_built_with_the_collector_paused_and_the_listener_runs_with_it_on(
    app_store: SQLAlchemyQueueStore,
    make_sub: Callable[..., RoutingQueueSubscriber],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "s1", snapshot_entries("s1", 6, 10))
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(11, 3))
    seen: dict[str, list[bool]] = {"read": [], "listener": []}

    def reading(*args: object, **kwargs: object) -> object:
        seen["read"].append(gc.isenabled())
        return read_head(*args, **kwargs)  # type: ignore[arg-type]

    class Watching(AppListener):
        def _apply(
            self,
            session: Session,
            kind: str,
            source_id: str,
            messages: Sequence[RoutingQueueMessage],
        ) -> bool:
            seen["listener"].append(gc.isenabled())
            return super()._apply(session, kind, source_id, messages)

    sub = make_sub(Watching(), batch_size=4)
    read_head = sub.store.heads.read_head
    monkeypatch.setattr(sub.store.heads, "read_head", reading)
    assert gc.isenabled()
    poll_until(sub, lambda: len(app_rows(app_store, "log_entries")) == 3)
    assert seen["read"] and not any(seen["read"])  # every read: paused
    assert seen["listener"] and all(seen["listener"])  # every callback: on
    assert gc.isenabled()


# -- retry timing ------------------------------------------------------------------------
class _ErrorLog(RoutingQueueListener):
    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


def test_backoff_doubles_up_to_its_cap_and_jitter_only_shortens_it(
    store: SQLAlchemyQueueStore,
) -> None:
    sub = RoutingQueueSubscriber(
        store, "policy", _ErrorLog(), retry_initial=1.0, retry_max=8.0, retry_jitter=0.5
    )
    for failures, full in [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = [sub.backoff(failures) for _ in range(200)]
        assert all(full * 0.5 <= d <= full for d in delays), (failures, min(delays), max(delays))
        assert min(delays) < full * 0.9  # jittered, not constant
    exact = RoutingQueueSubscriber(store, "policy", _ErrorLog(), retry_initial=1.0, retry_jitter=0)
    assert [exact.backoff(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]


def test_an_idle_subscriber_waits_until_its_soonest_retry_within_the_poll_interval(
    store: SQLAlchemyQueueStore,
) -> None:
    sub = RoutingQueueSubscriber(store, "policy", _ErrorLog(), poll_interval=5.0)
    assert sub._idle_wait() == 5.0  # nothing to retry
    sub._retry_at = {1: time.monotonic() + 60.0}
    assert sub._idle_wait() == 5.0  # the retry is further than a poll
    sub._retry_at = {1: time.monotonic() + 60.0, 2: time.monotonic() + 1.0}
    assert 0.0 < sub._idle_wait() <= 1.0  # the soonest one
    sub._retry_at = {1: time.monotonic() - 3.0}
    assert sub._idle_wait() == 0.0  # overdue: at once


def test_a_failed_delivery_is_retried_later_and_a_database_error_reported_as_transient(
    store: SQLAlchemyQueueStore,
) -> None:
    listener = _ErrorLog()
    sub = RoutingQueueSubscriber(store, "policy", listener, retry_initial=30.0, retry_jitter=0)
    cause = OperationalError("SELECT 1", None, Exception("server closed the connection"))
    before = time.monotonic()
    sub._fail(7, cause)
    sub._fail(7, ValueError("listener bug"))
    assert sub._failures == {7: 2}
    assert before + 60.0 <= sub._retry_at[7] <= time.monotonic() + 60.0
    first, second = listener.errors
    assert isinstance(first, StoreUnavailableError) and first.__cause__ is cause
    assert "server closed the connection" in str(first)
    assert isinstance(second, ValueError) and str(second) == "listener bug"


class _FailsOnce(_ErrorLog):
    def __init__(self) -> None:
        super().__init__()
        self.applied: list[int] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        if not self.errors:
            raise ValueError("first attempt fails")
        self.applied += [m.source_position for m in messages]
        return True


def test_a_success_clears_the_queues_failures_and_retry_time(store: SQLAlchemyQueueStore) -> None:
    store.recv.apply_log_batch("site-a", "policy", [WireEntry(p, LOG, b"x") for p in (1, 2)])
    listener = _FailsOnce()
    sub = RoutingQueueSubscriber(store, "policy", listener, retry_initial=0.0, retry_jitter=0)
    assert sub.poll_once() == 0
    (qid,) = sub._failures
    assert sub._failures == {qid: 1} and qid in sub._retry_at
    assert sub.poll_once() == 2
    assert listener.applied == [1, 2]
    assert (sub._failures, sub._retry_at) == ({}, {})


def test_a_running_subscriber_delivers_and_reports_nothing_when_nothing_fails(
    store: SQLAlchemyQueueStore,
) -> None:
    store.recv.apply_log_batch("site-a", "policy", [WireEntry(p, LOG, b"x") for p in (1, 2, 3)])
    listener = _FailsOnce()
    listener.errors.append(ValueError("marker: already failed once"))  # so it never fails
    sub = RoutingQueueSubscriber(store, "policy", listener, poll_interval=0.01)
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: listener.applied == [1, 2, 3])
    finally:
        stop.set()
        join(runner)
    assert [str(e) for e in listener.errors] == ["marker: already failed once"]


def test_the_delivered_count_counts_entries_given_to_the_listener_not_drop_notices(
    store: SQLAlchemyQueueStore,
) -> None:
    store.recv.apply_log_batch("site-a", "policy", [WireEntry(p, LOG, b"x") for p in (1, 2, 3)])
    assert store.recv.apply_drop_notice("site-a", "policy", "d1", 4, "dropped")
    store.recv.apply_log_batch("site-a", "policy", [WireEntry(p, LOG, b"x") for p in (9, 10)])
    listener = _FailsOnce()
    listener.errors.append(ValueError("marker: already failed once"))  # so it never fails
    sub = RoutingQueueSubscriber(store, "policy", listener)
    while sub.poll_once():
        pass
    assert listener.applied == [1, 2, 3, 9, 10]
    (queue,) = store.queues.list_queues("policy")
    with store.read() as conn:
        assert store.queues.load_state(conn, queue.queue_id).delivered == 5


# -- settings: defaults, bounds and messages ---------------------------------------------
@SETTINGS_ONLY
def test_the_defaults_are_the_documented_ones(app_store: SQLAlchemyQueueStore) -> None:
    sub = RoutingQueueSubscriber(app_store, CLIENT, AppListener())
    settings = (sub.batch_size, sub.batch_max_bytes, sub.max_batches, sub.lease_seconds)
    assert settings == (500, DEFAULT_BATCH_MAX_BYTES, 20, 30.0)
    assert (sub.poll_interval, sub.retry_initial, sub.retry_max, sub.retry_jitter) == (
        0.5,
        0.5,
        60.0,
        0.5,
    )


@SETTINGS_ONLY
def test_the_smallest_settings_are_accepted(app_store: SQLAlchemyQueueStore) -> None:
    for jitter in (0.0, 1.0):
        sub = RoutingQueueSubscriber(
            app_store,
            CLIENT,
            AppListener(),
            batch_size=1,
            batch_max_bytes=1,
            max_batches=1,
            lease_seconds=0.001,
            poll_interval=0,
            retry_initial=0,
            retry_max=0,
            retry_jitter=jitter,
            owner="o" * 128,
        )
        assert (sub.batch_size, sub.batch_max_bytes, sub.max_batches) == (1, 1, 1)
        assert sub.owner == "o" * 128 and sub.retry_jitter == jitter


SIZES = "batch_size, snapshot_batch_size, batch_max_bytes and max_batches must be at least 1"
TIMES = "lease_seconds must be positive, intervals not negative"


@SETTINGS_ONLY
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"batch_size": 0}, SIZES),
        ({"snapshot_batch_size": 0}, SIZES),
        ({"batch_max_bytes": 0}, SIZES),
        ({"max_batches": 0}, SIZES),
        ({"lease_seconds": 0}, TIMES),
        ({"poll_interval": -0.1}, TIMES),
        ({"retry_initial": -0.1}, TIMES),
        ({"retry_max": -0.1}, TIMES),
        ({"retry_jitter": -0.01}, "retry_jitter must be between 0 and 1"),
        ({"retry_jitter": 1.01}, "retry_jitter must be between 0 and 1"),
        ({"owner": "o" * 129}, "owner must be at most 128 characters"),
    ],
)
def test_each_setting_out_of_bounds_is_refused_by_name(
    app_store: SQLAlchemyQueueStore, setting: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        RoutingQueueSubscriber(app_store, CLIENT, AppListener(), **setting)  # type: ignore[arg-type]


@SETTINGS_ONLY
def test_an_unknown_snapshot_delivery_names_the_choices(app_store: SQLAlchemyQueueStore) -> None:
    expected = "snapshot_delivery must be one of 'complete', 'streaming', not 'whole'"
    with pytest.raises(InvalidInputError, match=f"^{re.escape(expected)}$"):
        RoutingQueueSubscriber(app_store, CLIENT, AppListener(), snapshot_delivery="whole")


@SETTINGS_ONLY
def test_a_bad_client_name_is_refused_as_a_client_name(app_store: SQLAlchemyQueueStore) -> None:
    with pytest.raises(InvalidNameError, match=r"^invalid client name 'Bad_Name'"):
        RoutingQueueSubscriber(app_store, "Bad_Name", AppListener())


def test_a_database_url_or_engine_opens_the_store(app_store: SQLAlchemyQueueStore) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 2))
    url = app_store.engine.url.render_as_string(hide_password=False)
    for target in (url, app_store.engine):
        listener = AppListener()
        sub = RoutingQueueSubscriber(target, CLIENT, listener)  # type: ignore[arg-type]
        try:
            assert isinstance(sub.store, SQLAlchemyQueueStore) and sub.store is not app_store
            assert sub.store.queues.list_queues(CLIENT) == app_store.queues.list_queues(CLIENT)
            assert sub.store.engine.pool.checkedin() == 1
        finally:
            sub.close()
        # Connections it opened from a URL are closed with it; a given engine stays open.
        assert sub.store.engine.pool.checkedin() == (0 if target is url else 1)


def test_the_default_owner_is_host_pid_and_a_random_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscriber_settings.socket, "gethostname", lambda: "h" * 100)
    owner = default_owner()
    assert re.fullmatch(rf"h{{80}}:{os.getpid()}:[0-9a-f]{{8}}", owner), owner
    assert default_owner() != owner


# -- what a failing listener is told -------------------------------------------------------
class _Fails(AppListener):
    """Fails the named callback once: ``raise`` or return ``result``."""

    def __init__(self, callback: str, result: object = "raise") -> None:
        super().__init__(lambda cb, _src, _n: None)
        self.failing, self.result = callback, result
        self.drops: list[tuple[str, int, str]] = []

    def _maybe_fail(self, session: Session, callback: str, source_id: str) -> bool:
        if callback == self.failing and not self.errors:
            if self.result == "raise":
                raise RuntimeError(f"boom in {callback}")
            return self.result  # type: ignore[return-value]
        return True

    def on_stream_dropped(
        self, session: Session, source_id: str, first_dropped_position: int, reason: str
    ) -> None:
        session.add(AppRow(source_id=source_id, kind="dropped", position=first_dropped_position))
        self.drops.append((source_id, first_dropped_position, reason))
        self._maybe_fail(session, "on_stream_dropped", source_id)


@pytest.mark.parametrize(
    ("callback", "result", "says"),
    [
        ("on_full_sync_start", "raise", "RuntimeError: boom in on_full_sync_start"),
        ("process_full_sync", False, "returned False"),
        ("process_full_sync", "raise", "RuntimeError: boom in process_full_sync"),
        ("on_full_sync_end", "raise", "RuntimeError: boom in on_full_sync_end"),
        ("process_log_entries", None, "returned None"),
    ],
)
def test_a_failing_callback_is_named_with_the_batch_and_the_reason(
    app_store: SQLAlchemyQueueStore,
    make_sub: Callable[..., RoutingQueueSubscriber],
    callback: str,
    result: object,
    says: str,
) -> None:
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, "s1", snapshot_entries("s1", 2, base=0))
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 1))
    listener = _Fails(callback, result)
    sub = make_sub(listener, retry_initial=0.0)
    poll_until(sub, lambda: queued(app_store) == 0)
    (error,) = listener.errors
    assert isinstance(error, ListenerError)
    (queue,) = app_store.queues.list_queues(CLIENT)
    assert (error.callback, error.source_id, error.client_name, error.attempt) == (
        callback,
        "src-a",
        CLIENT,
        1,
    )
    seqs = f"seq {error.first_seq}..{error.last_seq}"
    assert str(error) == f"{callback} for {queue.queue_name} ({seqs}, attempt 1): {says}"


def test_a_drop_notice_reaches_on_stream_dropped_with_its_position_and_reason(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    assert app_store.recv.apply_drop_notice("src-a", CLIENT, "d1", 42, "over max_entries")
    listener = _Fails("on_stream_dropped")
    sub = make_sub(listener, retry_initial=0.0)
    poll_until(sub, lambda: queued(app_store) == 0)
    assert listener.drops == [("src-a", 42, "over max_entries")] * 2  # failed once, then done
    assert app_rows(app_store, "dropped") == [("src-a", "", 42)]  # written in its session
    (error,) = listener.errors
    assert isinstance(error, ListenerError) and error.callback == "on_stream_dropped"
    assert str(error).endswith("): RuntimeError: boom in on_stream_dropped")


# -- the idle loop, and what is logged -----------------------------------------------------
def _count_idle_rounds(sub: RoutingQueueSubscriber, rounds: int) -> list[float]:
    """Record how long ``run`` means to wait after each idle round; stop it after ``rounds``."""
    waits: list[float] = []

    def idle(stop: threading.Event, turn: int) -> None:
        waits.append(sub._idle_wait())
        if len(waits) >= rounds:
            stop.set()

    sub._idle = idle  # type: ignore[method-assign]
    return waits


def test_run_waits_a_poll_interval_after_each_round_that_delivered_nothing(
    app_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not woken on arrival: the poll is all it has (woken, it backs off: the test above).
    sub = RoutingQueueSubscriber(
        app_store, CLIENT, AppListener(), poll_interval=0.25, wake_on_arrival=False
    )
    polls: list[int] = []
    real = sub._poll
    monkeypatch.setattr(sub, "_poll", lambda: (polls.append(1), real())[1])
    waits = _count_idle_rounds(sub, 3)
    runner = threading.Thread(target=sub.run, args=(threading.Event(),), daemon=True)
    runner.start()
    join(runner)
    assert waits == [0.25, 0.25, 0.25] and len(polls) == 3  # one wait per idle round


def test_run_reports_a_failed_poll_and_waits_before_the_next(
    app_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = AppListener()
    sub = RoutingQueueSubscriber(
        app_store, CLIENT, listener, poll_interval=0.25, wake_on_arrival=False
    )
    failure = StoreUnavailableError("the database went away")

    def broken() -> tuple[int, bool]:
        raise failure

    monkeypatch.setattr(sub, "_poll", broken)
    waits = _count_idle_rounds(sub, 2)
    runner = threading.Thread(target=sub.run, args=(threading.Event(),), daemon=True)
    runner.start()
    join(runner)
    assert listener.errors == [failure, failure] and waits == [0.25, 0.25]


def test_an_idle_wait_ends_at_a_ring_after_its_turn_or_at_the_stop(
    app_store: SQLAlchemyQueueStore,
) -> None:
    sub = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), poll_interval=3600.0)
    stop = threading.Event()
    turn = sub._doorbell.turn()
    sub._doorbell.ring()  # while the round looked for work: the wait ends at once
    sub._idle(stop, turn)
    turn = sub._doorbell.turn()
    waiter = threading.Thread(target=sub._idle, args=(stop, turn))
    waiter.start()
    sub._doorbell.ring()  # during the wait, from another thread
    join(waiter, 30)
    stop.set()
    sub._idle(stop, sub._doorbell.turn())  # stopped: no wait at all


def test_an_idle_run_waits_in_one_wait_and_its_stop_ends_it(
    app_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle, the subscriber does not wake to look at its stop: the stop (an event the
    application sets, which cannot ring) is relayed to the doorbell and ends the wait."""
    sub = RoutingQueueSubscriber(
        app_store, CLIENT, AppListener(), poll_interval=3600.0, wake_on_arrival=False
    )
    waits: list[float] = []
    real = sub._doorbell.wait

    def recorded(turn: int, timeout: float) -> bool:
        waits.append(timeout)
        return real(turn, timeout)

    monkeypatch.setattr(sub._doorbell, "wait", recorded)
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop,), daemon=True)
    runner.start()
    wait_for(lambda: bool(waits), what="the idle wait")
    stop.set()
    join(runner, 30)
    assert waits == [3600.0]


def test_an_on_error_that_raises_is_logged_not_propagated(
    app_store: SQLAlchemyQueueStore, caplog: pytest.LogCaptureFixture
) -> None:
    class Raises(AppListener):
        def on_error(self, error: BaseException) -> None:
            raise RuntimeError("on_error bug")

    sub = RoutingQueueSubscriber(app_store, CLIENT, Raises())
    with caplog.at_level(logging.ERROR, logger="lr_client.subscriber"):
        sub._report(ValueError("x"))
    (record,) = caplog.records
    assert record.getMessage() == "listener.on_error raised" and record.exc_info is not None


def test_a_failed_lease_release_is_logged_with_the_owner_and_the_error(
    app_store: SQLAlchemyQueueStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sub = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), owner="me")

    def unavailable(*_args: object) -> None:
        raise StoreUnavailableError("gone")

    monkeypatch.setattr(sub.store, "write", unavailable)
    with caplog.at_level(logging.WARNING, logger="lr_client.subscriber"):
        sub.release_leases()
    (record,) = caplog.records
    assert record.getMessage() == "could not release leases of me: gone"


def test_a_lease_is_renewed_only_in_the_second_half_of_its_time(
    app_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 1))
    (queue,) = app_store.queues.list_queues(CLIENT)
    sub = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), lease_seconds=100.0)
    acquired: list[float] = []
    real = app_store.queues.acquire_lease

    def counting(conn: object, qid: int, owner: str, now: float, seconds: float) -> float | None:
        acquired.append(now)
        return real(conn, qid, owner, now, seconds)  # type: ignore[arg-type]

    monkeypatch.setattr(app_store.queues, "acquire_lease", counting)
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    assert sub._hold_lease(queue.queue_id) and acquired == [1_000_000.0]
    for later in (1.0, 49.9):  # more than half of the lease left: no round trip
        clock[0] = 1_000_000.0 + later
        assert sub._hold_lease(queue.queue_id)
    assert len(acquired) == 1
    clock[0] = 1_000_050.0  # exactly half left: renewed
    assert sub._hold_lease(queue.queue_id) and acquired == [1_000_000.0, 1_000_050.0]
    assert sub._lease_until[queue.queue_id] == 1_000_150.0
    other = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), lease_seconds=100.0)
    assert not other._hold_lease(queue.queue_id)  # held by the first one
    assert queue.queue_id not in other._lease_until


def test_a_lease_taken_by_another_is_forgotten_and_forgetting_twice_is_harmless(
    app_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once another owner holds the queue, this subscriber keeps no expiry of its own for
    it; a lease lost again (a worker's ``LeaseLost`` after the leases were released) is
    no error."""
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 1))
    (queue,) = app_store.queues.list_queues(CLIENT)
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    first = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), lease_seconds=100.0)
    other = RoutingQueueSubscriber(app_store, CLIENT, AppListener(), lease_seconds=100.0)
    assert first._hold_lease(queue.queue_id)
    clock[0] = 1_000_101.0  # the first one's lease expired: the other takes it
    assert other._hold_lease(queue.queue_id)
    assert not first._hold_lease(queue.queue_id)
    assert queue.queue_id not in first._lease_until
    other._leases.lost(queue.queue_id)
    assert queue.queue_id not in other._lease_until
    other._leases.lost(queue.queue_id)  # not held any more: nothing to forget
    first._leases.lost(queue.queue_id)
    assert first._lease_until == {} and other._lease_until == {}


# -- wake-ups on arrival ----------------------------------------------------------------------
@pytest.mark.parametrize("partitions", [1, 2])
def test_run_delivers_what_a_receiver_commits_without_waiting_for_its_poll(
    app_store: SQLAlchemyQueueStore,
    make_sub: Callable[..., RoutingQueueSubscriber],
    partitions: int,
    api: str,
) -> None:
    """An idle subscriber polling once an hour delivers each batch a receiver stores as it
    commits: PostgreSQL's notification wakes it, on SQLite the database file's
    ``data_version``."""
    app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(1, 1))
    sub = make_sub(AppListener(), poll_interval=3600.0, partitions=partitions)
    stop = threading.Event()
    thread = threading.Thread(target=sub.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: len(app_rows(app_store)) == 1, what="the first poll's delivery")
        wait_for(lambda: sub.arrival_watch is not None and sub.arrival_watch.connections == 1)
        # Each batch is stored once the one before was delivered, by then long idle: only a
        # wake-up delivers it before the hour is up.
        for n in (2, 3, 4):
            app_store.recv.apply_log_batch("src-a", CLIENT, log_entries(n, 1))
            wait_for(lambda n=n: len(app_rows(app_store)) == n, what=f"entry {n} delivered")
    finally:
        stop.set()
        join(thread, 30)
    assert sub.arrival_watch is None  # closed by run() on the way out
    assert [p for _, _, p in app_rows(app_store)] == [1, 2, 3, 4]
