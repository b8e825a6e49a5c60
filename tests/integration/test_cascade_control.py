"""The control plane of a cascade over real gRPC on loopback, on SQLite and PostgreSQL:
reports up, the global watermark down, refusals, ``lr provider switch``, the root's trim.

The seed's set: s1 the root, s2 and s3 below it, s4 below s3. Each node's receiver
serves ``Cascade`` (as ``lr server`` wires it); the nodes' positions are set through
the store (entries received from the origin, delivered by a subscriber), the data
path itself being tested elsewhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session

from lr_client import RoutingQueueListener, RoutingQueueMessage, RoutingQueueSubscriber
from lr_client._proto import replication_pb2 as pb
from lr_client.errors import PermissionDeniedError, ProtocolError
from lr_client.records import ReplicationType, WireEntry
from lr_client.store import SQLAlchemyQueueStore, create_engine, open_store
from lr_server.cascade.control import CascadeReporter, branch_floor, grpc_sender, serve_report
from lr_server.cli import EXIT_FAILED, EXIT_USAGE, cli
from lr_server.cluster.streams import unconfigured_streams
from lr_server.config import SiteConfig, SourceConfig, load_config
from lr_server.receiving.receiver import Receiver
from lr_server.transport.grpc_client import call_cascade
from lr_server.transport.grpc_server import start_grpc_server
from tests.kit.positions import new_slot, positions
from tests.kit.sites import SEED_TREE, CascadeTree, free_port

C = "policy"
TOKEN = "cascade-token"


def node_toml(site: str, url: str, ports: dict[str, int], tree: CascadeTree) -> str:
    """A node's config: its children as destinations; every other node (and ``x``, not a
    node) as a source with its address, so that any node can report to any other."""
    lines = [
        "[site]",
        f'id = "{site}"',
        f'database_url = "{url}"',
        f'listen = "127.0.0.1:{ports[site]}"',
        "[security]",
        'transport = "plaintext"',
        'client_auth = "token"',
        f'token = "{TOKEN}"',
        "[[clients]]",
        f'name = "{C}"',
        "[[clients]]",
        'name = "inventory"',
    ]
    others = [n for n in [*tree.members(), "x"] if n != site]
    lines.append(tree.node_sections(site, C, ports, token=lambda _: TOKEN, sources=others))
    return "\n".join(lines) + "\n"


@dataclass
class Node:
    config: SiteConfig
    path: Path
    store: SQLAlchemyQueueStore
    grpc: Any = None

    def serve(self) -> None:
        receiver = Receiver(
            self.store,
            self.config.id,
            [s.id for s in self.config.sources],
            cascade_reports=partial(serve_report, self.store, self.config),
        )
        self.grpc = start_grpc_server(self.config, receiver)

    def report(self) -> None:
        CascadeReporter(self.store, self.config, grpc_sender(self.config, timeout=5.0)).run_once()

    def child(self, child_id: str) -> tuple[int, int, float, bool]:
        (c,) = [c for c in self.store.cascade.cascade_children(C) if c.child_id == child_id]
        return c.epoch, c.local_watermark, c.reported_at, c.dropped

    def global_watermark(self) -> int:
        node = self.store.cascade.cascade_node(C)
        assert node is not None
        return node.global_watermark


@dataclass
class Set:
    tree: CascadeTree
    nodes: dict[str, Node] = field(default_factory=dict)

    def __getitem__(self, site: str) -> Node:
        return self.nodes[site]


@pytest.fixture
def cascade(tmp_path: Path, db_url_factory: Callable[[str], str]) -> Iterator[Set]:
    tree = SEED_TREE
    ports = {n: free_port() for n in [*tree.members(), "x"]}
    made = Set(tree)
    for site in tree.members():
        url = db_url_factory(site)
        path = tmp_path / f"{site}.toml"
        path.write_text(node_toml(site, url, ports, tree))
        config = load_config(path)
        store = open_store(create_engine(url))
        store.create_schema()
        store.retention.rotation_period = 0.0
        cascade_cfg = config.cascade(C)
        assert cascade_cfg is not None
        # As `lr server` applies the configuration at its start.
        store.cascade.apply_cascade_config(
            C,
            cascade_cfg.root,
            cascade_cfg.role_of(site).value,
            cascade_cfg.provider_of(site),
            cascade_cfg.children_of(site),
        )
        made.nodes[site] = Node(config, path, store)
    yield made
    for node in made.nodes.values():
        if node.grpc is not None:
            node.grpc.stop(grace=0).wait(5.0)
        node.store.engine.dispose()


def originate(store: SQLAlchemyQueueStore, count: int, destinations: Sequence[str]) -> list[int]:
    """The root's application transmits ``count`` entries of C, each in a send-queue slot
    of its own (PostgreSQL trims whole slots); their positions."""
    nums = store.sites.register_sites(list(destinations))
    refs = []
    for i in range(count):
        new_slot(store)
        with store.write() as conn:
            refs += store.send.append_log_entries(
                conn, C, [(b"e%d" % i, [nums[d] for d in destinations])]
            )
    return positions(store, refs)


def receive(store: SQLAlchemyQueueStore, first: int, last: int, previous: int = 0) -> None:
    """The node received origin positions first..last of C from the root s1."""
    entries = [
        WireEntry(p, ReplicationType.LOG_ENTRY_SYNC, b"e%d" % p) for p in range(first, last + 1)
    ]
    store.recv.apply_log_batch("s1", C, entries, previous)


class Applies(RoutingQueueListener):
    def process_log_entries(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True

    def process_full_sync(
        self, session: Session, source_id: str, messages: Sequence[RoutingQueueMessage]
    ) -> bool:
        return True


def deliver(store: SQLAlchemyQueueStore) -> None:
    sub = RoutingQueueSubscriber(store, C, Applies(), retry_initial=0.0)
    try:
        while sub.poll_once():
            pass
    finally:
        sub.close()


def watermark_gauge(kind: str) -> float | None:
    return REGISTRY.get_sample_value("lr_cascade_watermark", {"client": C, "kind": kind})


# -- reports up, the global watermark down ---------------------------------------------------
def test_local_watermarks_go_up_and_the_global_watermark_comes_down(cascade: Set) -> None:
    s1, s2, s3, s4 = (cascade[n] for n in ("s1", "s2", "s3", "s4"))
    for node in (s1, s3):
        node.serve()
    head = originate(s1.store, 10, ["s2", "s3"])[-1]
    receive(s4.store, 1, 4)  # s4 received 4
    receive(s2.store, 1, 7)
    deliver(s2.store)  # s2, a branch (the set's branches), delivered 7
    receive(s3.store, 1, 6)
    deliver(s3.store)  # s3 delivered 6

    before = time.time()
    s4.report()
    assert s3.child("s4")[:2] == (1, 4) and s3.child("s4")[2] >= before
    assert s4.global_watermark() == 0  # s3 knows no global watermark yet

    s3.report()  # s3's local watermark: min(6, s4's 4)
    assert s1.child("s3")[:2] == (1, 4)
    assert s3.global_watermark() == 0  # s2 never reported: it holds everything
    s2.report()  # s2: 7
    assert s1.child("s2")[:2] == (1, 7)
    assert s2.global_watermark() == 4 < head
    s1.report()  # the root computes its own
    assert s1.global_watermark() == 4
    s3.report()
    assert s3.global_watermark() == 4
    s4.report()
    assert s4.global_watermark() == 4
    # s4 moves on: the watermark follows once the reports have gone round.
    receive(s4.store, 5, 6, previous=4)
    s4.report()
    assert watermark_gauge("local") == 6  # s4's own, as its report said
    assert watermark_gauge("global") == 4  # as s3's reply said
    s3.report()
    s1.report()
    assert s1.global_watermark() == 6
    s3.report()
    assert s3.global_watermark() == 6


def test_the_root_trims_only_at_or_below_the_global_watermark(cascade: Set) -> None:
    s1 = cascade["s1"]
    p = originate(s1.store, 6, ["s2", "s3"])
    for dest in ("s2", "s3"):
        s1.store.shipping.set_cursor(dest, C, p[-1])  # both children acknowledged everything
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == p  # watermark 0
    s1.store.cascade_reports.set_global_watermark(C, p[2])
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == p[3:]
    s1.store.cascade_reports.set_global_watermark(C, p[-1])
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == []


def test_entries_naming_every_node_of_the_set_are_trimmed_at_the_global_watermark(
    cascade: Set,
) -> None:
    s1 = cascade["s1"]
    # The application names every node; the root ships to its children only.
    p = originate(s1.store, 6, ["s2", "s3", "s4"])
    for dest in ("s2", "s3"):
        s1.store.shipping.set_cursor(dest, C, p[-1])
    assert unconfigured_streams(s1.config, s1.store.shipping)[0] == []  # s4 is reached through s3
    s1.store.cascade_reports.set_global_watermark(C, p[3])
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == p[4:]
    s1.store.cascade_reports.set_global_watermark(C, p[-1])
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == []


def test_the_root_keeps_what_follows_an_open_full_syncs_base_past_the_global_watermark(
    cascade: Set,
) -> None:
    """A child's full sync resumes its log after its base: the root keeps what follows the
    base even once the global watermark passed it, and only for that child's own stream
    (another client's open full sync to another child holds nothing of this client)."""
    s1 = cascade["s1"]
    (a,) = originate(s1.store, 1, ["s2", "s3"])
    other = s1.store.snapshots.start_snapshot(
        s1.store.snapshots.request_snapshot(None, "s3", "inventory", "test")
    )
    assert other is not None and other.base_position == a
    p = originate(s1.store, 2, ["s2", "s3"])
    sid = s1.store.snapshots.request_snapshot(None, "s2", C, "test")
    started = s1.store.snapshots.start_snapshot(sid)
    assert started is not None and started.base_position == p[-1]
    q = originate(s1.store, 3, ["s2", "s3"])
    for dest in ("s2", "s3"):
        s1.store.shipping.set_cursor(dest, C, q[-1])
    s1.store.cascade_reports.set_global_watermark(C, q[-1])  # every node has everything
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == q
    s1.store.snapshot_entries.finish_snapshot(sid)
    s1.store.snapshots.complete_snapshot(sid)  # done: the global watermark alone counts again
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == []


def test_a_dead_leaf_dropped_by_retention_does_not_pin_the_root(cascade: Set) -> None:
    s1 = cascade["s1"]
    p = originate(s1.store, 6, ["s2", "s3"])
    for dest in ("s2", "s3"):
        s1.store.shipping.set_cursor(dest, C, p[-1])
    long_ago = time.time() - 10 * s1.config.replication.cascade_grace
    s1.store.cascade_reports.record_cascade_report(
        C, "s2", 1, p[0], p[0], reported_at=long_ago
    )  # dead
    s1.store.cascade_reports.record_cascade_report(C, "s3", 1, p[-1], p[-1])
    s1.report()
    assert s1.global_watermark() == p[0]  # not dropped yet: it pins
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == p[1:]
    s1.store.retention.drop_stream("s2", C, "over retention.max_entries")  # retention drops it
    s1.report()
    assert s1.global_watermark() == p[-1]
    assert not s1.store.cascade.cascade_children(C)[0].dropped  # its stream goes on: a full sync
    s1.store.retention.trim()
    assert [e.position for e in s1.store.shipping.read_client_log(C, 0, 100)] == []


def test_a_branch_keeps_what_the_set_still_needs(cascade: Set) -> None:
    s3 = cascade["s3"]
    receive(s3.store, 1, 6)
    deliver(s3.store)
    s3.store.shipping.set_cursor("s4", C, 6)  # s4 acknowledged everything s3 relayed
    s3.store.cascade_reports.record_cascade_report(C, "s4", 1, 6, 6)
    s3.store.cascade_reports.set_global_watermark(C, 2)  # a node elsewhere in the set is at 2
    assert branch_floor(s3.store, s3.config, C) == 2
    s3.store.cascade.trim_relay(C, "s1", branch_floor(s3.store, s3.config, C))
    assert s3.store.cascade.relay_resume_floor(C, "s1") == 2
    assert [e.position for e in s3.store.cascade.read_relay(C, "s1", 2, 100)] == [3, 4, 5, 6]
    s3.store.cascade_reports.record_cascade_report(C, "s4", 1, 4, 6)  # a node below s4 is at 4
    s3.store.cascade_reports.set_global_watermark(C, 6)
    assert branch_floor(s3.store, s3.config, C) == 4
    s3.store.cascade_reports.set_global_watermark(C, 6)
    s3.store.cascade_reports.record_cascade_report(C, "s4", 1, 6, 6)
    s3.store.cascade.trim_relay(C, "s1", branch_floor(s3.store, s3.config, C))
    assert s3.store.cascade.relay_resume_floor(C, "s1") == 6
    assert branch_floor(cascade["s1"].store, cascade["s1"].config, C) is None  # the root


def test_a_branch_with_nothing_below_it_keeps_its_copy_down_to_the_global_watermark(
    cascade: Set,
) -> None:
    s2 = cascade["s2"]  # a branch by the set's branches, no node below it
    receive(s2.store, 1, 6)
    deliver(s2.store)
    assert [e.position for e in s2.store.cascade.read_relay(C, "s1", 0, 100)] == [1, 2, 3, 4, 5, 6]
    s2.store.cascade_reports.set_global_watermark(C, 2)  # a node elsewhere in the set is at 2
    assert branch_floor(s2.store, s2.config, C) == 2
    s2.store.cascade.trim_relay(C, "s1", branch_floor(s2.store, s2.config, C))
    assert s2.store.cascade.relay_resume_floor(C, "s1") == 2
    assert [e.position for e in s2.store.cascade.read_relay(C, "s1", 2, 100)] == [3, 4, 5, 6]
    s2.store.cascade_reports.set_global_watermark(C, 6)  # every node has everything: the copy goes
    s2.store.cascade.trim_relay(C, "s1", branch_floor(s2.store, s2.config, C))
    assert s2.store.cascade.relay_resume_floor(C, "s1") == 6


def test_status_shows_role_provider_children_and_watermarks(cascade: Set) -> None:
    s1, s3, s4 = cascade["s1"], cascade["s3"], cascade["s4"]
    s1.serve()
    s3.serve()
    receive(s4.store, 1, 4)
    receive(s3.store, 1, 6)
    deliver(s3.store)
    s4.report()
    s3.report()
    s3.store.cascade_reports.set_global_watermark(C, 3)
    result = CliRunner().invoke(cli, ["status", "--config", str(s3.path), "--json"])
    assert result.exit_code == 0, result.output
    (got,) = json.loads(result.output)["cascades"]
    (child,) = got.pop("children")
    assert got == {
        "client": C,
        "origin": "s1",
        "role": "branch",
        "provider": "s1",
        "epoch": 1,
        "config_provider": "s1",
        "local_watermark": 4,
        "global_watermark": 3,
    }
    assert 0 <= child.pop("report_age") < 60
    assert child.pop("reported_at") > 0
    assert child == {
        "child_id": "s4",
        "epoch": 1,
        "local_watermark": 4,
        "acked_position": 4,
        "dropped": False,
        "counts": True,
    }
    s3.store.cascade.mark_child_dropped(C, "s4")
    table = CliRunner().invoke(cli, ["status", "--config", str(s3.path)])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert any(
        all(w in line for w in (C, "s1", "branch", "s1 (epoch 1)", " 4 ", " 3 ")) for line in lines
    ), table.output
    assert any("s4 (left)" in line and " ago" in line for line in lines), table.output
    root = CliRunner().invoke(cli, ["status", "--config", str(s1.path), "--json"])
    (top,) = json.loads(root.output)["cascades"]
    assert (top["role"], top["provider"], top["epoch"]) == ("root", "", 0)
    assert {c["child_id"]: c["reported_at"] for c in top["children"]}["s2"] is None


# -- refusals ----------------------------------------------------------------------------------
def _call(cascade: Set, caller: str, to: str, **fields: Any) -> pb.CascadeReply:
    config = cascade[caller].config if caller in cascade.nodes else cascade["s4"].config
    source = cascade[caller].config.source(to) if caller in cascade.nodes else None
    target = source or SourceConfig(to, TOKEN, cascade[to].config.listen)
    report = pb.CascadeReport(
        client_name=C, origin_id="s1", node_id=caller, epoch=1, local_watermark=3
    )
    for key, value in fields.items():
        setattr(report, key, value)
    return call_cascade(caller, target, config.security, report, timeout=5.0)


def test_reports_that_are_not_the_callers_own_or_not_of_the_set_are_refused(
    cascade: Set,
) -> None:
    s3 = cascade["s3"]
    s3.serve()
    before = s3.store.cascade.cascade_children(C)
    with pytest.raises(PermissionDeniedError, match="cannot report as 's2'"):
        _call(cascade, "s4", "s3", node_id="s2")
    with pytest.raises(PermissionDeniedError, match="x is not a node"):
        _call(cascade, "x", "s3", node_id="x")
    with pytest.raises(ProtocolError, match="origin s1 here"):
        _call(cascade, "s4", "s3", origin_id="s2")
    with pytest.raises(ProtocolError, match="not a cascaded client"):
        _call(cascade, "s4", "s3", client_name="inventory")
    assert s3.store.cascade.cascade_children(C) == before
    assert _call(cascade, "s4", "s3", epoch=5).epoch == 5
    with pytest.raises(ProtocolError, match="epoch 4; s3 has it at epoch 5"):
        _call(cascade, "s4", "s3", epoch=4, local_watermark=9)
    assert s3.child("s4")[:2] == (5, 3)


# -- lr provider switch ------------------------------------------------------------------------
def switch(node: Node, *args: str) -> Any:
    return CliRunner().invoke(
        cli, ["provider", "switch", "--config", str(node.path), "--client", C, *args]
    )


@pytest.mark.parametrize("to", ["s1", "s2"])
def test_a_switched_node_is_adopted_by_its_new_provider(cascade: Set, to: str) -> None:
    s3, s4, new = cascade["s3"], cascade["s4"], cascade[to]
    new.serve()
    receive(s4.store, 1, 5)
    result = switch(s4, "--to", to, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out == {
        "client": C,
        "provider": to,
        "previous_provider": "s3",
        "epoch": 2,
        "local_watermark": 5,
        "adopted": True,
        "global_watermark": 0,
        "error": None,
    }
    node = s4.store.cascade.cascade_node(C)
    assert node is not None and (node.provider_id, node.epoch) == (to, 2)
    assert new.child("s4")[:2] + new.child("s4")[3:] == (2, 5, False)
    # From now on the node reports to its new provider, not to the old one.
    old_row = s3.store.cascade.cascade_children(C)
    receive(s4.store, 6, 8, previous=5)
    s4.report()
    assert new.child("s4")[:2] == (2, 8)
    assert s3.store.cascade.cascade_children(C) == old_row


def test_a_switch_to_a_provider_that_does_not_answer_is_recorded_and_says_so(
    cascade: Set,
) -> None:
    s4 = cascade["s4"]  # s1 is not serving
    result = switch(s4, "--to", "s1")
    assert result.exit_code == EXIT_FAILED
    assert "s1 did not answer" in result.output
    node = s4.store.cascade.cascade_node(C)
    assert node is not None and (node.provider_id, node.epoch) == ("s1", 2)
    again = switch(s4, "--to", "s1")
    assert again.exit_code == EXIT_FAILED and "s1 already provides" in again.output


@pytest.mark.parametrize(
    ("site", "args", "fragment"),
    [
        ("s4", ("--to", "s4"), "s4 cannot be its own provider"),
        ("s4", ("--to", "s9"), "'s9' is not a node of the set of policy"),
        ("s3", ("--to", "s4"), "s4 receives policy through s3: switching to it would make a cycle"),
        ("s1", ("--to", "s2"), "s1 is the root of policy: it has no provider"),
        ("s2", ("--to", "s4"), "s4 is a leaf of policy: it keeps no copy to provide from"),
    ],
)
def test_a_bad_switch_is_a_usage_error_and_changes_nothing(
    cascade: Set, site: str, args: tuple[str, ...], fragment: str
) -> None:
    node = cascade[site]
    before = node.store.cascade.cascade_node(C)
    result = CliRunner().invoke(
        cli, ["provider", "switch", "--config", str(node.path), "--client", C, *args]
    )
    assert result.exit_code == EXIT_USAGE
    assert fragment in result.output
    assert node.store.cascade.cascade_node(C) == before


def test_a_switch_of_a_client_that_is_not_cascaded_is_a_usage_error(cascade: Set) -> None:
    s4 = cascade["s4"]
    result = CliRunner().invoke(
        cli,
        ["provider", "switch", "--config", str(s4.path), "--client", "inventory", "--to", "s1"],
    )
    assert result.exit_code == EXIT_USAGE
    assert "'inventory' is not a cascaded client of this site" in result.output
