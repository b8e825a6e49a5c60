"""The failure policy on SQLite and PostgreSQL: a poison entry parked or blocking, keys held
behind it, an operator's retry and discard; the sync and the async subscriber."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest
from sqlalchemy import String, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client.encryption import seal
from lr_client.errors import InvalidInputError, KeyUnavailableError, ProtocolError
from lr_client.failure_policy import FailurePolicy
from lr_client.headers import decode_headers, encode_headers
from lr_client.keys import Keyring, generate_key
from lr_client.partitioners import HashPartitioner, partition_of
from lr_client.records import ReplicationType, WireEntry
from lr_client.sink_metrics import SinkCollector
from lr_client.store import SQLAlchemyQueueStore
from lr_client.store.recv import parked as pk
from lr_client.store.recv import parked_views as pv
from lr_client.store.schema import tables as s
from lr_server import admin
from tests.kit.aio import SyncDriven
from tests.kit.wait import wait_for

CLIENT = "policy"
LOG = ReplicationType.LOG_ENTRY_SYNC
PARK = FailurePolicy("park", max_attempts=2)


class Base(DeclarativeBase):
    pass


class Applied(Base):
    __tablename__ = "parking_applied"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    position: Mapped[int] = mapped_column()
    key: Mapped[str] = mapped_column(String(32), default="")


class Poisoned(RoutingQueueListener):
    """Writes a row per message; raises on a batch holding a position in ``poison``."""

    def __init__(self, poison: set[int]) -> None:
        self.poison = set(poison)
        self.errors: list[BaseException] = []

    def on_full_sync_start(self, session: Session, source_id: str, snapshot_id: str) -> None:
        pass

    def on_full_sync_end(self, session: Session, source_id: str, snapshot_id: str) -> None:
        pass

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        for m in messages:
            key = "" if m.key is None else m.key.decode()
            session.add(Applied(position=m.source_position, key=key))
        session.flush()
        bad = self.poison & {m.source_position for m in messages}
        if bad:
            raise RuntimeError(f"cannot apply {sorted(bad)}")
        return True

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


def entries(
    first: int, count: int, key: Callable[[int], bytes | None] | None = None
) -> list[WireEntry]:
    key = key or (lambda p: None)
    return [WireEntry(p, LOG, b"v%d" % p, key=key(p)) for p in range(first, first + count)]


def applied(store: SQLAlchemyQueueStore) -> list[tuple[int, str]]:
    with Session(store.engine) as session:
        rows = session.execute(select(Applied.position, Applied.key).order_by(Applied.id))
        return [(r[0], r[1]) for r in rows]


def parked_rows(store: SQLAlchemyQueueStore) -> list[tuple[int, str]]:
    with store.engine.connect() as conn:
        return [(r.source_position, r.state) for r in pv.find(conn)]


@pytest.fixture
def app_store(store: SQLAlchemyQueueStore) -> SQLAlchemyQueueStore:
    Base.metadata.create_all(store.engine)
    return store


@pytest.fixture(params=["sync", "aio"])
def make_sub(
    request: pytest.FixtureRequest, app_store: SQLAlchemyQueueStore
) -> Iterator[Callable[..., RoutingQueueSubscriber]]:
    made: list[RoutingQueueSubscriber] = []

    def make(listener: RoutingQueueListener, **kwargs: object) -> RoutingQueueSubscriber:
        kwargs.setdefault("retry_initial", 0.0)
        kwargs.setdefault("failure_policy", PARK)
        sub: RoutingQueueSubscriber
        if request.param == "aio":
            url = app_store.engine.url.render_as_string(hide_password=False)
            sub = SyncDriven(url, CLIENT, listener, **kwargs)  # type: ignore[assignment]
        else:
            sub = RoutingQueueSubscriber(app_store, CLIENT, listener, **kwargs)  # type: ignore[arg-type]
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.close()


def drain(sub: RoutingQueueSubscriber, done: Callable[[], bool]) -> None:
    def step() -> bool:
        sub.poll_once()
        return done()

    wait_for(step, 30.0, 0.0)


def test_a_poison_entry_among_1000_is_parked_alone_and_the_others_applied_once(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 1000))
    listener = Poisoned({437})
    sub = make_sub(listener, batch_size=500)
    drain(sub, lambda: sum(app_store.inspection.queue_depths().values()) == 0)
    positions = [p for p, _ in applied(app_store)]
    assert positions == [p for p in range(1, 1001) if p != 437]
    assert parked_rows(app_store) == [(437, "parked")]
    (view,) = admin.list_parked(app_store, CLIENT)
    assert (view.source, view.state, view.attempts) == ("src-a", "parked", 2)
    assert "cannot apply [437]" in view.error
    assert admin.show_parked(app_store, view.parked_id).payload == "v437"
    assert len(listener.errors) == 1  # the one whole failure before the bisection
    with app_store.engine.connect() as conn:
        assert pv.open_counts(conn) == {(CLIENT, "src-a"): 1}
        assert pv.blocked_rows(conn) == []


def test_block_policy_delivers_nothing_after_the_failing_entry_and_records_it(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 20))
    listener = Poisoned({5})
    sub = make_sub(listener, batch_size=4, failure_policy=FailurePolicy("block", 3))

    def blocked() -> list[admin.BlockedView]:
        return admin.blocked_queues(app_store, CLIENT)

    drain(sub, lambda: bool(blocked()) and blocked()[0].attempts >= 4)
    assert [p for p, _ in applied(app_store)] == [1, 2, 3, 4]
    (b,) = blocked()
    assert (b.source, b.partition) == ("src-a", None)
    assert "cannot apply [5]" in b.error
    assert parked_rows(app_store) == []
    listener.poison.clear()  # the listener is fixed: the queue flows, the state goes
    drain(sub, lambda: len(applied(app_store)) == 20)
    assert [p for p, _ in applied(app_store)] == list(range(1, 21))
    assert blocked() == []


def _key(p: int) -> bytes:
    return b"bad" if p % 5 == 0 else b"k%d" % (p % 3)


@pytest.mark.parametrize("partitions", [1, 3])
def test_later_entries_of_a_parked_key_are_held_until_retried_other_keys_flow(
    app_store: SQLAlchemyQueueStore,
    make_sub: Callable[..., RoutingQueueSubscriber],
    partitions: int,
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 40, _key))
    listener = Poisoned({10})
    sub = make_sub(listener, batch_size=8, partitions=partitions)
    others = [(p, _key(p).decode()) for p in range(1, 41) if _key(p) != b"bad"]

    def settled() -> bool:
        return (
            sum(app_store.inspection.queue_depths().values()) == 0 and len(applied(app_store)) == 33
        )

    drain(sub, settled)
    got = applied(app_store)
    assert sorted(x for x in got if x[1] != "bad") == others
    assert [p for p, k in got if k == "bad"] == [5]
    for key in {k for _, k in got}:
        mine = [p for p, k in got if k == key]
        assert mine == sorted(mine)
    assert parked_rows(app_store) == [
        (p, "parked" if p == 10 else "held") for p in (10, 15, 20, 25, 30, 35, 40)
    ]
    # More of the key arrive: held too, in order.
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(41, 5, lambda p: b"bad"))
    drain(sub, lambda: len(parked_rows(app_store)) == 12)
    # Fixed, then retried: the parked entry and all held behind it, in order, once.
    listener.poison.clear()
    (head,) = admin.list_parked(app_store, CLIENT, states=["parked"])
    assert [v.state for v in admin.retry_parked(app_store, [head.parked_id])] == ["retrying"]
    drain(sub, lambda: not admin.list_parked(app_store, CLIENT))
    bad = [p for p, k in applied(app_store) if k == "bad"]
    assert bad == [5, 10, 15, 20, 25, 30, 35, 40, 41, 42, 43, 44, 45]
    assert {st for _, st in parked_rows(app_store)} == {"retried"}
    # Later entries of the key flow again.
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(46, 1, lambda p: b"bad"))
    drain(sub, lambda: applied(app_store)[-1] == (46, "bad"))
    assert len(parked_rows(app_store)) == 12


def test_a_discarded_entry_is_kept_with_who_and_when_and_its_held_entries_flow(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 6, lambda p: b"x"))
    listener = Poisoned({2})
    sub = make_sub(listener, batch_size=10)
    drain(sub, lambda: len(parked_rows(app_store)) == 5)
    assert parked_rows(app_store) == [(2, "parked")] + [(p, "held") for p in (3, 4, 5, 6)]
    (head,) = admin.list_parked(app_store, states=["parked"])
    with pytest.raises(admin.StateError):
        admin.retry_parked(app_store, [head.parked_id + 1])  # held: not retried by itself
    (gone,) = admin.discard_parked(app_store, [head.parked_id], by="ops-anna")
    assert (gone.state, gone.discarded_by) == ("discarded", "ops-anna")
    assert gone.discarded_at is not None
    drain(sub, lambda: len(applied(app_store)) == 5)
    assert [p for p, _ in applied(app_store)] == [1, 3, 4, 5, 6]
    assert parked_rows(app_store) == [(2, "discarded")] + [(p, "retried") for p in (3, 4, 5, 6)]
    with pytest.raises(admin.StateError):
        admin.discard_parked(app_store, [head.parked_id])
    with pytest.raises(admin.NotFoundError):
        admin.show_parked(app_store, 99999)


def test_a_poll_counts_the_held_entries_it_delivers_once_released(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 4, lambda p: b"x"))
    sub = make_sub(Poisoned({2, 6}), batch_size=10)
    drain(sub, lambda: len(parked_rows(app_store)) == 3)
    (head,) = admin.list_parked(app_store, states=["parked"])
    admin.discard_parked(app_store, [head.parked_id], by="ops")
    assert sub.poll_once() == 2  # 3 and 4, released: nothing else is queued
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(5, 4, lambda p: b"x"))
    drain(sub, lambda: len(parked_rows(app_store)) == 6)  # 6 parked, 7 and 8 held
    (head,) = admin.list_parked(app_store, states=["parked"])
    admin.discard_parked(app_store, [head.parked_id], by="ops")
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(9, 3, lambda p: b"y"))
    assert sub.poll_once() == 5  # 7 and 8 released, with the 3 that came meanwhile
    assert [p for p, _ in applied(app_store)] == [1, 3, 4, 5, 7, 8, 9, 10, 11]


def test_an_entry_retried_that_fails_again_is_parked_again(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 3))
    sub = make_sub(Poisoned({2}), batch_size=10)
    drain(sub, lambda: len(parked_rows(app_store)) == 1)
    (head,) = admin.list_parked(app_store)
    admin.retry_parked(app_store, [head.parked_id])
    drain(sub, lambda: admin.show_parked(app_store, head.parked_id).attempts == 3)
    again = admin.show_parked(app_store, head.parked_id)
    assert again.state == "parked" and "cannot apply [2]" in again.error
    assert [p for p, _ in applied(app_store)] == [1, 3]


def test_an_entry_the_delivery_cannot_read_blocks_whatever_the_policy(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 2))
    qid = app_store.queues.list_queues(CLIENT)[0].queue_id
    with app_store.write() as conn:  # an entry of no type, behind the receiver's back
        row = {"queue_id": qid, "type": int(ReplicationType.NONE), "source_position": 3}
        row |= {"snapshot_id": "", "snapshot_count": 0, "payload": b"?", "received_at": 0.0}
        conn.execute(insert(s.recv_entries), [row])
    listener = Poisoned(set())
    sub = make_sub(listener, batch_size=10)
    drain(sub, lambda: len(admin.blocked_queues(app_store)) == 1)
    assert [p for p, _ in applied(app_store)] == [1, 2]
    assert parked_rows(app_store) == []
    assert any(isinstance(e, ProtocolError) for e in listener.errors)


def test_a_bad_policy_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="on_failure"):
        FailurePolicy("drop")
    with pytest.raises(InvalidInputError, match="max_attempts"):
        FailurePolicy("park", 0)


def _gauges(store: SQLAlchemyQueueStore) -> dict[tuple[str, str], float]:
    out = {}
    for family in SinkCollector(store, CLIENT).collect():
        for sample in family.samples:
            if sample.name in ("lr_parked_entries", "lr_blocked_queues"):
                out[(sample.name, sample.labels["source"])] = sample.value
    return out


def test_the_sinks_metrics_count_parked_entries_and_blocked_queues(
    app_store: SQLAlchemyQueueStore,
) -> None:
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 4, lambda p: b"k"))
    app_store.recv.apply_log_batch("src-b", CLIENT, entries(11, 1))
    assert _gauges(app_store) == {
        ("lr_parked_entries", "src-a"): 0,
        ("lr_parked_entries", "src-b"): 0,
        ("lr_blocked_queues", "src-a"): 0,
        ("lr_blocked_queues", "src-b"): 0,
    }
    parking = RoutingQueueSubscriber(app_store, CLIENT, Poisoned({2}), failure_policy=PARK)
    with parking:
        drain(parking, lambda: len(parked_rows(app_store)) == 3)  # 2 parked, 3 and 4 held
    assert _gauges(app_store)[("lr_parked_entries", "src-a")] == 3
    app_store.recv.apply_log_batch("src-b", CLIENT, entries(12, 1))
    block = FailurePolicy("block", 1)
    with RoutingQueueSubscriber(app_store, CLIENT, Poisoned({12}), failure_policy=block) as sub:
        drain(sub, lambda: _gauges(app_store)[("lr_blocked_queues", "src-b")] == 1)
    (head,) = admin.list_parked(app_store, states=["parked"])
    admin.discard_parked(app_store, [head.parked_id], by="ops")
    with RoutingQueueSubscriber(app_store, CLIENT, Poisoned(set()), failure_policy=PARK) as sub:
        drain(sub, lambda: _gauges(app_store)[("lr_blocked_queues", "src-b")] == 0)
        drain(sub, lambda: _gauges(app_store)[("lr_parked_entries", "src-a")] == 0)


class FailingSnapshot(Poisoned):
    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        raise RuntimeError("cannot apply the snapshot")


def test_a_failing_full_sync_blocks_under_the_park_policy(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    sid = "s1"
    rows = [WireEntry(i, ReplicationType.SNAPSHOT_SYNC, b"s", snapshot_id=sid) for i in (1, 2)]
    end = WireEntry(3, ReplicationType.LAST_FULL_SYNC_ENTRY, b"", snapshot_id=sid, snapshot_count=2)
    app_store.recv.apply_snapshot_batch("src-a", CLIENT, sid, [*rows, end])
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(4, 2))
    sub = make_sub(FailingSnapshot(set()), batch_size=10)
    drain(sub, lambda: bool(admin.blocked_queues(app_store)))
    assert parked_rows(app_store) == [] and applied(app_store) == []
    assert "cannot apply the snapshot" in admin.blocked_queues(app_store)[0].error


def test_block_policy_with_partitions_blocks_the_failing_partition_only(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    def key(p: int) -> bytes:
        return b"k%d" % (p % 3)

    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 30, key))
    listener = Poisoned({5})
    block = FailurePolicy("block", 2)
    sub = make_sub(listener, batch_size=4, partitions=3, failure_policy=block)
    poisoned = partition_of(HashPartitioner(), key(5), 3)
    others = [p for p in range(1, 31) if partition_of(HashPartitioner(), key(p), 3) != poisoned]

    def settled() -> bool:
        got = {p for p, _ in applied(app_store)}
        return set(others) <= got and bool(admin.blocked_queues(app_store))

    drain(sub, settled)
    (b,) = admin.blocked_queues(app_store)
    assert b.partition == poisoned and b.attempts >= 2
    stuck = [p for p, _ in applied(app_store) if p not in others]
    assert all(p < 5 for p in stuck)  # nothing of its partition after the failing entry
    assert parked_rows(app_store) == []


class Seen(Poisoned):
    """Poisoned, keeping the payloads and headers it was given."""

    def __init__(self, poison: set[int]) -> None:
        super().__init__(poison)
        self.seen: list[tuple[int, bytes, dict[str, str]]] = []

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        self.seen += [(m.source_position, m.payload, dict(m.headers)) for m in messages]
        return super().process_log_entries(session, source_id, messages)


def test_a_parked_sealed_entry_keeps_its_ciphertext_and_headers_and_is_opened_on_retry(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    keyring = Keyring({"k1": generate_key()})
    sealed = [
        WireEntry(
            p,
            LOG,
            seal(keyring, b"secret-%d" % p, ["sink"], "src-a", CLIENT),
            headers=encode_headers({"schema": f"v{p}"}),
        )
        for p in (1, 2, 3)
    ]
    app_store.recv.apply_log_batch("src-a", CLIENT, sealed)
    listener = Seen({2})
    sub = make_sub(listener, batch_size=10, keyring=keyring)
    drain(sub, lambda: len(parked_rows(app_store)) == 1)
    with app_store.engine.connect() as conn:
        stored = conn.execute(select(pk.parked.c.payload, pk.parked.c.headers)).one()
    assert b"secret" not in bytes(stored[0])  # the dead-letter table holds no plaintext
    assert decode_headers(stored[1]) == {"schema": "v2"}
    (head,) = admin.list_parked(app_store)
    listener.poison.clear()
    admin.retry_parked(app_store, [head.parked_id])
    drain(sub, lambda: admin.show_parked(app_store, head.parked_id).state == "retried")
    assert [(p, b, h) for p, b, h in listener.seen if p == 2][-1] == (
        2,
        b"secret-2",
        {"schema": "v2"},
    )
    assert [p for p, _ in applied(app_store)] == [1, 3, 2]


def test_a_sealed_entry_without_its_key_blocks_whatever_the_policy_naming_queue_and_position(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    writer = Keyring({"k1": generate_key()})
    sealed = [
        WireEntry(p, LOG, seal(writer, b"s%d" % p, ["sink"], "src-a", CLIENT)) for p in (1, 2)
    ]
    app_store.recv.apply_log_batch("src-a", CLIENT, sealed)
    listener = Seen(set())
    sub = make_sub(listener, keyring=Keyring({"k2": generate_key()}))
    assert sub.poll_once() == 0
    (queue,) = app_store.queues.list_queues(CLIENT)
    error = listener.errors[-1]
    assert isinstance(error, KeyUnavailableError)
    assert str(error).startswith(f"{queue.queue_name}: delivery blocked at source position 1: ")
    assert listener.seen == [] and applied(app_store) == [] and parked_rows(app_store) == []


class RollsBack(Poisoned):
    """Writes a row per message; on a batch holding a position in ``poison`` it rolls the
    session back and reports success."""

    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        for m in messages:
            session.add(Applied(position=m.source_position))
        session.flush()
        if self.poison & {m.source_position for m in messages}:
            session.rollback()
        return True


def test_a_listener_rolling_back_while_a_batch_is_bisected_parks_its_entry_alone(
    app_store: SQLAlchemyQueueStore, make_sub: Callable[..., RoutingQueueSubscriber]
) -> None:
    """The bisection calls the listener in savepoints, where its session's rollback ends
    only that savepoint: the part fails (never counted as applied with its writes undone,
    never an error of the savepoint's own), the others apply once, the entry is parked;
    retried, it fails and is parked again."""
    app_store.recv.apply_log_batch("src-a", CLIENT, entries(1, 8))
    listener = RollsBack({5})
    sub = make_sub(listener, batch_size=8)
    drain(sub, lambda: sum(app_store.inspection.queue_depths().values()) == 0)
    assert [p for p, _ in applied(app_store)] == [1, 2, 3, 4, 6, 7, 8]
    assert parked_rows(app_store) == [(5, "parked")]
    (error,) = listener.errors  # the whole batch, before the bisection
    assert str(error).endswith("attempt 1): the listener rolled back the delivery transaction")
    (view,) = admin.list_parked(app_store, CLIENT)
    assert view.attempts == 2
    assert view.error.endswith("the listener rolled back the delivery transaction")
    admin.retry_parked(app_store, [view.parked_id])
    drain(sub, lambda: admin.show_parked(app_store, view.parked_id).attempts == 3)
    assert admin.show_parked(app_store, view.parked_id).state == "parked"
    assert [p for p, _ in applied(app_store)] == [1, 2, 3, 4, 6, 7, 8]
