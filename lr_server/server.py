"""An ``lr`` server: one member of its site, with the sender sessions of the units it
owns, the sink receiver, trim (when it owns the trim unit) and metrics.

Several servers may run a site on one database: each unit of work (a sender
stream, the trim job) is run by the member that owns its lease
(:mod:`lr_server.cluster.membership`); every server receives.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from math import inf
from typing import Any

from lr_client import tracing
from lr_client._proto import replication_pb2 as pb
from lr_client.cascade_roles import CascadeRole
from lr_client.records import CascadeChild, CascadeNode, Fence, SnapshotRequest
from lr_client.store import QueueStore, open_store
from lr_client.store.watches import Watch
from lr_server.cascade.control import CascadeReporter, branch_floor, grpc_sender, serve_report
from lr_server.cluster.membership import Membership, default_member_id
from lr_server.cluster.placement import TRIM_UNIT, stream_unit
from lr_server.cluster.upkeep import Upkeep
from lr_server.config import ClientConfig, SiteConfig
from lr_server.ops.logs import configure_logging
from lr_server.ops.memory import map_large_blocks
from lr_server.ops.metrics_http import MetricsEndpoint, serve_site_metrics
from lr_server.ops.readiness import problems
from lr_server.ops.startup import prepare_database, until_reachable
from lr_server.protocol import codecs
from lr_server.receiving.limits import ReceiveLimits
from lr_server.receiving.receiver import Receiver
from lr_server.sending.arrivals import Arrivals
from lr_server.sending.fanout import LogFanout
from lr_server.sending.request_board import RequestBoard
from lr_server.sending.send_probe import STEADY_POLL_MAX, SendProbe
from lr_server.sending.session import SenderSession
from lr_server.sending.snapshot_requests import once_per_snapshot, spark_launcher
from lr_server.transport import compression
from lr_server.transport.base import Transport
from lr_server.transport.dialing import grpc_connector

log = logging.getLogger("lr.server")


class SiteServer:
    """Everything one site runs; :meth:`start` returns once it is serving."""

    def __init__(
        self,
        config: SiteConfig,
        store: QueueStore | None = None,
        transport_factory: Callable[[str], Transport] | None = None,
        member_id: str | None = None,
    ) -> None:
        self.config = config
        self.member_id = member_id or default_member_id(config)
        self.store = store or open_store(config.database_url)
        self.store.recv.notify_arrivals = config.receiver.notify_subscribers
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._grpc: Any = None
        self._transport_factory = transport_factory
        self.sessions: dict[str, SenderSession] = {}
        self.children: list[subprocess.Popen[bytes]] = []
        self.reader: LogFanout | None = None
        #: Rung by the receiver: the sessions relaying a client read what it stored at once.
        self.arrivals = Arrivals()
        #: Wakes the sender sessions when entries may have come (None: they poll).
        self.send_watch: Watch | None = None
        self.membership: Membership | None = None
        self.upkeep = Upkeep(
            self.store, config, lambda: self.fences.get(TRIM_UNIT), self._after_trim
        )
        #: The units this member owns now, and each destination's running session.
        self.fences: dict[str, Fence] = {}
        self._runs: dict[str, tuple[threading.Event, threading.Thread]] = {}
        self._session_fences: dict[str, dict[str, Fence]] = {}
        self._launcher: Callable[[SnapshotRequest, ClientConfig], None] | None = None
        self._placing = threading.Lock()
        self.metrics_endpoint: MetricsEndpoint | None = None
        #: The relay floor's extra bound per cascaded client (the set's global
        #: watermark), or None: none (see :meth:`trim_relays`).
        self.relay_extra_floor: Callable[[str], int | None] = lambda client: None

    def start(self, interrupt: threading.Event | None = None) -> None:
        """Start serving; the database steps are retried while it cannot be reached,
        until ``interrupt`` (or :meth:`stop`) ends the wait."""
        cfg = self.config
        halt = interrupt or self.stop_event
        map_large_blocks()
        until_reachable(lambda: prepare_database(self.store, cfg), "preparing the database", halt)
        if cfg.cascades:
            self.relay_extra_floor = partial(branch_floor, self.store, cfg)
        self.metrics_endpoint = serve_site_metrics(cfg, self.store, partial(problems, self))
        if cfg.listen:
            from lr_server.transport.grpc_server import start_grpc_server

            receiver = Receiver(
                self.store,
                cfg.id,
                [s.id for s in cfg.sources],
                max_message_bytes=cfg.replication.max_message_bytes,
                limits=ReceiveLimits.from_config(self.store.heads, cfg),
                cascade_reports=self.serve_cascade if cfg.cascades else None,
                on_stored=self.arrivals.ring,
                on_received=self.arrivals.offer,
            )
            self._grpc = start_grpc_server(cfg, receiver)
            log.info("receiver listening on %s", cfg.listen)
        self._launcher = once_per_snapshot(spark_launcher(cfg, self.children))
        rep = cfg.replication
        self.reader = (
            LogFanout(self.store.shipping, rep.shared_reader_entries, rep.shared_reader_bytes)
            if rep.shared_reader and len(cfg.destinations) > 1
            else None
        )
        self.board = RequestBoard(self.store)  # the sessions' reads of requests, shared
        if cfg.destinations:
            self.send_watch = self.store.shipping.watch_sends(self.wake_sessions)
            probe = SendProbe(self.store.send.head_position, self.head_moved, self.sweep_sessions)
            self._spawn("lr-send-probe", probe.run)
        units = [stream_unit(d.id, c) for d in cfg.destinations for c in cfg.clients_for(d)]
        members = cfg.members
        self.membership = Membership(
            self.store.members,
            self.member_id,
            [*units, TRIM_UNIT],
            self._placed,
            address=members.address or cfg.listen,
            weight=members.weight,
            lease_timeout=members.lease_timeout,
            heartbeat_interval=members.heartbeat_interval,
        )
        # The units that are free are taken, their work started.
        until_reachable(self.membership.join, "joining the site's members", halt)
        self._spawn("lr-members", self.membership.run)
        self._spawn("lr-heartbeat", self.membership.beat)
        self._spawn("lr-trim", self.upkeep.run)
        if cfg.cascades:
            self._spawn("lr-cascade", CascadeReporter(self.store, cfg, grpc_sender(cfg)).run)

    def wake_sessions(self) -> None:
        """Entries may have come: every sender session reads at once (the upkeep soon)."""
        for session in list(self.sessions.values()):
            session.wake()
        self.upkeep.wake()

    def head_moved(self) -> None:
        """The probe read a new head: every session reads now, at its back-off (its read
        gives positions to all that committed; a session that finds entries polls fast
        again), and the upkeep soon. Transmits that come next are announced by the watch."""
        self.sweep_sessions()
        self.upkeep.wake()

    def sweep_sessions(self) -> None:
        """Every sender session takes its safety poll now (:meth:`SenderSession.sweep`)."""
        for session in list(self.sessions.values()):
            session.sweep()

    def cascade_for(self, dest_id: str) -> dict[str, CascadeNode]:
        """This node's rows of the cascaded clients ``dest_id`` is a child of here
        (configured, or adopted at run time), less those it left (dropped)."""
        out = {}
        for node in self.store.cascade.list_cascade_nodes():
            if node.role == CascadeRole.LEAF:
                continue
            children = {
                ch.child_id: ch for ch in self.store.cascade.cascade_children(node.client_name)
            }
            child = children.get(dest_id)
            if child is not None and not child.dropped:
                out[node.client_name] = node
        return out

    def serve_cascade(self, caller: str, report: pb.CascadeReport) -> pb.CascadeReply:
        """Serve a child's ``Cascade`` report; a node adopted by it (new here, dropped
        before, or of an older epoch) gets its session restarted, so that it ships the
        client to it from where it stands."""
        before = self._child(report.client_name, caller)
        reply = serve_report(self.store, self.config, caller, report)
        after = self._child(report.client_name, caller)
        adopted = after is not None and not after.dropped
        if adopted and (before is None or before.dropped or before.epoch < after.epoch):  # type: ignore[union-attr]
            log.info("cascade %s: %s adopted (epoch %d)", report.client_name, caller, reply.epoch)
            threading.Thread(
                target=self._restart_session, args=(caller,), name=f"lr-adopt-{caller}", daemon=True
            ).start()
        return reply

    def _child(self, client: str, child_id: str) -> CascadeChild | None:
        return next(
            (c for c in self.store.cascade.cascade_children(client) if c.child_id == child_id), None
        )

    def _restart_session(self, dest_id: str) -> None:
        """Restart the running session to ``dest_id`` (its cascaded clients are read at its
        start); none runs (not a destination here, or its units held elsewhere): nothing."""
        with self._placing:
            fences = self._session_fences.get(dest_id)
            if fences is None or self.stop_event.is_set():
                if all(d.id != dest_id for d in self.config.destinations):
                    log.warning("%s reported as a child, but is not in [[destinations]]", dest_id)
                return
            self._stop_session(dest_id)
            self._start_session(dest_id, fences)

    def trim_relays(self) -> int:
        """Release what every node below has of the clients this node relays."""
        done = 0
        for node in self.store.cascade.list_cascade_nodes():
            if node.role == CascadeRole.BRANCH:
                extra = self.relay_extra_floor(node.client_name)
                done += self.store.cascade.trim_relay(node.client_name, node.origin_id, extra)
        return done

    # -- the units this member owns ----------------------------------------------------------
    def _placed(self, fences: Mapping[str, Fence]) -> None:
        """Run the work of the units held now: a session per destination, for its clients
        owned; a session whose clients or leases changed is stopped (and restarted)."""
        with self._placing:
            self.fences = dict(fences)
            self.upkeep.wake()  # the trim unit may have come
            for dest in self.config.destinations:
                mine = {
                    c: fences[stream_unit(dest.id, c)]
                    for c in self.config.clients_for(dest)
                    if stream_unit(dest.id, c) in fences
                }
                if mine == self._session_fences.get(dest.id, {}):
                    continue
                self._stop_session(dest.id)
                if mine and not self.stop_event.is_set():
                    self._start_session(dest.id, mine)

    def _start_session(self, dest_id: str, fences: dict[str, Fence]) -> None:
        cfg = self.config
        # Read again while the database is away: a session stopped to restart must start.
        what = f"reading the cascades of the session to {dest_id}"
        cascade = until_reachable(partial(self.cascade_for, dest_id), what, self.stop_event, inf)
        # A cascaded client goes down its tree only: to a node that is a child here.
        clients = [
            c
            for c in cfg.clients
            if c.name in fences and (cfg.cascade(c.name) is None or c.name in cascade)
        ]
        self._session_fences[dest_id] = fences  # an adoption restarts it from them
        if not clients:
            # Its every client is a cascaded one it left (it refused this node as its
            # provider): no session, and the one that stopped stays in ``sessions``,
            # its last error telling why.
            log.info("no session to %s: it takes no client from this node", dest_id)
            return
        membership = self.membership
        session = SenderSession(
            self.store,
            cfg.id,
            dest_id,
            clients,
            self._factory(dest_id),
            cfg.replication,
            cfg.retry,
            self._launcher,
            self.reader,
            fences=fences,
            lease_valid=membership.valid if membership is not None else (lambda: True),
            cascade=cascade,
            arrivals=self.arrivals,
            board=self.board,
        )
        session.acks.stop_check = None  # its stop wakes it (_signal_stop)
        if self.send_watch is not None:  # woken by it, swept by the probe under it
            session.steady_poll_max = STEADY_POLL_MAX
        stop = threading.Event()
        thread = threading.Thread(
            target=session.run, args=(stop,), name=f"lr-session-{dest_id}", daemon=True
        )
        self.sessions[dest_id] = session
        self._runs[dest_id] = (stop, thread)
        thread.start()

    def _stop_session(self, dest_id: str, grace: float = 10.0) -> None:
        run = self._runs.pop(dest_id, None)
        self._session_fences.pop(dest_id, None)
        if run is None:
            return
        stop, thread = run
        self._signal_stop(dest_id, stop)
        thread.join(timeout=grace)

    def _signal_stop(self, dest_id: str, stop: threading.Event) -> None:
        """Tell a session to stop, ending its wait at once."""
        stop.set()
        session = self.sessions.get(dest_id)
        if session is not None:
            session.wake()

    def _factory(self, dest_id: str) -> Callable[[], Transport]:
        """New transports to ``dest_id``, compressing as its ``compression`` says."""
        dest = next((d for d in self.config.destinations if d.id == dest_id), None)
        codec = codecs.NONE if dest is None else dest.compression
        if self._transport_factory is not None:
            factory = self._transport_factory
            return compression.compressing(lambda: factory(dest_id), codec)
        assert dest is not None, f"{dest_id} is not a configured destination"
        return compression.compressing(grpc_connector(self.config, dest), codec)

    def _spawn(self, name: str, target: Callable[[threading.Event], None]) -> None:
        t = threading.Thread(target=target, args=(self.stop_event,), name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _after_trim(self) -> None:
        """What each round of the upkeep does after retention and trim."""
        self._reap()
        self.trim_relays()

    def _reap(self) -> None:
        """Collect finished snapshot jobs (their outcome is in the snapshot request)."""
        for proc in list(self.children):
            code = proc.poll()
            if code is not None:
                self.children.remove(proc)
                log.info("snapshot job exited", extra={"pid": proc.pid, "code": code})

    def stop(self, grace: float = 10.0, call_grace: float = 2.0) -> None:
        """Stop: sessions and threads are joined for up to ``grace`` s each; the
        receiver's open calls get ``call_grace`` s to end before they are cancelled
        (a sender's stream never ends by itself), and their handlers are drained."""
        self.stop_event.set()
        self.upkeep.wake()
        watch, self.send_watch = self.send_watch, None
        if watch is not None:
            watch.close()
        if self.membership is not None:  # sessions stop, then the leases go at once
            self.membership.leave()
        with self._placing:
            for dest_id, (stop, _) in list(self._runs.items()):
                self._signal_stop(dest_id, stop)  # all at once: each drains its window
            for dest_id in list(self._runs):
                self._stop_session(dest_id, grace)
        for t in self._threads:
            t.join(timeout=grace)
        if self._grpc is not None:
            self._grpc.stop(grace=call_grace).wait(5.0 + grace)  # the handlers left the store
        self._end_children(grace)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.store.close()

    def _end_children(self, grace: float) -> None:
        """Let running snapshot jobs finish for up to ``grace`` s, then terminate them.

        A job ended here leaves its snapshot RUNNING without heartbeats: the next
        server fails it as stalled and asks for a new one (as after a crash).
        """
        deadline = time.monotonic() + grace
        for proc in list(self.children):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("terminating snapshot job", extra={"pid": proc.pid})
                proc.terminate()
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.children.remove(proc)


def run_server(config: SiteConfig, stop: threading.Event | None = None) -> None:
    """Run a site until ``stop`` is set or SIGTERM/SIGINT arrives."""
    from lr_server.ops.stop_signals import stop_on_signals
    from lr_server.transport.grpc_client import quiet_waits

    configure_logging(config.id)
    quiet_waits()  # this process's main thread never waits in grpc
    if config.tracing.enabled:  # spans through the process's global tracer provider
        tracing.enable()
    server = SiteServer(config)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        stop_on_signals(stop)  # no lock taken in the handler (see the module)
    server.start(interrupt=stop)  # a signal ends its retries too
    log.info("site %s running", config.id)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        log.info("site %s stopping", config.id)
        server.stop()
