"""Cascaded replication end to end: a root, branches relaying from their receive queues,
leaves; real gRPC on loopback between in-process sites, on both backends.

Every node's listener records what it applied (``tests.kit.traffic``) and the
reliability verifier checks each of them against what the root committed.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from lr_client._proto import replication_pb2 as pb
from lr_client.errors import NotProviderError, ProtocolError
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore
from lr_server.receiving import receiver as receiving
from lr_server.receiving.receiver import CASCADE_ROWS_TTL, Receiver
from lr_server.sending import wire
from lr_server.sending.streams import SessionState
from tests.kit.sites import CHAIN, SEED_TREE, CascadeTree, Sites
from tests.kit.statements import recorded
from tests.kit.traffic import (
    LOG,
    START,
    SinkApp,
    SourceApp,
    read_applied,
    read_sent,
    read_snapshots,
    relay_snapshot_provider,
)
from tests.kit.verifier import Report, verify
from tests.kit.wait import scaled, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


#: The traffic and the reports of this module's sets: entries at a brisk rate (the counts
#: the tests wait for are what matters, not how long they take to come) and a report
#: every 0.2 s (the interval itself is not what is tested).
RATE = 400.0
REPORTS = "cascade_report_interval = 0.2"


@contextmanager
def running(*loops: object) -> Iterator[threading.Event]:
    """Run ``loop.run(stop)`` of each object in a thread until the block ends."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop.run, args=(stop,), daemon=True) for loop in loops]  # type: ignore[attr-defined]
    for t in threads:
        t.start()
    try:
        yield stop
    finally:
        stop.set()
        for t in threads:
            t.join(scaled(30))


class Cascade:
    """A running set: the root's source application, every other node's sink application."""

    def __init__(
        self, sites: Sites, tree: CascadeTree, *, rate: float = 150.0, **node_options: object
    ) -> None:
        self.sites, self.tree = sites, tree
        self.nodes = [n for n in tree.members() if n != tree.root]
        self.source = SourceApp(
            sites.url(tree.root),
            tree.root,
            self.nodes,
            rate=rate,
            all_destinations=True,  # a cascaded client goes to every node of its set
        )
        self.sinks = {n: SinkApp(sites.url(n)).start() for n in self.nodes}
        self.node_options = node_options
        self._stores: dict[str, SQLAlchemyQueueStore] = {}

    def store(self, node: str) -> SQLAlchemyQueueStore:
        """The node's store, opened once (PostgreSQL connections are few)."""
        if node not in self._stores:
            self._stores[node] = self.sites.store(node)
        return self._stores[node]

    def start(self, node: str, **kw: object) -> None:
        self.sites.start_node(self.tree, node, **{**self.node_options, **kw})

    def report(self, node: str, snapshots_from: str | None = None) -> Report:
        sent = read_sent(self.source.engine, self.tree.root)
        applied = read_applied(self.sinks[node].engine, node)
        snaps = []
        if snapshots_from is not None:
            snaps = read_snapshots(self.store(snapshots_from).engine, self.tree.root)
        return verify(
            sent,
            applied,
            snapshots=snaps,
            rolled_back=self.source.rolled_back,
            destinations=[node],
        )

    def settled(self, node: str, snapshots_from: str | None = None) -> bool:
        r = self.report(node, snapshots_from)
        return r.lost == 0 and r.expected > 0

    def close(self) -> None:
        self.source.close()
        for sink in self.sinks.values():
            sink.close()


@pytest.fixture
def cascades(sites: Sites) -> Iterator[list[Cascade]]:
    made: list[Cascade] = []
    yield made
    for c in made:
        c.close()


def test_the_seed_tree_delivers_every_entry_once_in_order_at_every_node(
    sites: Sites, cascades: list[Cascade]
) -> None:
    """S1 root; S2, S3 below it; S4 below S3: every listener gets every entry once, in
    order, and S4's come with S1's identity though S3 relays them."""
    c = Cascade(sites, SEED_TREE, rate=RATE, replication=REPORTS)
    cascades.append(c)
    for node in ("s4", "s3", "s2", "s1"):
        c.start(node)
    c.source.start()
    wait_for(lambda: c.source.committed >= 300, timeout=scaled(60))
    c.source.stop()
    for node in c.nodes:
        wait_for(lambda node=node: c.settled(node), timeout=scaled(60))
    for node in c.nodes:
        report = c.report(node)
        report.assert_clean()
        assert report.applied == report.expected >= 300
    leaf = read_applied(c.sinks["s4"].engine, "s4")
    assert {a.source for a in leaf} == {"s1"}
    # S3 relays from its receive queue: S1 ships nothing to S4.
    assert "s4" not in sites.running["s1"].server.sessions
    assert c.store("s3").cascade.cascade_node("policy").role == "branch"  # type: ignore[union-attr]


def test_a_leaf_that_missed_entries_gets_a_full_sync_from_its_branch(
    sites: Sites, cascades: list[Cascade]
) -> None:
    """c1 -> c2 -> c3: c2 released entries c3 never had, so c3 needs a full sync; c2
    serves it from its own copy (base: what its subscriber delivered), then relays on."""
    c = Cascade(sites, CHAIN, rate=RATE, replication=REPORTS)
    cascades.append(c)
    c.start("c2", snapshot="app")
    c.start("c1")
    c.source.start()
    wait_for(lambda: c.source.committed >= 150, timeout=scaled(60))
    c.source.stop()
    wait_for(lambda: c.settled("c2"), timeout=scaled(60))
    branch = c.store("c2")
    # c3 has never connected: release what c2 holds for it, as retention would.
    assert branch.cascade.mark_child_dropped("policy", "c3")
    branch.cascade.trim_relay("policy", "c1")
    assert branch.cascade.relay_resume_floor("policy", "c1") > 0
    assert branch.cascade.mark_child_dropped("policy", "c3", dropped=False)
    runner = SnapshotProviderRunner(
        branch, "policy", relay_snapshot_provider(c.sinks["c2"].engine, "c1")
    )
    with running(runner):
        c.start("c3")
        c.source.start()
        wait_for(lambda: c.source.committed >= 300, timeout=scaled(60))
        c.source.stop()
        for node in ("c2", "c3"):
            wait_for(lambda node=node: c.settled(node, "c2"), timeout=scaled(60))
    (snap,) = branch.snapshots.list_snapshots("c3", "policy")
    # Its base: an origin position c2 had delivered (c2's first 150 entries at least).
    assert snap.base_position is not None
    assert 150 <= snap.base_position <= branch.cascade.relay_delivered_position("policy", "c1")
    leaf = c.report("c3", snapshots_from="c2")
    leaf.assert_clean()
    assert sum(r.snapshots_completed for r in leaf.streams.values()) == 1
    applied = read_applied(c.sinks["c3"].engine, "c3")
    assert [a.kind for a in applied].count(START) == 1
    assert {a.source for a in applied} == {"c1"}
    assert c.store("c1").snapshots.list_snapshots() == []  # the root served no full sync
    c.report("c2").assert_clean()


def test_a_full_sync_a_lagging_branch_serves_mid_stream_waits_for_its_application(
    sites: Sites, cascades: list[Cascade]
) -> None:
    """c1 -> c2 -> c3 with c2's application stopped while c2 goes on relaying: a full
    sync of c3 requested at c2 takes as its base the last entry c2 stored, past what c3
    holds, and its provider reads only once c2's application has applied that far, so no
    entry reaches c3's listener twice and nothing is lost."""
    c = Cascade(sites, CHAIN, rate=RATE, replication=REPORTS)
    cascades.append(c)
    c.start("c3")
    c.start("c2", snapshot="app")
    c.start("c1")
    branch = c.store("c2")
    runner = SnapshotProviderRunner(
        branch, "policy", relay_snapshot_provider(c.sinks["c2"].engine, "c1")
    )

    def synced(snapshots: int) -> bool:
        r = c.report("c3", snapshots_from="c2")
        done = sum(s.snapshots_completed for s in r.streams.values())
        return r.lost == 0 and r.expected > 0 and done == snapshots

    with running(runner):  # c3 is new: its first full sync comes from c2 too
        c.source.start()
        wait_for(lambda: c.source.committed >= 50, timeout=scaled(60))
        c.sinks["c2"].stop()  # c2's application stops applying; its server still relays
        delivered = branch.cascade.relay_delivered_position("policy", "c1")
        wait_for(lambda: c.source.committed >= 150, timeout=scaled(60))
        c.source.stop()
        wait_for(lambda: synced(1), timeout=scaled(60))
        logs = [a for a in read_applied(c.sinks["c3"].engine, "c3") if a.kind == LOG]
        held = max(a.position for a in logs)
        assert held > delivered
        sid = branch.snapshots.request_snapshot(None, "c3", "policy", "requested by an operator")
        wait_for(lambda: branch.snapshots.get_snapshot(sid).status is SnapshotStatus.RUNNING)
        assert branch.snapshots.get_snapshot(sid).base_position >= held
        assert not branch.snapshots.snapshot_base_applied(
            sid
        )  # the provider waits for c2's application
        c.sinks["c2"].start()
        wait_for(lambda: synced(2), timeout=scaled(60))
    c.report("c3", snapshots_from="c2").assert_clean()  # in order, nothing lost
    again = Counter(a.position for a in read_applied(c.sinks["c3"].engine, "c3") if a.kind == LOG)
    assert [p for p, n in again.items() if n > 1] == []
    assert held in again


def test_a_restarted_branch_resumes_its_leaf_without_a_full_sync(
    sites: Sites, cascades: list[Cascade]
) -> None:
    c = Cascade(sites, CHAIN, rate=RATE, replication=REPORTS)
    cascades.append(c)
    for node in ("c3", "c2", "c1"):
        c.start(node)
    c.source.start()
    wait_for(lambda: c.source.committed >= 150, timeout=scaled(60))
    sites.stop("c2")
    wait_for(lambda: c.source.committed >= 250, timeout=scaled(60))
    c.start("c2")
    wait_for(lambda: c.source.committed >= 350, timeout=scaled(60))
    c.source.stop()
    for node in ("c2", "c3"):
        wait_for(lambda node=node: c.settled(node), timeout=scaled(60))
        c.report(node).assert_clean()
    assert [a.kind for a in read_applied(c.sinks["c3"].engine, "c3")].count(START) == 0
    assert c.store("c2").snapshots.list_snapshots() == []


def _relayed(source: str, client: str = "policy") -> pb.ReplicationBatch:
    return pb.ReplicationBatch(
        batch_id=1,
        source_id=source,
        client_name=client,
        kind=pb.BATCH_LOG_ENTRY,
        first_position=5,
        last_position=5,
        entries=[pb.RoutingTableEntryMsg(type=pb.LOG_ENTRY_SYNC, opaque_payload=b"x", position=5)],
    )


def test_the_receiver_takes_relayed_batches_from_the_current_provider_only(
    sites: Sites,
) -> None:
    store: SQLAlchemyQueueStore = sites.store("s4")
    store.cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
    receiver = Receiver(store, "s4", ["s1", "s2", "s3"])
    with pytest.raises(
        NotProviderError, match=r"^s2 is not the provider of policy here \(s3 is, epoch 1\)$"
    ):
        receiver.apply("s2", _relayed("s1"))
    with pytest.raises(NotProviderError, match="s1 is not the provider of policy here"):
        receiver.apply("s1", _relayed(""))  # the origin itself, no longer this node's provider
    with pytest.raises(NotProviderError, match="its origin is s1, not s2"):
        receiver.apply("s3", _relayed("s2"))
    with pytest.raises(ProtocolError, match="batch claims source 's1', sender is 's3'"):
        receiver.apply("s3", _relayed("s1", client="other"))  # not cascaded here
    assert store.queues.list_queues() == []  # nothing of the refused batches was stored
    relayed = _relayed("s1")
    relayed.entries[0].origin_time = 1234.5
    ack = receiver.apply("s3", relayed)
    assert (ack.last_position, ack.duplicate) == (5, False)
    # What this node relays on carries the origin's time, unchanged.
    (entry,) = store.cascade.read_relay("policy", "s1", 0, 10)
    assert entry.created_at == 1234.5
    batch = wire.log_batch(1, "s1", "policy", [entry], 0, origin_time=True)
    assert batch.entries[0].origin_time == 1234.5
    assert store.recv.sink_progress("s1", "policy").last_position == 5
    assert store.recv.sink_progress("s3", "policy").last_position == 0
    # Negotiation answers a relayed client from the origin's progress.
    response = receiver.negotiate(
        "s3",
        pb.NegotiateRequest(
            source_id="s3",
            clients=["policy"],
            protocol_version=5,
            relays=[pb.RelayedClient(client_name="policy", origin_id="s1")],
        ),
    )
    (state,) = response.clients
    assert (state.last_position, state.origin_id) == (5, "s1")


def test_a_switched_provider_is_taken_at_once_and_the_root_has_none(sites: Sites) -> None:
    store: SQLAlchemyQueueStore = sites.store("s4")
    store.cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
    receiver = Receiver(store, "s4", ["s1", "s2", "s3"])
    assert not receiver.apply("s3", _relayed("s1")).duplicate  # the rows are read (and kept)
    assert store.cascade_reports.switch_cascade_provider("policy", "s2") == 2
    # Kept rows older than their time to live are read again: the old provider is refused.
    receiver._cascade_read_at -= CASCADE_ROWS_TTL
    with pytest.raises(NotProviderError, match=r"^s3 is not the provider of policy here \(s2 is"):
        receiver.apply("s3", _relayed("s1"))
    assert store.cascade_reports.switch_cascade_provider("policy", "s3") == 3
    # Fresh kept rows name s2: they are read again before s3 is refused, so s3 is taken.
    assert receiver.apply("s3", _relayed("s1")).duplicate
    root: SQLAlchemyQueueStore = sites.store("s1")
    root.cascade.apply_cascade_config("policy", "s1", "root", "")
    with pytest.raises(NotProviderError, match=r"^s2 is not the provider of policy here \(nobody"):
        Receiver(root, "s1", ["s2"]).apply("s2", _relayed("s1"))


def test_the_cascade_rows_are_read_once_per_time_to_live_not_per_batch(
    sites: Sites, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiving, "CASCADE_ROWS_TTL", 3600.0)  # no batch outlives it here
    store: SQLAlchemyQueueStore = sites.store("s4")
    store.cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
    receiver = Receiver(store, "s4", ["s1", "s3"])
    rows_read = re.compile(r"FROM (\S+\.)?lrq_cascade ORDER BY")
    with recorded(store.engine) as statements:
        assert not receiver.apply("s3", _relayed("s1")).duplicate
        assert len([q for q in statements if rows_read.search(q)]) == 1
        statements.clear()
        assert receiver.apply("s3", _relayed("s1")).duplicate
        assert receiver.apply("s3", _relayed("s1")).duplicate
        assert not [q for q in statements if rows_read.search(q)]


def test_an_old_provider_refused_by_its_child_stops_that_stream_and_marks_it_dropped(
    sites: Sites, cascades: list[Cascade]
) -> None:
    c = Cascade(sites, SEED_TREE, rate=RATE, replication=REPORTS)
    cascades.append(c)
    for node in ("s4", "s3", "s2", "s1"):
        c.start(node)
    c.source.start()
    # Traffic keeps flowing: s4 is never caught up at an instant, only receiving.
    wait_for(lambda: c.report("s4").applied >= 100, timeout=scaled(60))
    # The operator moves S4 to S1 (the same as an edited configuration applied at start).
    switched = c.store("s4").cascade.apply_cascade_config("policy", "s1", "leaf", "s1")
    assert (switched.provider_id, switched.epoch) == ("s1", 2)
    branch = c.store("s3")
    wait_for(
        lambda: [ch.dropped for ch in branch.cascade.cascade_children("policy")] == [True],
        timeout=scaled(30),
    )
    server = sites.running["s3"].server
    session = server.sessions["s4"]

    def seen() -> str:
        now = server.sessions.get("s4")
        return (
            f"state {session.state}, clients {sorted(session.clients)}, last error "
            f"{session.last_error!r}; the session to s4 now: "
            f"{'the same' if now is session else now and (now.state, sorted(now.clients))}"
        )

    wait_for(
        lambda: session.state is SessionState.STOPPED,
        timeout=scaled(30),
        what="the session of s3 to s4 stopped",
        detail=seen,
    )
    assert "is not the provider of policy here (s1 is, epoch 2)" in session.last_error
    # The member's units lost and taken again (as a lease that lapsed under load does):
    # no session starts to s4, which takes nothing from s3 now; the stopped one stays.
    held = dict(server.fences)
    server._placed({})
    server._placed(held)
    assert server.sessions["s4"] is session and "s4" not in server._runs
    # Moved back (epoch 3): s3 adopts s4 at its report and ships to it again, from
    # where it stands.
    back = c.store("s4").cascade.apply_cascade_config("policy", "s1", "leaf", "s3")
    assert (back.provider_id, back.epoch) == ("s3", 3)
    wait_for(
        lambda: server.sessions["s4"] is not session and bool(server.sessions["s4"].clients),
        timeout=30,
        what="a session of s3 to s4 again",
        detail=seen,
    )
    c.source.stop()  # what s4 lacks now only s3 can send it
    for node in ("s2", "s4"):
        wait_for(lambda n=node: c.settled(n), timeout=60, what=f"{node} settled")
        c.report(node).assert_clean()
