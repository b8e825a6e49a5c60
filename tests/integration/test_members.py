"""Members on PostgreSQL: one owner per unit under lapsing leases, and two servers of a site.

The race test runs three members of one site in threads, each with its own
heartbeat, placement and "shipping" loop. Heartbeats stall at random for
longer than the lease timeout (a paused process), so units change hands
over and over; one member's clock runs 15 % slow (skew within the lease
margin). Each shipping loop writes the stream's cursor under its fence
whenever it believes it may ship. Ordered by time, the accepted writes must
carry non-decreasing tokens: no member ever shipped after a later owner
began.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from lr_client import RoutingQueueClient
from lr_client.errors import FencedError, StoreUnavailableError
from lr_client.records import Fence, ReplicationType, WireEntry
from lr_client.store import QueueStore, SQLAlchemyQueueStore, open_store
from lr_server import Site
from lr_server.cluster.membership import Membership
from lr_server.cluster.placement import TRIM_UNIT, place, stream_unit
from lr_server.config import MembersConfig, load_config
from lr_server.server import SiteServer
from tests.kit.sites import Sites, SiteSpec, free_port, write_config
from tests.kit.wait import scaled, wait_for

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)

UNIT = stream_unit("b", "policy")


@pytest.fixture
def pg_store(db_url: str) -> Iterator[SQLAlchemyQueueStore]:
    store = open_store(db_url)
    assert isinstance(store, SQLAlchemyQueueStore)
    store.create_schema()
    yield store
    store.close()


class SlowClock:
    """A monotonic clock running at ``rate`` of real time."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()

    def __call__(self) -> float:
        return self.start + (time.monotonic() - self.start) * self.rate


def test_two_members_never_ship_one_unit_at_once(pg_store: SQLAlchemyQueueStore) -> None:
    lease = 0.6
    stop = threading.Event()
    shipped: list[tuple[float, str, int]] = []  # (when it decided to ship, member, token)
    refused = [0]
    stalls = [0]
    lock = threading.Lock()
    members = [
        Membership(
            pg_store.members,
            f"m{i}",
            [UNIT],
            lambda fences: None,
            lease_timeout=lease,
            heartbeat_interval=0.05,
            clock=SlowClock(0.85) if i == 0 else time.monotonic,
        )
        for i in range(3)
    ]

    def heartbeats(m: Membership, rng: random.Random) -> None:
        while not stop.wait(0.05):
            if rng.random() < 0.03:
                with lock:
                    stalls[0] += 1
                stop.wait(rng.uniform(0.5, 1.2))  # a stall past the lease, now and then
            m.heartbeat()

    def rounds(m: Membership) -> None:
        while not stop.wait(0.05):
            m.round()

    def ships(m: Membership) -> None:
        n = 0
        while not stop.is_set():
            fence = m.fences.get(UNIT)
            if fence is None or not m.valid():
                stop.wait(0.005)
                continue
            decided = time.monotonic()
            n += 1
            try:
                pg_store.shipping.set_cursor("b", "policy", n, fence=fence)
            except FencedError:
                with lock:
                    refused[0] += 1
                continue
            with lock:
                shipped.append((decided, m.member_id, fence.token))

    for m in members:
        m.join()
    threads = [
        threading.Thread(target=f, args=a, daemon=True)
        for i, m in enumerate(members)
        for f, a in ((heartbeats, (m, random.Random(i))), (rounds, (m,)), (ships, (m,)))
    ]
    for t in threads:
        t.start()

    def run_done() -> bool:
        # The run itself: stalls and takeovers happen at random within it, until the
        # unit changed hands five times (six owners shipped: twice the least below).
        with lock:
            return len({tok for _, _, tok in shipped}) >= 6

    try:
        wait_for(
            run_done,
            60,
            what="six owners shipped",
            detail=lambda: f"{stalls[0]} stalls, tokens {sorted({t for _, _, t in shipped})}",
        )
    finally:
        stop.set()
    for t in threads:
        t.join(10)
    for m in members:
        m.leave()
    shipped.sort()
    tokens = [tok for _, _, tok in shipped]
    assert tokens == sorted(tokens), "a deposed owner shipped after its successor began"
    owners = {tok: {who for _, who, t in shipped if t == tok} for tok in set(tokens)}
    assert all(len(who) == 1 for who in owners.values())  # one member per token
    assert len(owners) >= 3, f"too few takeovers to mean anything: {owners}"
    print(f"{len(shipped)} writes under {len(owners)} tokens, {refused[0]} refused by the fence")


def _member_config(tmp_path: Path, sites: Sites, member: str) -> SiteServer:
    spec = SiteSpec(
        "a", sites.url("a"), destinations=[("b", sites.port("b"))], clients=("policy", "inventory")
    )
    config = load_config(write_config(tmp_path, spec))
    members = MembersConfig(id=member, lease_timeout=3.0, heartbeat_interval=0.1)
    return SiteServer(replace(config, members=members))


def _owners(store: SQLAlchemyQueueStore) -> dict[str, str | None]:
    live = {m.instance: m.member_id for m in store.members.list_members(3.0) if m.alive}
    return {x.unit: live.get(x.owner or "") for x in store.members.list_leases()}


def test_two_servers_of_a_site_share_its_units_and_deliver_each_entry_once(
    tmp_path: Path, sites: Sites
) -> None:
    sites.start("b", sources=["a"], clients=("policy", "inventory"))
    one = _member_config(tmp_path, sites, "a-1")
    two = _member_config(tmp_path, sites, "a-2")
    units = {stream_unit("b", c) for c in ("policy", "inventory")} | {TRIM_UNIT}
    store = open_store(sites.url("a"))
    assert isinstance(store, SQLAlchemyQueueStore)
    store.create_schema()
    store.sites.register_sites(["b"])
    clients = {c: RoutingQueueClient(store, "a", c) for c in ("policy", "inventory")}
    sink = sites.store("b")
    try:
        one.start()
        two.start()

        def placed() -> dict[str, str | None] | None:
            now = _owners(store)
            owned = set(now) == units and all(now.values())
            started = {c for s in (one, two) for c in s._session_fences.get("b", {})}
            return now if owned and started == {"policy", "inventory"} else None

        owners = wait_for(placed, scaled(30), what="every unit owned, its session started")
        # Each stream is shipped by its owner only.
        for server, member in ((one, "a-1"), (two, "a-2")):
            mine = {u for u, o in owners.items() if o == member and u != TRIM_UNIT}
            assert set(server._session_fences.get("b", {})) == {u.split("/")[2] for u in mine}

        def send(prefix: str, n: int) -> None:
            for i in range(n):
                for client in clients.values():
                    with Session(store.engine) as s, s.begin():
                        client.transmit_log_entry_message(s, f"{prefix}{i}".encode(), ["b"])

        def received(c: str) -> list[bytes]:
            queues = sink.queues.list_queues(c)
            if not queues:
                return []
            with sink.read() as conn:
                return [e.payload for e in sink.queues.read_queue(conn, queues[0].queue_id, 1000)]

        send("x", 20)
        wait_for(
            lambda: all(len(received(c)) == 20 for c in ("policy", "inventory")),
            scaled(60),
            what="first entries at the sink",
        )
        # Drain a-1: its units go to a-2 (and only its units move).
        store.members.set_member_weight("a-1", 0)
        wait_for(lambda: set(_owners(store).values()) == {"a-2"}, scaled(30), what="a-1 drained")
        send("y", 20)
        # a-2 stops cleanly: its leases are released, a-1 takes the units at once (weight 1).
        store.members.set_member_weight("a-1", 1)
        two.stop()
        stopped = time.monotonic()
        wait_for(lambda: set(_owners(store).values()) == {"a-1"}, scaled(30), what="a-1 owns all")
        print(f"units moved {time.monotonic() - stopped:.2f} s after a clean stop")
        send("z", 20)
        want = [f"{p}{i}".encode() for p in "xyz" for i in range(20)]
        wait_for(
            lambda: all(received(c) == want for c in ("policy", "inventory")),
            scaled(60),
            what="every entry once, in order",
        )
    finally:
        one.stop()
        two.stop()
        store.close()


def test_a_destination_with_several_addresses_is_reached_through_the_one_that_answers(
    tmp_path: Path, sites: Sites
) -> None:
    """The first address has nobody listening (a member that is down): the session fails over."""
    sites.start("b", sources=["a"])
    dead = free_port()
    spec = SiteSpec(
        "a",
        sites.url("a"),
        destinations=[("b", dead)],
        extra=f'addresses = ["127.0.0.1:{sites.port("b")}"]',  # into the [[destinations]] table
    )
    config = load_config(write_config(tmp_path, spec))
    assert config.destinations[0].all_addresses() == [
        f"127.0.0.1:{dead}",
        f"127.0.0.1:{sites.port('b')}",
    ]
    with Site(config) as source:
        client = RoutingQueueClient(source.store, "a", "policy")
        with Session(source.store.engine) as s, s.begin():
            client.transmit_log_entry_message(s, b"via the second address", ["b"])
        sink = sites.store("b")
        wait_for(
            lambda: sink.recv.sink_progress("a", "policy").entries_received == 1,
            scaled(30),
            what="the entry at the sink",
        )


def test_two_receivers_of_one_sink_apply_each_batch_once(db_url: str) -> None:
    """Two sink members (two stores on one database) given the same batches at once."""
    stores = [open_store(db_url) for _ in range(2)]
    stores[0].create_schema()
    batches = [
        [WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, f"e{p}".encode()) for p in range(k, k + 10)]
        for k in range(1, 301, 10)
    ]
    errors: list[BaseException] = []

    def receive(store: QueueStore) -> None:
        try:
            for batch in batches:
                store.recv.apply_log_batch("a", "policy", batch, batch[0].position - 1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=receive, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(60))
    try:
        assert not errors, errors
        (queue,) = stores[0].queues.list_queues("policy")
        with stores[0].read() as conn:
            got = [
                e.source_position for e in stores[0].queues.read_queue(conn, queue.queue_id, 1000)
            ]
        assert got == list(range(1, 301))  # each once, in order
    finally:
        for s in stores:
            s.close()


class CutStore:
    """The store as a member sees it; ``cut`` makes every call fail as a lost database."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.cut = False

    def __getattr__(self, name: str) -> object:
        if self.cut:
            raise StoreUnavailableError("connection refused (cut from the database)")
        return getattr(self.store, name)


def test_a_member_cut_from_the_database_stops_and_the_other_takes_over(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    lease = 1.0
    cut = CutStore(pg_store.members)
    held: dict[str, dict[str, object]] = {"m1": {}, "m2": {}}
    stop = threading.Event()
    m1 = Membership(
        cut,  # type: ignore[arg-type]
        "m1",
        [UNIT, TRIM_UNIT],
        lambda f: held.__setitem__("m1", dict(f)),
        lease_timeout=lease,
        heartbeat_interval=0.1,
    )
    m2 = Membership(
        pg_store.members,
        "m2",
        [UNIT, TRIM_UNIT],
        lambda f: held.__setitem__("m2", dict(f)),
        lease_timeout=lease,
        heartbeat_interval=0.1,
    )
    m1.join()
    pg_store.members.set_member_weight("m1", 5)  # m1 wins both units while it lives
    m2.join()
    threads = [
        threading.Thread(target=f, args=(stop,), daemon=True)
        for m in (m1, m2)
        for f in (m.run, m.beat)
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: set(held["m1"]) == {UNIT, TRIM_UNIT}, scaled(10), what="m1 owns all")
        cut.cut = True
        cut_at = time.monotonic()
        wait_for(lambda: not held["m1"], scaled(10), what="m1 stops its work")
        stopped = time.monotonic() - cut_at
        wait_for(lambda: set(held["m2"]) == {UNIT, TRIM_UNIT}, scaled(10), what="m2 takes over")
        taken = time.monotonic() - cut_at
        print(f"cut: m1 stopped after {stopped:.2f} s, m2 owned its units after {taken:.2f} s")
        assert stopped < taken  # never both
        old = pg_store.members.list_leases()
        assert {x.member_id for x in old} == {"m2"}
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        m2.leave()


def test_a_second_server_with_a_running_members_id_takes_it_over(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    held: dict[str, dict[str, object]] = {"old": {}, "new": {}}
    old = Membership(pg_store.members, "a-1", [UNIT], lambda f: held.__setitem__("old", dict(f)))
    new = Membership(pg_store.members, "a-1", [UNIT], lambda f: held.__setitem__("new", dict(f)))
    old.join()
    assert set(held["old"]) == {UNIT}
    new.join()  # the old run's lease is free at once: its instance is no longer the member's
    assert set(held["new"]) == {UNIT}
    first = Fence(UNIT, old.instance, 1)
    assert new.fences[UNIT].token == first.token + 1
    assert not old.heartbeat()  # it finds itself replaced and stops its work
    assert held["old"] == {}
    with pytest.raises(FencedError):
        pg_store.shipping.set_cursor("b", "policy", 1, fence=first)
    new.leave()


def test_units_kept_through_a_lapse_are_released_when_they_move(
    pg_store: SQLAlchemyQueueStore,
) -> None:
    """A member whose work stopped for a late heartbeat still gives up what moves away."""
    units = [stream_unit("b", f"c{i}") for i in range(10)]
    m1 = Membership(pg_store.members, "m1", units, lambda f: None)
    m2 = Membership(pg_store.members, "m2", units, lambda f: None)
    m1.join()
    assert set(m1.fences) == set(units)
    m1._valid_until = 0.0  # its heartbeat is late: the next round stops its work
    m1.round()
    assert m1.fences == {}
    m2.join()  # wins some units, held by m1 (alive) for now
    assert m1.heartbeat()
    m1.round()  # releases what m2 wins, runs the rest again
    m2.round()
    want = place(units, {"m1": 1, "m2": 1})
    assert set(m2.fences) == {u for u, o in want.items() if o == "m2"} != set()
    assert set(m1.fences) == {u for u, o in want.items() if o == "m1"}
    m1.leave()
    m2.leave()


def test_a_steady_round_writes_no_lease(
    pg_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that changes nothing reads the leases it holds and takes none again (an
    idle member costs a read per round, not a write per unit); a lease lost meanwhile
    is still seen as lost."""
    units = [stream_unit("b", f"c{i}") for i in range(5)]
    member = Membership(pg_store.members, "m1", units, lambda f: None)
    member.join()
    held = dict(member.fences)
    assert set(held) == set(units)
    taken: list[str] = []
    acquire = pg_store.members.acquire_unit

    def counted(unit: str, *args: object) -> Fence | None:
        taken.append(unit)
        return acquire(unit, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(pg_store.members, "acquire_unit", counted)
    member.round()
    assert taken == [] and member.fences == held
    other = Membership(pg_store.members, "m2", [], lambda f: None, weight=0)  # places nothing
    other.join()
    pg_store.members.remove_member("m1")  # an operator's clean-up: its leases are free ...
    assert (
        pg_store.members.acquire_unit(units[0], "m2", other.instance, 5.0) is not None
    )  # ... taken
    pg_store.members.join_member("m1", member.instance, "", 1)
    taken.clear()
    member.round()  # none is held any more: each asked for, and m2 keeps the one it took
    assert sorted(taken) == sorted(units) and set(member.fences) == set(units[1:])
    member.leave()
    other.leave()


class CountedMembers:
    """The members role, counting heartbeats and the rounds' reads of the members."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.beats_since_round = 0

    def heartbeat_member(self, *args: object) -> object:
        self.beats_since_round += 1
        return self.store.heartbeat_member(*args)  # type: ignore[attr-defined]

    def list_members(self, *args: object) -> object:
        self.beats_since_round = 0
        return self.store.list_members(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def test_a_steady_member_places_only_when_its_heartbeat_sees_a_change(
    pg_store: SQLAlchemyQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats of a member whose placement is settled run no round; one that sees a
    member come, or a lease of its own lost, starts one at once (the steady period, which
    would also place, is set out of reach)."""
    monkeypatch.setattr("lr_server.cluster.membership.STEADY_ROUND_PERIOD", 10**6)
    units = [stream_unit("b", f"c{i}") for i in range(6)]
    counted = CountedMembers(pg_store.members)
    # m2 never beats (its rounds are the test's): a lease timeout no wait here reaches,
    # so no step depends on a member expiring (on a busy machine the waits are long).
    m1 = Membership(
        counted, "m1", units, lambda f: None, lease_timeout=120.0, heartbeat_interval=0.05
    )  # type: ignore[arg-type]
    m2 = Membership(
        pg_store.members, "m2", units, lambda f: None, lease_timeout=120.0, heartbeat_interval=0.05
    )
    stop = threading.Event()
    m1.join()
    threads = [threading.Thread(target=f, args=(stop,), daemon=True) for f in (m1.run, m1.beat)]
    for t in threads:
        t.start()
    try:
        wait_for(
            lambda: counted.beats_since_round >= 10, scaled(10), what="10 heartbeats, no round"
        )
        assert set(m1.fences) == set(units)
        m2.join()  # only its join: m1's heartbeat must notice it and give its share up
        share = {u for u, w in place(units, {"m1": 1, "m2": 1}).items() if w == "m1"}
        wait_for(lambda: set(m1.fences) == share, scaled(10), what="m1 gives m2 its share")
        m2.round()
        assert set(m2.fences) == set(units) - share != set()
        wait_for(lambda: counted.beats_since_round >= 10, scaled(10), what="steady again")
        m2.leave()
        wait_for(lambda: set(m1.fences) == set(units), scaled(10), what="m1 takes all back")
        wait_for(lambda: counted.beats_since_round >= 10, scaled(10), what="steady again")
        tokens = {u: f.token for u, f in m1.fences.items()}
        pg_store.members.remove_member("m1")  # an operator's clean-up: its leases are freed
        wait_for(
            lambda: (
                set(m1.fences) == set(units)
                and all(f.token > tokens[u] for u, f in m1.fences.items())
            ),
            scaled(10),
            what="m1 joined again and took its units anew",
        )
        held = {x.unit: x.token for x in pg_store.members.list_leases() if x.owner == m1.instance}
        assert held == {u: f.token for u, f in m1.fences.items()}
        wait_for(lambda: counted.beats_since_round >= 10, scaled(10), what="steady again")
        lost = m1.fences[units[0]]
        assert pg_store.members.release_unit(lost)  # freed behind its back, its row intact
        wait_for(
            lambda: (f := m1.fences.get(units[0])) is not None and f.token > lost.token,
            scaled(10),
            what="m1 took the freed unit again",
        )
        wait_for(lambda: counted.beats_since_round >= 10, scaled(10), what="steady again")
        stop.set()  # the heartbeat's end wakes the placement loop, however long its wait
        for t in threads:
            t.join(scaled(5))
        assert not any(t.is_alive() for t in threads)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        m1.leave()
