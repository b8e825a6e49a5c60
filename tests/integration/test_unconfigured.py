"""Streams the site's config does not list: visible, bounded, and owed their data later.

A destination the application registers (or a client a destination is not
given) is shipped by no session. ``lr status`` shows it, the server warns
once and counts it in a metric, its entries are kept under the retention
limits and dropped past them; configured later it gets its backlog, or a
full sync if it was dropped. On both backends.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select

from lr_client import RoutingQueueClient
from lr_client.records import SnapshotStatus
from lr_client.snapshot import SnapshotProviderRunner
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.schema import tables as s
from lr_server.cluster.retention import RetentionPolicy
from lr_server.config import ClientConfig, DestinationConfig, RetentionConfig, SiteConfig
from lr_server.ops.status import collect_status
from tests.integration.test_cli import as_json, ok, write_config
from tests.integration.test_full_sync import running, sink_app
from tests.integration.test_replication import received
from tests.kit import kvapp
from tests.kit.positions import new_slot
from tests.kit.sites import Sites, wait_for

#: How a stopped site's open calls end is not what this module tests.
pytestmark = pytest.mark.stop_calls_at_once


FAST_TRIM = "[retention]\nmax_entries = 40\ntrim_interval = 0.1\nrotation_period = 0.5\n"


def send(
    store: SQLAlchemyQueueStore, client: str, rows: list[tuple[bytes, list[str]]], source: str = "a"
) -> None:
    """Transmit as an application that registers every destination it addresses.

    Each row in a transaction and (PostgreSQL) a slot of its own, so a trim
    retires entry by entry there too.
    """
    sender = RoutingQueueClient(store, source_id=source, client_name=client, backpressure="ignore")
    sender.register_destinations(sorted({d for _, ds in rows for d in ds}))
    for payload, dests in rows:
        new_slot(store)
        with store.engine.begin() as conn:
            sender.transmit_log_entry_message(conn, payload, dests)


def positions(store: SQLAlchemyQueueStore) -> list[int]:
    """Positions still stored in the send queue."""
    e = s.send_log_entries
    with store.read() as conn:
        return [int(r[0]) for r in conn.execute(select(e.c.position).order_by(e.c.position))]


def unconfigured_metric(dest: str, client: str) -> float | None:
    return REGISTRY.get_sample_value(
        "lr_unconfigured_entries", {"destination": dest, "client": client}
    )


class Recorder(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def site_config(store: SQLAlchemyQueueStore, retention: RetentionConfig) -> SiteConfig:
    """Site a: destinations b and c, client policy without a snapshot provider."""
    return SiteConfig(
        id="a",
        database_url=str(store.engine.url),
        destinations=(DestinationConfig("b", "127.0.0.1:1"), DestinationConfig("c", "127.0.0.1:2")),
        clients=(ClientConfig("policy", snapshot="none"),),
        retention=retention,
    )


# -- lr status --------------------------------------------------------------------------
def test_status_shows_streams_the_config_does_not_list(
    tmp_path: Path, db_url: str, store: SQLAlchemyQueueStore
) -> None:
    cfg = write_config(tmp_path, db_url)  # site-b: every client; site-c: policy only
    ok("init-db", "--config", cfg)
    send(store, "policy", [(b"p1", ["site-b", "site-z"]), (b"p2" * 10, ["site-z"])], "site-a")
    send(store, "inventory", [(b"i1", ["site-c"])], "site-a")

    send_streams = {
        (x["destination"], x["client"]): x for x in as_json("status", "--config", cfg)["send"]
    }
    z = send_streams[("site-z", "policy")]
    assert (z["state"], z["configured"]) == ("not configured", False)
    assert (z["lag_entries"], z["lag_bytes"], z["cursor"]) == (2, 2 + 20, 0)
    ci = send_streams[("site-c", "inventory")]
    assert (ci["state"], ci["configured"], ci["lag_entries"]) == ("not configured", False, 1)
    bp = send_streams[("site-b", "policy")]
    assert (bp["state"], bp["configured"], bp["lag_entries"]) == ("log entry sync", True, 1)
    # A registered destination with nothing queued is not a stream.
    assert ("site-z", "inventory") not in send_streams

    text = ok("status", "--config", cfg).stdout
    (z_row,) = [line for line in text.splitlines() if "site-z*" in line]
    assert "policy" in z_row and "not configured" in z_row
    (ci_row,) = [line for line in text.splitlines() if "site-c*" in line]
    assert "inventory" in ci_row and "not configured" in ci_row
    assert "* not in this config file" in text


# -- retention --------------------------------------------------------------------------
def test_an_unconfigured_stream_is_kept_under_the_limits_and_warned_once(
    store: SQLAlchemyQueueStore,
) -> None:
    send(store, "policy", [(b"bz", ["b", "z"])] * 3 + [(b"b", ["b"])])
    store.shipping.set_cursor("b", "policy", 4)  # b has everything
    store.shipping.set_cursor("c", "policy", 4)
    policy = RetentionPolicy(store, site_config(store, RetentionConfig(max_entries=5)))
    handler = Recorder(logging.WARNING)
    logger = logging.getLogger("lr.retention")
    logger.addHandler(handler)  # whether or not "lr" propagates to the root
    try:
        first = policy.run_once()
        second = policy.run_once()
    finally:
        logger.removeHandler(handler)
    for report in (first, second):
        (z,) = [h for h in report.streams if h.destination == "z"]
        assert (z.client_name, z.configured, z.backlog.entries, z.over) == (
            "policy",
            False,
            3,
            False,
        )
        assert report.dropped == []
    warnings = [r.getMessage() for r in handler.records if "z/policy" in r.getMessage()]
    assert len(warnings) == 1 and "does not list" in warnings[0], warnings
    assert unconfigured_metric("z", "policy") == 3

    # Each run reads only what was appended since, and still measures what it found.
    send(store, "policy", [(b"by", ["b", "y"])])
    store.shipping.set_cursor("b", "policy", 5)
    store.shipping.set_cursor("c", "policy", 5)
    third = {(h.destination, h.client_name): h.backlog.entries for h in policy.run_once().streams}
    assert {k: v for k, v in third.items() if k[0] in "yz"} == {
        ("y", "policy"): 1,
        ("z", "policy"): 3,
    }

    # Kept meanwhile: trim removes only what no one needs any more (position 4).
    assert store.retention.trim() == 1
    assert positions(store) == [1, 2, 3, 5]
    assert store.retention.list_drops() == []


@pytest.mark.parametrize(
    ("dest", "client", "rows"),
    [
        ("z", "policy", [(b"bz", ["b", "z"])] * 6),  # a destination the config does not list
        ("b", "inventory", [(b"i", ["b"])] * 6),  # a client the config does not list
    ],
)
def test_an_unconfigured_stream_past_a_limit_is_dropped_then_trimmed(
    store: SQLAlchemyQueueStore, dest: str, client: str, rows: list[tuple[bytes, list[str]]]
) -> None:
    send(store, "policy", [(b"c", ["c"])] * 3)  # c is slow: a third of max_entries
    send(store, client, rows)
    store.shipping.set_cursor("b", "policy", 9)
    # The client has no snapshot provider: a configured stream would never be dropped.
    policy = RetentionPolicy(
        store, site_config(store, RetentionConfig(max_entries=5, soft_fraction=0.5))
    )
    report = policy.run_once()
    assert report.dropped == [(dest, client)]
    (drop,) = store.retention.list_drops()
    assert (drop.destination, drop.client_name, drop.first_dropped_position) == (dest, client, 1)
    assert drop.reason.startswith("not configured; over retention: 6 entries")
    # It takes no part in backpressure: of policy's two destinations only c is slow.
    assert report.backpressure == {"policy": False}
    assert unconfigured_metric(dest, client) == 0

    store.shipping.set_cursor("c", "policy", 3)
    store.retention.trim()
    assert positions(store) == []
    # Entries transmitted for it afterwards are released as they come.
    send(store, client, rows[:2])
    store.shipping.set_cursor("b", "policy", 11)
    assert policy.run_once().dropped == []
    store.retention.trim()
    assert positions(store) == []


def test_trim_keeps_what_a_destination_registered_since_still_needs(db_url: str) -> None:
    server = open_store(db_url)  # the server's store: its site cache predates z
    server.create_schema()
    server.retention.rotation_period = 0.0
    server.sites.register_sites(["b"])
    app = open_store(db_url)
    try:
        send(app, "policy", [(b"bz", ["b", "z"])] * 3 + [(b"b", ["b"])])
        server.shipping.set_cursor("b", "policy", 4)
        assert server.retention.trim() == 1
        assert positions(server) == [1, 2, 3]
        assert app.shipping.backlog("z", "policy").entries == 3
    finally:
        server.engine.dispose()
        app.engine.dispose()


def test_a_site_without_destinations_bounds_them_too(sites: Sites) -> None:
    src = sites.store("a")
    sites.start(
        "a", extra="[retention]\nmax_entries = 5\ntrim_interval = 0.1\nrotation_period = 0.5\n"
    )
    send(src, "policy", [(b"z", ["z"])] * 6)
    wait_for(
        lambda: (
            [(d.destination, d.client_name) for d in src.retention.list_drops()]
            == [("z", "policy")]
        )
    )
    wait_for(lambda: positions(src) == [])


# -- full syncs ---------------------------------------------------------------------------
def snapshot_rows(store: SQLAlchemyQueueStore) -> int:
    """Rows of ``lrq_send_snapsync`` (every partition), end markers included."""
    with store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(s.send_snapsync)).scalar_one())


def ready_snapshot(store: SQLAlchemyQueueStore, dests: list[str], rows: int) -> str:
    """A READY snapshot of ``policy`` that every one of ``dests`` joined (one, shared)."""
    store.sites.register_sites(dests)
    (sid,) = {store.snapshots.request_snapshot(None, d, "policy") for d in dests}
    assert store.snapshots.start_snapshot(sid) is not None
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(
            conn, sid, 0, [b"row-%d" % i for i in range(rows)]
        )
    assert store.snapshot_entries.finish_snapshot(sid) == rows
    return sid


def test_a_destination_removed_from_the_config_leaves_its_shared_snapshot_and_the_rows_go(
    store: SQLAlchemyQueueStore,
) -> None:
    """b and z share a snapshot; z is no longer in the config (b and c are). b completes
    it: z still held it, and its rows stayed. The policy's next run takes z out: the
    snapshot is done, its rows released."""
    sid = ready_snapshot(store, ["b", "z"], 5)
    assert store.snapshots.complete_snapshot(sid, "b")
    assert store.snapshots.get_snapshot(sid).status is SnapshotStatus.READY  # type: ignore[union-attr]
    assert snapshot_rows(store) == 6  # z holds them: nobody will ship them to z

    policy = RetentionPolicy(store, site_config(store, RetentionConfig()))
    report = policy.run_once()
    store.retention.trim()
    assert snapshot_rows(store) == 0
    assert store.snapshots.get_snapshot(sid).status is SnapshotStatus.COMPLETED  # type: ignore[union-attr]
    z = store.snapshots.get_snapshot(sid, "z")
    assert z is not None and z.status is SnapshotStatus.CANCELLED
    assert "not configured" in z.reason
    assert report.left_snapshots == [(sid, "z")]
    assert policy.run_once().left_snapshots == []


def test_an_unconfigured_destination_alone_in_a_snapshot_ends_it_and_others_stay(
    store: SQLAlchemyQueueStore,
) -> None:
    mine = ready_snapshot(store, ["z"], 3)  # only z: it ends with z's share
    theirs = store.snapshots.request_snapshot(None, "c", "policy")  # configured: left alone
    assert theirs != mine
    assert store.snapshots.start_snapshot(theirs) is not None
    with store.write() as conn:
        store.snapshot_entries.write_snapshot_entries(conn, theirs, 0, [b"c-row"])

    report = RetentionPolicy(store, site_config(store, RetentionConfig())).run_once()
    store.retention.trim()
    assert snapshot_rows(store) == 1  # c's, still being written
    assert store.snapshots.get_snapshot(mine).status is SnapshotStatus.CANCELLED  # type: ignore[union-attr]
    assert store.snapshots.get_snapshot(theirs).status is SnapshotStatus.RUNNING  # type: ignore[union-attr]
    assert report.left_snapshots == [(mine, "z")]


# -- configured later -------------------------------------------------------------------
def test_configured_later_it_receives_its_whole_backlog(sites: Sites) -> None:
    src = sites.store("a")
    sites.start("b", sources=["a"])
    sites.start("c", sources=["a"])
    sites.start("a", dests=["b"], extra=FAST_TRIM)
    both = [(b"bc-%d" % i, ["b", "c"]) for i in range(10)]
    only_c = [(b"c-%d" % i, ["c"]) for i in range(3)]
    only_b = [(b"b-%d" % i, ["b"]) for i in range(5)]
    send(src, "policy", both + only_c + only_b)  # positions 1-10, 11-13, 14-18
    b, c = sites.store("b"), sites.store("c")
    wait_for(lambda: received(b, "a") == [p for p, _ in both + only_b])
    # b acknowledged everything and trim removed what only b needed: c's entries stay.
    wait_for(lambda: positions(src) == list(range(1, 14)), timeout=60)
    wait_for(lambda: unconfigured_metric("c", "policy") == 13)
    assert received(c, "a") == [] and src.retention.list_drops() == []

    sites.stop("a")
    sites.start("a", dests=["b", "c"], extra=FAST_TRIM)
    wait_for(lambda: received(c, "a") == [p for p, _ in both + only_c], timeout=60)
    wait_for(lambda: positions(src) == [], timeout=60)
    assert received(b, "a") == [p for p, _ in both + only_b]  # nothing twice


def test_dropped_then_configured_it_gets_a_full_sync(sites: Sites) -> None:
    src = sites.store("a")
    kvapp.meta.create_all(src.engine)
    client = RoutingQueueClient(src, source_id="a", client_name="policy", backpressure="ignore")
    client.register_destinations(["b", "c"])
    sinks = {x: sink_app(sites, x) for x in ("b", "c")}
    sites.start("b", sources=["a"])
    sites.start("c", sources=["a"])
    sites.start("a", dests=["b"], snapshot="app", extra=FAST_TRIM)
    runner = SnapshotProviderRunner(src, "policy", kvapp.provider(src.engine))
    with running(runner, sinks["b"][1], sinks["c"][1]):
        for i in range(60):
            kvapp.write(src.engine, client, {f"k{i % 25}": i}, ["b", "c"])
            if i % 10 == 9:  # b keeps up: only c passes the limit of 40 entries
                wait_for(lambda: kvapp.table(sinks["b"][0].engine) == kvapp.table(src.engine), 60)
        wait_for(lambda: any(d.destination == "c" for d in src.retention.list_drops()), timeout=60)
        (drop,) = src.retention.list_drops()
        assert drop.reason.startswith("not configured; over retention")
        wait_for(lambda: positions(src) == [], timeout=60)  # c's backlog released and trimmed
        assert kvapp.table(sinks["c"][0].engine) == {}

        sites.stop("a")
        sites.start("a", dests=["b", "c"], snapshot="app", extra=FAST_TRIM)
        wait_for(lambda: kvapp.table(sinks["c"][0].engine) == kvapp.table(src.engine), timeout=60)
        for i in range(5):
            kvapp.write(src.engine, client, {f"k{i}": 1000 + i}, ["b", "c"])
        for x in ("b", "c"):
            wait_for(
                lambda x=x: kvapp.table(sinks[x][0].engine) == kvapp.table(src.engine), timeout=60
            )
    assert sinks["c"][2].full_syncs and sinks["c"][2].errors == []
    wait_for(lambda: src.retention.list_drops() == [])


def test_dropped_without_a_provider_it_stops_when_configured(sites: Sites) -> None:
    src = sites.store("a")
    sites.start("b", sources=["a"])
    sites.start("c", sources=["a"])
    retention = "[retention]\nmax_entries = 5\ntrim_interval = 0.1\nrotation_period = 0.5\n"
    sites.start("a", dests=["b"], extra=retention)  # snapshot = "none"
    first = [(b"bc-%d" % i, ["b", "c"]) for i in range(6)]
    send(src, "policy", first)
    wait_for(
        lambda: (
            [(d.destination, d.client_name) for d in src.retention.list_drops()]
            == [("c", "policy")]
        )
    )
    wait_for(lambda: positions(src) == [], timeout=60)  # b has them; c's were released

    sites.stop("a")
    server = sites.start("a", dests=["b", "c"], extra=retention)
    # Its status row written at every report (once a second), changed or not: each
    # report after the commit below is a pump pass of c's session.
    server.sessions["c"].status_refresh = 0.0
    committed = time.time()
    later = [(b"later-%d" % i, ["b", "c"]) for i in range(2)]
    send(src, "policy", later)
    b, c = sites.store("b"), sites.store("c")
    wait_for(lambda: received(b, "a") == [p for p, _ in first + later], timeout=60)

    def c_reported_after(t: float) -> float | None:
        rows = [r for r in src.inspection.list_session_status() if r["destination"] == "c"]
        if rows and rows[0]["connected"] and rows[0]["updated_at"] > t:
            return float(rows[0]["updated_at"])
        return None

    # Two status reports of c's session after the commit: a whole pump pass saw it.
    wait_for(lambda: c_reported_after(committed) is not None, timeout=60)
    seen = c_reported_after(committed)
    assert seen is not None
    wait_for(lambda: c_reported_after(seen) is not None, timeout=60)
    assert received(c, "a") == []  # never the entries after the hole: no silent skip
    assert [(d.destination, d.client_name) for d in src.retention.list_drops()] == [("c", "policy")]
    streams = {(x.destination, x.client): x for x in collect_status(server.config, src).send}
    assert streams[("c", "policy")].state == "stopped"  # until an operator acts
