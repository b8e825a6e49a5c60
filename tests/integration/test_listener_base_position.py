"""The listener is told a snapshot's base position at its start and end; older listeners too."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.listener import takes_base_position
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore

CLIENT = "policy"
SNAP, END = ReplicationType.SNAPSHOT_SYNC, ReplicationType.LAST_FULL_SYNC_ENTRY


def snapshot(sid: str, count: int, base: int, *, on_entries: bool) -> list[WireEntry]:
    """A snapshot as a source sends it: the base on every entry, or (older) on its end only."""
    rows = [
        WireEntry(i, SNAP, b"r%d" % i, sid, base_position=base if on_entries else 0)
        for i in range(1, count + 1)
    ]
    return [*rows, WireEntry(count + 1, END, b"", sid, count, base_position=base)]


class _Applies(RoutingQueueListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, object]] = []

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.events.append(("rows", source_id, tuple(m.source_position for m in messages)))
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.events.append(("log", source_id, tuple(m.source_position for m in messages)))
        return True


class NewStyle(_Applies):
    def on_full_sync_start(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        self.events.append(("start", snapshot_id, base_position))

    def on_full_sync_end(
        self,
        session: Session,
        source_id: str,
        snapshot_id: str,
        base_position: int | None = None,
    ) -> None:
        self.events.append(("end", snapshot_id, base_position))


class OldStyle(_Applies):
    """Overrides with the signature of earlier releases: no ``base_position``."""

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:  # type: ignore[override]
        self.events.append(("start", snapshot_id, "old"))

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:  # type: ignore[override]
        self.events.append(("end", snapshot_id, "old"))


class Keywords(_Applies):
    def on_full_sync_start(self, session: Session, *args: Any, **kwargs: Any) -> None:
        self.events.append(("start", args[1], kwargs))


@pytest.fixture
def subs(store: SQLAlchemyQueueStore) -> Iterator[list[RoutingQueueSubscriber]]:
    made: list[RoutingQueueSubscriber] = []
    yield made
    for sub in made:
        sub.close()


def _sub(
    store: SQLAlchemyQueueStore,
    made: list[RoutingQueueSubscriber],
    listener: RoutingQueueListener,
    **kw: Any,
) -> RoutingQueueSubscriber:
    sub = RoutingQueueSubscriber(store, CLIENT, listener, retry_initial=0.0, **kw)
    made.append(sub)
    return sub


def test_start_and_end_are_told_the_base_even_when_only_the_end_carries_it(
    store: SQLAlchemyQueueStore, subs: list[RoutingQueueSubscriber]
) -> None:
    """Complete delivery: the end is queued before the start is delivered, and it has the base."""
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", snapshot("s1", 3, 17, on_entries=False))
    store.recv.apply_log_batch("a", CLIENT, [WireEntry(18, ReplicationType.LOG_ENTRY_SYNC, b"l")])
    listener = NewStyle()
    assert _sub(store, subs, listener, batch_size=2).poll_once() == 4
    assert listener.events == [
        ("start", "s1", 17),
        ("rows", "a", (1, 2)),
        ("rows", "a", (3,)),
        ("end", "s1", 17),
        ("log", "a", (18,)),
    ]


def test_streaming_delivery_tells_the_start_the_base_its_entries_carry(
    store: SQLAlchemyQueueStore, subs: list[RoutingQueueSubscriber]
) -> None:
    whole = snapshot("s1", 3, 40, on_entries=True)
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", whole[:2])  # the end has not arrived
    listener = NewStyle()
    sub = _sub(store, subs, listener, snapshot_delivery="streaming")
    assert sub.poll_once() == 2
    assert listener.events == [("start", "s1", 40), ("rows", "a", (1, 2))]
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", whole[2:])
    assert sub.poll_once() == 1
    assert listener.events[2:] == [("rows", "a", (3,)), ("end", "s1", 40)]


def test_streaming_from_an_older_source_starts_without_a_base_and_ends_with_it(
    store: SQLAlchemyQueueStore, subs: list[RoutingQueueSubscriber]
) -> None:
    whole = snapshot("s1", 2, 40, on_entries=False)
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", whole[:1])
    listener = NewStyle()
    sub = _sub(store, subs, listener, snapshot_delivery="streaming")
    assert sub.poll_once() == 1
    assert listener.events == [("start", "s1", None), ("rows", "a", (1,))]  # not known yet
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", whole[1:])
    assert sub.poll_once() == 1
    assert listener.events[-1] == ("end", "s1", 40)


def test_a_snapshot_based_at_zero_is_told_zero(
    store: SQLAlchemyQueueStore, subs: list[RoutingQueueSubscriber]
) -> None:
    store.recv.apply_snapshot_batch("a", CLIENT, "s0", snapshot("s0", 0, 0, on_entries=True))
    listener = NewStyle()
    assert _sub(store, subs, listener).poll_once() == 0
    assert listener.events == [("start", "s0", 0), ("end", "s0", 0)]


def test_a_listener_with_the_older_signature_is_called_as_before(
    store: SQLAlchemyQueueStore, subs: list[RoutingQueueSubscriber]
) -> None:
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", snapshot("s1", 2, 9, on_entries=True))
    listener = OldStyle()
    assert _sub(store, subs, listener).poll_once() == 2
    assert listener.events == [("start", "s1", "old"), ("rows", "a", (1, 2)), ("end", "s1", "old")]


def test_a_listener_taking_keywords_gets_the_base_by_name(
    store: SQLAlchemyQueueStore, subs: list[RoutingQueueSubscriber]
) -> None:
    store.recv.apply_snapshot_batch("a", CLIENT, "s1", snapshot("s1", 1, 5, on_entries=True))
    listener = Keywords()
    assert _sub(store, subs, listener).poll_once() == 1
    assert listener.events == [("start", "s1", {"base_position": 5}), ("rows", "a", (1,))]


def test_which_callbacks_take_the_base() -> None:
    assert takes_base_position(NewStyle().on_full_sync_start)
    assert takes_base_position(NewStyle().on_full_sync_end)
    assert not takes_base_position(OldStyle().on_full_sync_start)
    assert takes_base_position(Keywords().on_full_sync_start)
    assert takes_base_position(Keywords().on_full_sync_end)  # the default's: it takes it
    assert not takes_base_position(print)  # print(*args, sep, end, file, flush)
