"""A destination's full-sync requests, from request to completion, on SQLite and PostgreSQL.

:class:`~lr_server.sending.snapshot_requests.SnapshotRequests` on a real store, its
clocks set by the test: refusals, launches, stalled workers, drops, supersession
and the streams it switches between log entries and snapshots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from lr_client.errors import FencedError
from lr_client.records import DropRecord, SnapshotRequest, SnapshotStatus
from lr_client.store import SQLAlchemyQueueStore
from lr_server.config import ClientConfig, ReplicationConfig, RetryConfig, SnapshotProvider
from lr_server.sending import snapshot_requests
from lr_server.sending.request_board import Requests
from lr_server.sending.snapshot_requests import SnapshotRequests
from lr_server.sending.stops import StreamStops
from lr_server.sending.streams import ClientStream, Mode, Notice
from tests.kit import leases
from tests.kit.snapshots import ready_snapshot

DEST = "b"
NO_PROVIDER = 'client policy has no snapshot provider (snapshot = "none"): log entries go on'


class Clock:
    """Wall-clock and monotonic time as the test sets them."""

    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


@dataclass
class Launches:
    calls: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, req: SnapshotRequest, config: ClientConfig) -> None:
        self.calls.append((req.snapshot_id, config.name))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(snapshot_requests, "time", c)
    return c


@pytest.fixture
def launches() -> Launches:
    return Launches()


@pytest.fixture
def requests(
    store: SQLAlchemyQueueStore, clock: Clock, launches: Launches
) -> Iterator[SnapshotRequests]:
    store.sites.register_sites([DEST, "c"])
    log = logging.LoggerAdapter(logging.getLogger("lr.test.requests"), {})
    stops = StreamStops(store, DEST, log)
    stops.notices = True
    yield SnapshotRequests(
        store,
        DEST,
        stops,
        log,
        ReplicationConfig(snapshot_stall_timeout=30.0),
        RetryConfig(max_backoff=7.0),
        launches,
    )


def _messages(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "lr.test.requests"]


def stream(name: str = "policy", provider: SnapshotProvider = SnapshotProvider.APP) -> ClientStream:
    return ClientStream(ClientConfig(name, provider))


def _head(store: SQLAlchemyQueueStore, n: int) -> None:
    """``n`` log entries of policy for b: the head moves to n."""
    nums = store.sites.site_numbers()
    with store.write() as conn:
        store.send.append_log_entries(conn, "policy", [(b"x", [nums[DEST]])] * n)


# -- one request ---------------------------------------------------------------------------
def test_a_request_is_recorded_open_for_its_destination_and_client(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    req = requests.request("policy", "first contact")
    assert req is not None
    assert (req.destination, req.client_name, req.status, req.reason) == (
        DEST,
        "policy",
        SnapshotStatus.REQUESTED,
        "first contact",
    )
    assert store.snapshots.get_snapshot(req.snapshot_id) == req
    assert requests.open_snapshot("policy") == req
    assert requests.open_snapshot("orders") is None
    store.snapshots.request_snapshot(None, "c", "orders", "another destination")
    assert requests.open_snapshot("orders") is None
    assert store.snapshots.start_snapshot(req.snapshot_id) is not None
    running = requests.open_snapshot("policy")
    assert running is not None and running.status is SnapshotStatus.RUNNING
    assert store.snapshots.cancel_snapshot(req.snapshot_id)
    assert requests.open_snapshot("policy") is None


def test_a_request_of_a_client_without_provider_is_cancelled_with_the_reason(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr.test.requests")
    req = requests.request("policy", "asked by an operator")
    assert req is not None
    requests.refuse(req)
    got = store.snapshots.get_snapshot(req.snapshot_id)
    assert got is not None
    assert (got.status, got.reason) == (SnapshotStatus.CANCELLED, NO_PROVIDER)
    assert _messages(caplog) == [
        ("WARNING", f"b/policy: snapshot {req.snapshot_id} cancelled: {NO_PROVIDER}")
    ]
    caplog.clear()
    requests.refuse(req)  # no longer open: nothing to cancel, nothing logged
    assert _messages(caplog) == []
    assert store.snapshots.get_snapshot(req.snapshot_id) == got


def test_refusing_a_shared_request_cancels_it_for_this_destination_only(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, clock: Clock
) -> None:
    sid = store.snapshots.request_snapshot(None, "c", "policy", "c's first contact")
    req = requests.request("policy", "b's first contact")
    assert req is not None and req.snapshot_id == sid  # b joined c's
    assert (req.destination, req.reason) == (DEST, "b's first contact")  # b's view of it
    clock.mono = 1234.0
    requests.refuse(req)
    assert requests.wrote == 1234.0
    mine, theirs = store.snapshots.get_snapshot(sid, DEST), store.snapshots.get_snapshot(sid, "c")
    assert mine is not None and (mine.status, mine.reason) == (
        SnapshotStatus.CANCELLED,
        NO_PROVIDER,
    )
    assert theirs is not None and theirs.status is SnapshotStatus.REQUESTED
    assert requests.open_snapshot("policy") is None


def test_finishing_a_shared_snapshot_completes_it_for_this_destination_under_its_lease(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, clock: Clock
) -> None:
    fences = {"policy": leases.hold(store, "stream/b/policy")}
    requests.stops.fence = fences.__getitem__  # the stream's own lease, by client name
    _head(store, 3)
    store.shipping.set_cursor(DEST, "policy", 1, needs_snapshot=True)
    sid = store.snapshots.request_snapshot(None, "c", "policy", "c's")
    assert store.snapshots.request_snapshot(None, DEST, "policy", "b's") == sid
    req = ready_snapshot(store, sid)
    clock.mono = 1234.0
    requests.finish("policy", req)
    assert requests.wrote == 1234.0  # a check with an older read of requests reads anew
    mine, theirs = store.snapshots.get_snapshot(sid, DEST), store.snapshots.get_snapshot(sid, "c")
    assert mine is not None and mine.status is SnapshotStatus.COMPLETED
    assert theirs is not None and theirs.status is SnapshotStatus.READY
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (3, False)


def test_a_lease_lost_right_after_the_completion_keeps_the_cursor_of_the_new_owner(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = leases.hold(store, "stream/b/policy")
    requests.stops.fence = lambda _client: mine
    _head(store, 3)
    store.shipping.set_cursor(DEST, "policy", 1, needs_snapshot=True)
    req = ready_snapshot(store, store.snapshots.request_snapshot(None, DEST, "policy", "r"))
    complete = store.snapshots.complete_snapshot

    def complete_then_lose_the_lease(*args: object, **kwargs: object) -> bool:
        done = complete(*args, **kwargs)  # type: ignore[arg-type]
        leases.take_over(store, "stream/b/policy")
        return done

    monkeypatch.setattr(store.snapshots, "complete_snapshot", complete_then_lose_the_lease)
    with pytest.raises(FencedError):
        requests.finish("policy", req)
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (1, True)  # the new owner's to move


def test_finishing_a_snapshot_under_a_lost_lease_changes_nothing(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    """Another member took the stream over: the deposed owner's completion is refused."""
    mine = leases.hold(store, "stream/b/policy")
    requests.stops.fence = lambda _client: mine
    _head(store, 3)
    store.shipping.set_cursor(DEST, "policy", 1, needs_snapshot=True)
    store.retention.drop_stream(DEST, "policy", "too far behind")
    req = ready_snapshot(store, store.snapshots.request_snapshot(None, DEST, "policy", "r"))
    leases.take_over(store, "stream/b/policy")
    with pytest.raises(FencedError):
        requests.finish("policy", req)
    got = store.snapshots.get_snapshot(req.snapshot_id, DEST)
    assert got is not None and got.status is SnapshotStatus.READY
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (1, True)
    assert [d.client_name for d in store.retention.list_drops()] == ["policy"]


def test_a_check_given_a_read_older_than_its_own_request_reads_again(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, clock: Clock
) -> None:
    cs = stream()
    clock.mono = 1234.0
    req = requests.request("policy", "asked")
    assert req is not None
    requests.check({"policy": cs}, Requests(began=1234.5))  # began after: taken as it is
    assert (cs.mode, cs.snapshot) == (Mode.LOG, None)
    requests.check({"policy": cs}, Requests(began=1233.5))  # began before: read again
    assert (cs.mode, cs.snapshot) == (Mode.SNAPSHOT, req)


# -- launches -------------------------------------------------------------------------------
def test_a_spark_job_is_launched_once_per_request(
    requests: SnapshotRequests, launches: Launches, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lr.test.requests")
    spark = ClientConfig("policy", SnapshotProvider.SPARK)
    first = requests.request("policy", "r1")
    assert first is not None
    requests.launch(first, spark)
    requests.launch(first, spark)
    second = requests.request("policy", "r2")
    assert second is not None
    requests.launch(second, spark)
    requests.launch(first, spark)
    assert launches.calls == [(first.snapshot_id, "policy"), (second.snapshot_id, "policy")]
    assert _messages(caplog) == [
        ("INFO", f"b/policy: launching snapshot job {first.snapshot_id}"),
        ("INFO", f"b/policy: launching snapshot job {second.snapshot_id}"),
    ]


def test_a_shared_snapshot_gets_one_job_whichever_session_asks_first(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, launches: Launches
) -> None:
    """The sessions of destinations sharing a snapshot each launch it; the server's
    launcher starts one job."""
    once = snapshot_requests.once_per_snapshot(launches)
    sessions = [
        SnapshotRequests(
            store, dest, requests.stops, requests._log, requests.cfg, requests.retry, once
        )
        for dest in ("c", DEST)
    ]
    spark = ClientConfig("policy", SnapshotProvider.SPARK)
    shared = [r.request("policy", "new region") for r in sessions]
    assert shared[0] is not None and shared[1] is not None
    assert shared[0].snapshot_id == shared[1].snapshot_id
    for r, req in zip(reversed(sessions), reversed(shared), strict=True):
        r.launch(req, spark)  # b's session first: c's is not needed for the launch
    assert launches.calls == [(shared[0].snapshot_id, "policy")]


def test_no_job_is_launched_for_an_in_process_provider_or_without_a_launcher(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, launches: Launches
) -> None:
    req = requests.request("policy", "r")
    assert req is not None
    requests.launch(req, ClientConfig("policy", SnapshotProvider.APP))
    assert launches.calls == []
    unlaunched = SnapshotRequests(
        store, DEST, requests.stops, requests._log, requests.cfg, requests.retry, None
    )
    unlaunched.launch(req, ClientConfig("policy", SnapshotProvider.SPARK))  # nothing to call
    requests.launch(req, ClientConfig("policy", SnapshotProvider.SPARK))
    assert launches.calls == [(req.snapshot_id, "policy")]  # APP did not count as launched


# -- completion ------------------------------------------------------------------------------
@pytest.mark.parametrize("entries", [0, 3])
def test_a_finished_snapshot_completes_and_log_entries_resume_after_its_base(
    store: SQLAlchemyQueueStore,
    requests: SnapshotRequests,
    caplog: pytest.LogCaptureFixture,
    entries: int,
) -> None:
    caplog.set_level(logging.INFO, logger="lr.test.requests")
    _head(store, entries)
    store.shipping.set_cursor(DEST, "policy", 1, needs_snapshot=True)
    store.retention.drop_stream(DEST, "policy", "too far behind")
    store.retention.drop_stream("c", "policy", "too far behind as well")
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "dropped")
    req = ready_snapshot(store, sid)
    assert req.base_position == entries
    cs = stream()
    cs.mode, cs.snapshot, cs.sent, cs.snap_sent, cs.snap_done_sent = (
        Mode.SNAPSHOT,
        req,
        1,
        3,
        True,
    )
    requests.done(cs)
    assert (cs.mode, cs.snapshot, cs.sent, cs.snap_sent, cs.snap_done_sent) == (
        Mode.LOG,
        None,
        entries,
        0,
        False,
    )
    got = store.snapshots.get_snapshot(sid)
    assert got is not None and got.status is SnapshotStatus.COMPLETED
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (entries, False)
    assert [(d.destination, d.client_name) for d in store.retention.list_drops()] == [
        ("c", "policy")
    ]
    assert _messages(caplog) == [
        (
            "INFO",
            f"b/policy: full sync {sid} complete (2 entries); log entries resume after {entries}",
        )
    ]


def test_finishing_a_request_without_a_base_resumes_from_the_start(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "r")
    req = ready_snapshot(store, sid)
    store.shipping.set_cursor(DEST, "policy", 5, needs_snapshot=True)
    requests.finish("policy", replace(req, base_position=None))
    cursor = store.shipping.get_cursor(DEST, "policy")
    assert (cursor.position, cursor.needs_snapshot) == (0, False)


# -- stalled workers --------------------------------------------------------------------------
def test_a_running_snapshot_whose_worker_went_silent_is_failed(
    store: SQLAlchemyQueueStore,
    requests: SnapshotRequests,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lr.test.requests")
    store.snapshots.request_snapshot(None, DEST, "orders", "another client's")
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "r")
    running = store.snapshots.start_snapshot(sid)
    assert running is not None
    clock.wall = running.updated_at + 30.0  # silent exactly as long as allowed: kept
    assert requests.reclaim_stalled(running) == running
    assert store.snapshots.get_snapshot(sid) == running
    clock.wall = running.updated_at + 30.5
    assert requests.reclaim_stalled(running) is None  # none of policy's is open now
    failed = store.snapshots.get_snapshot(sid)
    assert failed is not None
    reason = "no heartbeat from its worker for 30s"
    assert (failed.status, failed.reason) == (SnapshotStatus.FAILED, reason)
    assert _messages(caplog) == [("WARNING", f"b/policy: snapshot {sid} failed: {reason}")]


def test_reclaiming_leaves_other_requests_and_returns_what_is_open_now(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, clock: Clock
) -> None:
    assert requests.reclaim_stalled(None) is None
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "r")
    requested = store.snapshots.get_snapshot(sid)
    assert requested is not None
    clock.wall += 3600
    assert requests.reclaim_stalled(requested) == requested  # not running: no worker yet
    ready = ready_snapshot(store, sid)
    assert requests.reclaim_stalled(ready) == ready
    assert store.snapshots.get_snapshot(sid) == ready
    # A stale copy of a RUNNING row whose worker beat meanwhile: the store keeps it.
    other = store.snapshots.request_snapshot(None, DEST, "orders", "r")
    running = store.snapshots.start_snapshot(other)
    assert running is not None
    assert store.snapshots.heartbeat_snapshot(other)
    beaten = store.snapshots.get_snapshot(other)
    assert beaten is not None
    clock.wall = beaten.updated_at + 29
    stale = replace(running, updated_at=beaten.updated_at - 100)
    assert requests.reclaim_stalled(stale) == beaten


# -- the periodic check -------------------------------------------------------------------------
def test_a_log_stream_without_request_or_drop_is_left_alone(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, launches: Launches
) -> None:
    store.retention.drop_stream("c", "policy", "another destination's drop")
    store.snapshots.request_snapshot(None, "c", "policy", "another destination's request")
    cs = stream("policy", SnapshotProvider.SPARK)
    cs.sent = 4
    requests.check({"policy": cs})
    assert (cs.mode, cs.snapshot, cs.sent, cs.notice) == (Mode.LOG, None, 4, None)
    assert launches.calls == []
    assert store.snapshots.list_snapshots(DEST) == []


@pytest.mark.parametrize("provider", [SnapshotProvider.APP, SnapshotProvider.SPARK])
def test_a_new_request_switches_a_log_stream_to_its_snapshot(
    store: SQLAlchemyQueueStore,
    requests: SnapshotRequests,
    launches: Launches,
    provider: SnapshotProvider,
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "asked")
    cs = stream("policy", provider)
    cs.snap_sent, cs.snap_done_sent = 5, True
    requests.check({"policy": cs})
    req = store.snapshots.get_snapshot(sid)
    assert (cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent, cs.notice) == (
        Mode.SNAPSHOT,
        req,
        0,
        False,
        None,
    )
    launched = [(sid, "policy")] if provider is SnapshotProvider.SPARK else []
    assert launches.calls == launched
    requests.check({"policy": cs})  # still open and the same: nothing changes
    assert (cs.mode, cs.snapshot, cs.snap_sent) == (Mode.SNAPSHOT, req, 0)
    assert launches.calls == launched


def test_a_dropped_stream_with_a_provider_asks_for_a_full_sync_with_a_notice_first(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, launches: Launches
) -> None:
    _head(store, 3)
    store.shipping.set_cursor(DEST, "policy", 2)
    drop = store.retention.drop_stream(DEST, "policy", "too far behind")
    assert isinstance(drop, DropRecord)
    cs = stream("policy", SnapshotProvider.SPARK)
    requests.check({"policy": cs})
    (req,) = store.snapshots.list_snapshots(DEST, "policy")
    assert (req.status, req.reason) == (SnapshotStatus.REQUESTED, "dropped for falling behind")
    assert (cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent) == (
        Mode.SNAPSHOT,
        req,
        0,
        False,
    )
    assert cs.notice == Notice(f"d{int(drop.dropped_at * 1e6)}", 3, "too far behind")
    assert launches.calls == [(req.snapshot_id, "policy")]


def test_a_dropped_stream_with_an_open_request_keeps_it(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    drop = store.retention.drop_stream(DEST, "policy", "too far behind")
    assert drop is not None
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "asked before")
    cs = stream()
    requests.check({"policy": cs})
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(DEST, "policy")] == [sid]
    assert cs.snapshot == store.snapshots.get_snapshot(sid) and cs.mode is Mode.SNAPSHOT
    assert cs.notice == Notice(f"d{int(drop.dropped_at * 1e6)}", 1, "too far behind")


def test_a_dropped_stream_without_provider_stops_before_the_hole(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    _head(store, 6)
    store.shipping.set_cursor(DEST, "policy", 4)
    store.retention.drop_stream(DEST, "policy", "too far behind")
    cs = stream("policy", SnapshotProvider.NONE)
    requests.check({"policy": cs})
    assert (cs.mode, cs.snapshot, cs.stop_reason) == (
        Mode.STOPPED,
        None,
        "policy: dropped (too far behind)",
    )
    stop = store.retention.get_stream_stop(DEST, "policy")
    assert stop is not None
    assert (stop.reason, stop.resume_after, stop.accepted_at) == (
        "dropped (too far behind)",
        4,
        None,
    )
    assert store.snapshots.list_snapshots(DEST) == []


def test_an_open_request_of_a_client_without_provider_is_refused_and_logs_go_on(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "asked")
    cs = stream("policy", SnapshotProvider.NONE)
    cs.sent = 7
    requests.check({"policy": cs})
    got = store.snapshots.get_snapshot(sid)
    assert got is not None and (got.status, got.reason) == (SnapshotStatus.CANCELLED, NO_PROVIDER)
    assert (cs.mode, cs.snapshot, cs.sent) == (Mode.LOG, None, 7)


def test_a_stopped_stream_resumes_once_its_loss_is_accepted(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    cs = stream("policy", SnapshotProvider.NONE)
    requests.stops.stop(cs, "needs a full sync", 4)
    requests.check({"policy": cs})
    assert cs.mode is Mode.STOPPED  # not accepted yet
    stop = store.retention.accept_stream_loss(DEST, "policy")
    assert stop is not None and stop.accepted_at is not None
    requests.check({"policy": cs})
    assert (cs.mode, cs.sent, cs.stop_reason) == (Mode.LOG, 4, "")
    assert cs.notice == Notice(
        f"a{int(stop.accepted_at * 1e6)}", 5, "loss accepted by an operator: needs a full sync"
    )
    assert store.snapshots.list_snapshots(DEST) == []


def test_a_stopped_stream_already_resumed_stays_as_it_is(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    cs = stream("policy", SnapshotProvider.NONE)
    requests.stops.stop(cs, "needs a full sync", 4)
    store.retention.accept_stream_loss(DEST, "policy")
    store.retention.mark_stream_resumed(DEST, "policy")
    requests.check({"policy": cs})
    assert (cs.mode, cs.notice) == (Mode.STOPPED, None)


def test_a_snapshot_stream_follows_its_request_and_a_newer_one_supersedes_it(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, launches: Launches
) -> None:
    first = store.snapshots.request_snapshot(None, DEST, "policy", "r1")
    cs = stream("policy", SnapshotProvider.SPARK)
    requests.check({"policy": cs})
    ready = ready_snapshot(store, first)
    cs.snap_sent = 2
    requests.check({"policy": cs})  # the same request, now READY: its row is refreshed
    assert (cs.mode, cs.snapshot, cs.snap_sent) == (Mode.SNAPSHOT, ready, 2)
    second = store.snapshots.request_snapshot(None, DEST, "policy", "r2")
    cs.snap_done_sent = True
    requests.check({"policy": cs})
    assert (cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent) == (
        Mode.SNAPSHOT,
        store.snapshots.get_snapshot(second),
        0,
        False,
    )
    assert launches.calls == [(first, "policy"), (second, "policy")]


def test_a_snapshot_stream_whose_end_is_in_flight_waits_for_its_ack(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "r")
    cs = stream()
    requests.check({"policy": cs})
    req = ready_snapshot(store, sid)
    cs.snapshot, cs.snap_sent, cs.snap_done_sent = req, 3, True
    assert store.snapshots.complete_snapshot(sid)
    requests.check({"policy": cs})
    assert (cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent) == (
        Mode.SNAPSHOT,
        req,
        3,
        True,
    )
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(DEST)] == [sid]


def test_a_snapshot_that_did_not_complete_is_asked_for_again_not_too_often(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, clock: Clock, launches: Launches
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "r")
    cs = stream("policy", SnapshotProvider.SPARK)
    requests.check({"policy": cs})
    assert store.snapshots.cancel_snapshot(sid, "by an operator")
    cs.snap_sent = 2
    clock.mono = 2000.0
    requests.check({"policy": cs})
    (again, _) = store.snapshots.list_snapshots(DEST, "policy")
    assert (again.status, again.reason) == (
        SnapshotStatus.REQUESTED,
        "previous snapshot did not complete",
    )
    assert (cs.mode, cs.snapshot, cs.snap_sent, cs.retry_at) == (Mode.SNAPSHOT, again, 0, 2007.0)
    assert launches.calls == [(sid, "policy"), (again.snapshot_id, "policy")]
    assert store.snapshots.cancel_snapshot(again.snapshot_id, "by an operator")
    clock.mono = 2006.5
    requests.check({"policy": cs})
    assert len(store.snapshots.list_snapshots(DEST, "policy")) == 2  # not before retry_at
    assert cs.snapshot == again and cs.retry_at == 2007.0
    clock.mono = 2007.0
    requests.check({"policy": cs})
    third = store.snapshots.list_snapshots(DEST, "policy")[0]
    assert third.snapshot_id not in (sid, again.snapshot_id)
    assert third.status is SnapshotStatus.REQUESTED
    assert (cs.snapshot, cs.retry_at) == (third, 2014.0)


@pytest.mark.parametrize("provider", [SnapshotProvider.APP, SnapshotProvider.SPARK])
def test_a_snapshot_whose_base_is_below_what_the_stream_sent_is_asked_for_again(
    store: SQLAlchemyQueueStore,
    requests: SnapshotRequests,
    clock: Clock,
    launches: Launches,
    caplog: pytest.LogCaptureFixture,
    provider: SnapshotProvider,
) -> None:
    """A relaying branch's snapshot based below entries it already forwarded: shipped,
    it would bring them to the listener again; a new one is asked for, not too often."""
    caplog.set_level(logging.INFO, logger="lr.test.requests")
    _head(store, 3)
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "first contact")
    old = ready_snapshot(store, sid)
    assert old.base_position == 3
    cs = stream("policy", provider)
    cs.mode, cs.snapshot, cs.sent, cs.snap_sent, cs.snap_done_sent = (
        Mode.SNAPSHOT,
        old,
        5,
        2,
        True,
    )
    clock.mono = 2000.0
    requests.rebase(cs)
    reason = f"the stream holds entries up to 5, past base 3 of full sync {sid}"
    new = requests.open_snapshot("policy")
    assert new is not None and new.snapshot_id != sid
    assert (new.status, new.reason) == (SnapshotStatus.REQUESTED, reason)
    assert (cs.mode, cs.snapshot, cs.sent, cs.snap_sent, cs.snap_done_sent, cs.retry_at) == (
        Mode.SNAPSHOT,
        new,
        5,
        0,
        False,
        2007.0,
    )
    gone = store.snapshots.get_snapshot(sid, DEST)
    assert gone is not None and gone.status is SnapshotStatus.CANCELLED
    spark = provider is SnapshotProvider.SPARK
    assert launches.calls == ([(new.snapshot_id, "policy")] if spark else [])
    asked = ("INFO", f"b/policy: full sync asked again: {reason}")
    launched = ("INFO", f"b/policy: launching snapshot job {new.snapshot_id}")
    assert _messages(caplog) == ([asked, launched] if spark else [asked])
    # Its base is read when it starts, as low again: asked again at most every max_backoff.
    again = ready_snapshot(store, new.snapshot_id)
    cs.snapshot = again
    clock.mono = 2006.5
    requests.rebase(cs)
    assert cs.snapshot == again and cs.retry_at == 2007.0
    assert requests.open_snapshot("policy") == again
    clock.mono = 2007.0
    requests.rebase(cs)
    third = requests.open_snapshot("policy")
    assert third is not None and third.snapshot_id not in (sid, new.snapshot_id)
    assert (
        third.reason
        == f"the stream holds entries up to 5, past base 3 of full sync {new.snapshot_id}"
    )
    assert (cs.snapshot, cs.retry_at) == (third, 2014.0)
    assert len(_messages(caplog)) == (4 if spark else 2)


def test_a_snapshot_asked_again_that_joins_a_running_one_launches_nothing(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, launches: Launches
) -> None:
    _head(store, 3)
    old = ready_snapshot(store, store.snapshots.request_snapshot(None, DEST, "policy", "r"))
    _head(store, 3)
    store.shipping.set_cursor(DEST, "policy", 5)
    theirs = store.snapshots.request_snapshot(None, "c", "policy", "c's")
    assert store.snapshots.start_snapshot(theirs) is not None  # its base: 6
    cs = stream("policy", SnapshotProvider.SPARK)
    cs.mode, cs.snapshot, cs.sent = Mode.SNAPSHOT, old, 5
    requests.rebase(cs)
    assert cs.snapshot is not None and cs.snapshot.snapshot_id == theirs
    assert cs.snapshot.status is SnapshotStatus.RUNNING
    assert launches.calls == []  # its worker runs already


def test_a_snapshot_stream_without_its_request_row_takes_the_open_one(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "policy", "r")
    cs = stream()
    cs.mode, cs.snap_sent, cs.snap_done_sent = Mode.SNAPSHOT, 4, False
    requests.check({"policy": cs})
    assert (cs.snapshot, cs.snap_sent) == (store.snapshots.get_snapshot(sid), 0)
    assert [r.snapshot_id for r in store.snapshots.list_snapshots(DEST)] == [sid]


def test_each_stream_is_checked_against_its_own_requests_and_drops(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests
) -> None:
    sid = store.snapshots.request_snapshot(None, DEST, "orders", "asked")
    store.retention.drop_stream(DEST, "audit", "too far behind")
    streams = {n: stream(n) for n in ("policy", "orders", "audit")}
    requests.check(streams)
    assert streams["policy"].mode is Mode.LOG
    assert streams["orders"].snapshot == store.snapshots.get_snapshot(sid)
    (audit,) = store.snapshots.list_snapshots(DEST, "audit")
    assert streams["audit"].snapshot == audit
    assert sorted(r.client_name for r in store.snapshots.list_snapshots(DEST)) == [
        "audit",
        "orders",
    ]


def test_a_stream_left_as_it_is_does_not_end_the_check_of_the_streams_after_it(
    store: SQLAlchemyQueueStore, requests: SnapshotRequests, clock: Clock
) -> None:
    """Stopped, stopping, waiting for an end's ack, waiting to ask again: the last still moves."""
    stopped = stream("stopped", SnapshotProvider.NONE)
    requests.stops.stop(stopped, "needs a full sync", 0)
    store.retention.drop_stream(DEST, "stopping", "too far behind")
    ending = stream("ending")
    ending_sid = store.snapshots.request_snapshot(None, DEST, "ending", "r")
    ending.mode, ending.snapshot = Mode.SNAPSHOT, store.snapshots.get_snapshot(ending_sid)
    ending.snap_done_sent = True
    assert store.snapshots.cancel_snapshot(ending_sid)
    waiting = stream("waiting")
    waiting.mode, waiting.retry_at = Mode.SNAPSHOT, clock.mono + 1
    last_sid = store.snapshots.request_snapshot(None, DEST, "last", "asked")
    streams = {
        "stopped": stopped,
        "stopping": stream("stopping", SnapshotProvider.NONE),
        "ending": ending,
        "waiting": waiting,
        "last": stream("last"),
    }
    requests.check(streams)
    assert [cs.mode for cs in streams.values()] == [
        Mode.STOPPED,
        Mode.STOPPED,
        Mode.SNAPSHOT,
        Mode.SNAPSHOT,
        Mode.SNAPSHOT,
    ]
    assert (waiting.snapshot, ending.snap_done_sent) == (None, True)
    assert streams["last"].snapshot == store.snapshots.get_snapshot(last_sid)
