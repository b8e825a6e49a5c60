"""Several ``lr server`` members of one source site on PostgreSQL: kill -9 and rolling restarts.

Source ``a`` runs three ``lr server`` processes (members ``a-1`` .. ``a-3``)
on its one database and replicates two clients to sinks ``b`` and ``c``
(four sender streams and the trim job: five units). Under steady traffic a
member is SIGKILLed (the one owning the most streams, or one at random) or
stopped with SIGTERM (each in turn), or cut from its database through a
``FaultProxy``: its units must be owned by the others within the lease
timeout (at once after a clean stop), and the verifier must find nothing
lost, duplicated or reordered at the sinks' listeners once they drain.

``LR_MEMBERS_TRIALS=N`` runs N kill trials (CI default: 3);
``LR_RELIABILITY_SEED`` replays a printed seed.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from lr_client.store import open_store
from lr_server.cluster.placement import TRIM_UNIT, place, stream_unit
from tests.kit.procs import LrServer
from tests.kit.scrape import metric_sum
from tests.kit.sites import free_port
from tests.kit.tcp_proxy import FaultProxy
from tests.kit.traffic import SourceApp
from tests.kit.wait import scaled, wait_for
from tests.reliability.harness import Deployment, reliability_seed, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)]

LEASE = 2.0
HEARTBEAT = 0.25
TUNE = {"members": {"lease_timeout": LEASE, "heartbeat_interval": HEARTBEAT}}
SINKS = ("b", "c")
CLIENTS = ("policy", "inventory")
UNITS = [stream_unit(d, c) for d in SINKS for c in CLIENTS] + [TRIM_UNIT]


def member_trials(default: int = 3) -> int:
    raw = os.environ.get("LR_MEMBERS_TRIALS", "").strip()
    return max(1, int(raw)) if raw else default


def member_of(key: str) -> str:
    """The member id of a source server key of the deployment ("a" -> a-1, "a#2" -> a-2)."""
    return "a-1" if key == "a" else "a-" + key.split("#")[1]


def placement(dep: Deployment) -> dict[str, str | None]:
    """unit -> the live member owning it (None: not owned by a live member)."""
    store = open_store(dep.engine("a"))
    live = {m.instance: m.member_id for m in store.members.list_members(LEASE) if m.alive}
    leases = {x.unit: x.owner for x in store.members.list_leases()}
    return {u: live.get(leases.get(u) or "") for u in UNITS}


def alive(dep: Deployment) -> set[str]:
    return {m.member_id for m in open_store(dep.engine("a")).members.list_members(LEASE) if m.alive}


def wait_placed(dep: Deployment, members: set[str], timeout: float = 60.0) -> dict[str, str | None]:
    """Wait until exactly ``members`` are alive and every unit is owned by one of them."""

    def placed() -> dict[str, str | None] | None:
        now = placement(dep)
        if alive(dep) == members and all(o in members for o in now.values()):
            return now
        return None

    return wait_for(
        placed,
        scaled(timeout),
        0.05,
        what=f"every unit owned by {sorted(members)}",
        detail=lambda: f"{placement(dep)}\n{dep.logs()}",
    )


def wait_settled(dep: Deployment, members: set[str]) -> dict[str, str | None]:
    """Wait until every unit is owned by its rendezvous winner among ``members``."""
    want = place(UNITS, {m: 1 for m in members})
    return wait_for(
        lambda: placement(dep) if placement(dep) == want else None,
        scaled(60),
        0.05,
        what=f"placement settled over {sorted(members)}",
        detail=lambda: f"{placement(dep)} != {want}\n{dep.logs()}",
    )


def start(dep: Deployment, source: SourceApp) -> None:
    """Start the deployment and the traffic; return once entries reach the listeners."""
    wait_placed(dep, {member_of(k) for k in dep.source_servers})
    source.start()
    floor = dep.verify(source).applied + 50
    wait_for(lambda: dep.verify(source).applied >= floor, scaled(60), what="traffic flowing")


@pytest.mark.parametrize("pick", ["most-streams", "random"])
def test_sigkill_of_a_member_moves_its_units_within_the_lease_timeout(
    tmp_path: Path, db_url_factory: Callable[[str], str], pick: str
) -> None:
    seed = reliability_seed()
    rng = random.Random(seed)
    dep = Deployment(
        tmp_path, db_url_factory, sinks=SINKS, clients=CLIENTS, tune=TUNE, source_members=3
    )
    source = SourceApp(
        dep.raw_urls["a"], "a", list(SINKS), clients=CLIENTS, seed=seed, rate=80, max_batch=3
    )
    everyone = {member_of(k) for k in dep.source_servers}
    moves: list[float] = []
    try:
        dep.start()
        for trial in range(member_trials()):
            source.prefix = f"t{trial}"
            start(dep, source)
            before = wait_placed(dep, everyone)
            owned = Counter(o for u, o in before.items() if u != TRIM_UNIT)
            # The member with the most streams (ties at random), or any member (one that
            # owns little or nothing included), at a random moment.
            if pick == "random":
                victim = rng.choice(dep.source_servers)
            else:
                victim = max(dep.source_servers, key=lambda k: (owned[member_of(k)], rng.random()))
            time.sleep(rng.uniform(0.0, 1.0))
            dep.kill("sender", victim)
            killed = time.monotonic()
            after = wait_placed(dep, everyone - {member_of(victim)})
            moves.append(time.monotonic() - killed)
            moved = {u for u in UNITS if before[u] != after[u]}
            assert moved == {u for u in UNITS if before[u] == member_of(victim)}  # only its own
            time.sleep(rng.uniform(0.2, 1.0))  # traffic goes on with the others
            dep.restart("sender", victim)
            wait_placed(dep, everyone)
            source.stop()
            report = dep.wait_drained(source)
            print(
                f"trial {trial} (seed {seed}): killed {member_of(victim)} ({pick}, "
                f"{owned[member_of(victim)]} stream(s)), units moved in "
                f"{moves[-1]:.2f} s: {report.counts()}"
            )
            report.assert_clean()
        source.stop()
        report = dep.wait_drained(source)
        report.assert_clean()
        assert report.applied > 0 and not source.errors, source.errors[:5]
        print(
            f"kill -9 -> units owned by the others: max {max(moves):.2f} s, "
            f"mean {sum(moves) / len(moves):.2f} s over {len(moves)} trials (lease {LEASE} s)"
        )
        # Taken over once the dead member's heartbeat is LEASE old, at the next round.
        assert max(moves) <= scaled(LEASE + 4 * HEARTBEAT + 1.0)
    except BaseException:
        print("\n".join(dep.events))
        raise
    finally:
        source.close()
        dep.close()


def test_rolling_restart_of_every_member_under_traffic(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    seed = reliability_seed()
    dep = Deployment(
        tmp_path, db_url_factory, sinks=SINKS, clients=CLIENTS, tune=TUNE, source_members=3
    )
    source = SourceApp(
        dep.raw_urls["a"], "a", list(SINKS), clients=CLIENTS, seed=seed, rate=80, max_batch=3
    )
    everyone = {member_of(k) for k in dep.source_servers}
    try:
        dep.start()
        start(dep, source)
        for key in dep.source_servers:
            before = wait_settled(dep, everyone)
            store = open_store(dep.engine("a"))
            (instance,) = [
                m.instance
                for m in store.members.list_members(LEASE)
                if m.member_id == member_of(key)
            ]
            stop_server(dep.servers[key])  # SIGTERM: a clean stop releases its leases
            stopped = time.monotonic()
            # Released on leave, before the process ended: none is left to lapse.
            assert all(x.owner != instance for x in store.members.list_leases())
            assert member_of(key) not in {m.member_id for m in store.members.list_members(LEASE)}
            wait_placed(dep, everyone - {member_of(key)})
            took = time.monotonic() - stopped
            print(f"{member_of(key)} stopped: its units owned by the others {took:.2f} s after")
            dep.restart("sender", key)
            # Rendezvous: it gets back exactly its units (the others release them to it).
            assert wait_settled(dep, everyone) == before
        source.stop()
        report = dep.wait_drained(source)
        print(f"rolling restart of {len(everyone)} members: {report.counts()}")
        report.assert_clean()
        assert report.applied > 0 and not source.errors, source.errors[:5]
    except BaseException:
        print("\n".join(dep.events))
        raise
    finally:
        source.close()
        dep.close()


def proxied(url: str, port: int) -> str:
    """``url`` with its host and port replaced by a loopback proxy's."""
    return make_url(url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def test_member_cut_from_the_database_fences_itself_and_rejoins(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    """A member whose database connections are reset and refused (a FaultProxy cut).

    Its units go to the others within the lease timeout; it stops its own work
    first (self-fencing: it ships nothing after that, so the sinks see nothing
    twice or out of order), and once the database is reachable again it
    rejoins and gets its units back.
    """
    seed = reliability_seed()
    dep = Deployment(
        tmp_path, db_url_factory, sinks=SINKS, clients=CLIENTS, tune=TUNE, source_members=3
    )
    everyone = {member_of(k) for k in dep.source_servers}
    settled = place(UNITS, {m: 1 for m in everyone})
    owned = Counter(o for u, o in settled.items() if u != TRIM_UNIT)
    victim = max(dep.source_servers, key=lambda k: (owned[member_of(k)], k))
    cut_id = member_of(victim)
    assert owned[cut_id] > 0
    db = make_url(dep.raw_urls["a"])
    proxy = FaultProxy(db.host or "127.0.0.1", db.port or 5432).start()
    # The victim's own config: the site's, with its database reached through the proxy.
    config = tmp_path / f"{cut_id}.toml"
    config.write_text(
        dep.configs["a"]
        .read_text()
        .replace(dep.raw_urls["a"], proxied(dep.raw_urls["a"], proxy.port), 1)
    )
    assert config.read_text() != dep.configs["a"].read_text()
    n = dep.source_servers.index(victim) + 1
    metrics = free_port()
    args = ["--member-id", f"a-{n}", "--metrics-port", str(metrics)]
    dep.servers[victim] = LrServer(config, args=args, name=f"a-{n}")

    def shipped() -> float:
        """Entries the victim's sessions had acknowledged (its metrics need no database)."""
        value = metric_sum(metrics, "lr_entries_shipped_total")
        assert value is not None, dep.servers[victim].log()
        return value

    source = SourceApp(
        dep.raw_urls["a"], "a", list(SINKS), clients=CLIENTS, seed=seed, rate=80, max_batch=3
    )
    try:
        dep.start()
        start(dep, source)
        before = wait_settled(dep, everyone)
        assert proxy.connections_total > 0  # the victim really talks through the proxy
        assert wait_for(
            lambda: metric_sum(metrics, "lr_member_units", member=cut_id),
            scaled(10),
            what=f"{cut_id} running its units",
        ) == sum(1 for o in before.values() if o == cut_id)
        fenced_before = dep.servers[victim].full_log().count("stopping all work")
        dep.events.append(f"{time.strftime('%H:%M:%S')} cut {cut_id} from the database")
        proxy.cut()
        cut = time.monotonic()
        after = wait_placed(dep, everyone - {cut_id})
        took = time.monotonic() - cut
        moved = {u for u in UNITS if before[u] != after[u]}
        assert moved == {u for u in UNITS if before[u] == cut_id}  # only its own
        # It stopped its work on its own (its heartbeats failing), before the lease lapsed.
        wait_for(
            lambda: dep.servers[victim].full_log().count("stopping all work") > fenced_before,
            scaled(10),
            what=f"{cut_id} fenced itself",
            detail=dep.servers[victim].log,
        )
        assert dep.servers[victim].proc is not None and dep.servers[victim].proc.poll() is None
        # Its work stopped: it owns no unit by its own count, and ships nothing from then on
        # while the others carry the traffic.
        wait_for(
            lambda: metric_sum(metrics, "lr_member_units", member=cut_id) == 0,
            scaled(10),
            what=f"{cut_id} running no unit",
        )
        fenced_at = shipped()
        assert fenced_at > 0  # it did ship before the cut
        floor = dep.verify(source).applied + 50
        wait_for(lambda: dep.verify(source).applied >= floor, scaled(60), what="traffic going on")
        assert shipped() == fenced_at
        dep.events.append(f"{time.strftime('%H:%M:%S')} heal {cut_id}")
        proxy.restore()
        # It rejoins (alive again) and rendezvous gives it back exactly its units.
        assert wait_settled(dep, everyone) == before
        source.stop()
        report = dep.wait_drained(source)
        print(
            f"seed {seed}: {cut_id} cut from the database: its units owned by the others "
            f"{took:.2f} s after (lease {LEASE} s); rejoined; {report.counts()}"
        )
        report.assert_clean()
        assert report.applied > 0 and not source.errors, source.errors[:5]
        assert took <= scaled(LEASE + 4 * HEARTBEAT + 1.0)
    except BaseException:
        print("\n".join(dep.events))
        raise
    finally:
        source.close()
        dep.close()
        proxy.stop()
