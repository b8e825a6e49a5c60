"""The full-sync requests of one destination's streams, from request to completion.

Every half second a session picks up drops and new or changed requests
(:meth:`SnapshotRequests.check`), fails a RUNNING snapshot whose worker went
silent, launches Spark providers, and turns streams to or between
snapshots; when the sink acknowledges a snapshot's end marker it completes
it and log entries resume after its base.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from lr_client.records import OPEN_SNAPSHOT_STATUSES, SnapshotRequest, SnapshotStatus
from lr_server.config import (
    ClientConfig,
    ReplicationConfig,
    RetryConfig,
    SiteConfig,
    SnapshotProvider,
)
from lr_server.sending.request_board import Requests, read_requests
from lr_server.sending.stops import StreamStops
from lr_server.sending.streams import ClientStream, Mode
from lr_server.stores import RequestStore

SnapshotLauncher = Callable[[SnapshotRequest, ClientConfig], None]


def once_per_snapshot(launcher: SnapshotLauncher) -> SnapshotLauncher:
    """``launcher`` called once per snapshot id, whichever session asks first.

    A shared snapshot is written by one job for every destination in it; any
    of their sessions may be the first to see it (another's destination may
    be unreachable), so the launch is deduplicated here, across sessions.
    """
    launched: set[str] = set()
    lock = threading.Lock()

    def launch(req: SnapshotRequest, config: ClientConfig) -> None:
        with lock:
            if req.snapshot_id in launched:
                return
            launched.add(req.snapshot_id)
        launcher(req, config)

    return launch


class SnapshotRequests:
    """Requests, launches, reclaims and completes the snapshots of one destination."""

    def __init__(
        self,
        store: RequestStore,
        destination: str,
        stops: StreamStops,
        log: logging.LoggerAdapter[logging.Logger],
        replication: ReplicationConfig,
        retry: RetryConfig,
        launcher: SnapshotLauncher | None = None,
    ) -> None:
        self.store = store
        self.destination = destination
        self.stops = stops
        self.cfg = replication
        self.retry = retry
        self.launcher = launcher
        self._launched: set[str] = set()
        self._log = log
        #: When it last wrote requests or drops (``time.monotonic()``): older reads miss it.
        self.wrote = float("-inf")

    def open_snapshot(self, client: str) -> SnapshotRequest | None:
        """The client's open (requested, running or ready) request, if any."""
        found = self.store.snapshots.list_snapshots(
            self.destination, client, OPEN_SNAPSHOT_STATUSES
        )
        return found[0] if found else None

    def request(self, client: str, reason: str) -> SnapshotRequest | None:
        """Ask for a full sync of ``client``; the new request."""
        sid = self.store.snapshots.request_snapshot(None, self.destination, client, reason)
        self.wrote = time.monotonic()
        return self.store.snapshots.get_snapshot(sid, self.destination)

    def refuse(self, req: SnapshotRequest) -> None:
        """Cancel a full-sync request of a client that has no snapshot provider."""
        reason = (
            f'client {req.client_name} has no snapshot provider (snapshot = "none"): '
            "log entries go on"
        )
        cancelled = self.store.snapshots.cancel_snapshot(req.snapshot_id, reason, self.destination)
        self.wrote = time.monotonic()
        if cancelled:
            self._log.warning(
                "%s/%s: snapshot %s cancelled: %s",
                self.destination,
                req.client_name,
                req.snapshot_id,
                reason,
            )

    def finish(self, client: str, req: SnapshotRequest) -> None:
        """The sink has every entry of ``req``: log entries resume after its base."""
        fence = self.stops.fence(client)
        self.store.snapshots.complete_snapshot(req.snapshot_id, self.destination, fence=fence)
        self.store.shipping.set_cursor(
            self.destination, client, req.base_position or 0, needs_snapshot=False, fence=fence
        )
        self.store.retention.clear_drop(self.destination, client)
        self.wrote = time.monotonic()

    def end_acked(self, snapshot_id: str, cs: ClientStream) -> None:
        """The sink acknowledged the end marker of ``snapshot_id``, a snapshot of ``cs``."""
        current = cs.snapshot
        if current is not None and current.snapshot_id == snapshot_id:
            self.done(cs)
        else:  # superseded while its end was in flight: the newer one goes on
            self._log.info(
                "%s/%s: end of superseded full sync %s acknowledged",
                self.destination,
                cs.config.name,
                snapshot_id,
            )

    def done(self, cs: ClientStream) -> None:
        """The sink acknowledged the end marker of the stream's current snapshot."""
        req = cs.snapshot
        assert req is not None
        base = req.base_position or 0
        self.finish(cs.config.name, req)
        self._log.info(
            "%s/%s: full sync %s complete (%s entries); log entries resume after %d",
            self.destination,
            cs.config.name,
            req.snapshot_id,
            req.entry_count,
            base,
        )
        cs.mode, cs.snapshot, cs.sent = Mode.LOG, None, base
        cs.snap_sent, cs.snap_done_sent = 0, False

    def check(self, streams: dict[str, ClientStream], seen: Requests | None = None) -> None:
        """Pick up drops and new or changed snapshot requests; launch providers.

        ``seen``: the requests as a read begun since the check was asked saw them
        (:class:`~lr_server.sending.request_board.RequestBoard`); None, or begun before
        this destination's own last write of them: read them now."""
        if seen is None or seen.began < self.wrote:
            seen = read_requests(self.store)
        dropped = seen.drops_of(self.destination)
        for name, cs in streams.items():
            open_req = self.reclaim_stalled(seen.open_snapshot(self.destination, name))
            if open_req is not None and cs.config.snapshot == SnapshotProvider.NONE:
                self.refuse(open_req)
                open_req = None
            if cs.mode is Mode.STOPPED:
                stop = self.store.retention.get_stream_stop(self.destination, name)
                if stop is not None and stop.accepted_at is not None and stop.resumed_at is None:
                    self.stops.resume_accepted(cs, stop)
                continue
            if cs.mode is Mode.LOG and name in dropped and open_req is None:
                if cs.config.snapshot == SnapshotProvider.NONE:
                    drop = dropped[name]
                    self.stops.stop(cs, f"dropped ({drop.reason})", drop.first_dropped_position - 1)
                    continue
                open_req = self.request(name, "dropped for falling behind")
            if cs.mode is Mode.LOG:
                if open_req is None:
                    continue
                # Switch now: log batches still in flight reach the sink before the
                # snapshot's, and their acks never move the cursor past its base.
                cs.mode, cs.snapshot, cs.snap_sent, cs.snap_done_sent = (
                    Mode.SNAPSHOT,
                    open_req,
                    0,
                    False,
                )
                cs.notice = self.stops.drop_notice(dropped.get(name))
            elif cs.mode is Mode.SNAPSHOT:
                if cs.snapshot is None or open_req is None:
                    if cs.snap_done_sent:
                        continue  # the end marker is in flight; its ack completes the snapshot
                    if open_req is None:
                        # Cancelled or failed with nothing newer: ask again, not too often.
                        if time.monotonic() < cs.retry_at:
                            continue
                        cs.retry_at = time.monotonic() + self.retry.max_backoff
                        open_req = self.request(name, "previous snapshot did not complete")
                if open_req is not None and (
                    cs.snapshot is None or open_req.snapshot_id != cs.snapshot.snapshot_id
                ):
                    # Superseded, perhaps mid-transfer: the sink drops what it
                    # queued of the old snapshot when the new id arrives.
                    cs.snapshot, cs.snap_sent, cs.snap_done_sent = open_req, 0, False
                elif open_req is not None:
                    cs.snapshot = open_req
            else:
                continue
            req = cs.snapshot
            if req is not None and req.status is SnapshotStatus.REQUESTED:
                self.launch(req, cs.config)

    def rebase(self, cs: ClientStream) -> None:
        """Replace the stream's snapshot, whose base is below what the stream already
        sent: shipped, it would bring those entries to the listener again. A branch's
        base is the last entry it stored, read when the snapshot starts: below an entry
        it forwarded before storing it, or a node that came from a provider further
        ahead. The new snapshot's base is read later (asked at once, then at most every
        ``[retry] max_backoff`` seconds)."""
        req = cs.snapshot
        assert req is not None
        if time.monotonic() < cs.retry_at:
            return
        cs.retry_at = time.monotonic() + self.retry.max_backoff
        reason = (
            f"the stream holds entries up to {cs.sent}, past base {req.base_position}"
            f" of full sync {req.snapshot_id}"
        )
        new = self.request(cs.config.name, reason)
        self._log.info(
            "%s/%s: full sync asked again: %s", self.destination, req.client_name, reason
        )
        cs.snapshot, cs.snap_sent, cs.snap_done_sent = new, 0, False
        if new is not None and new.status is SnapshotStatus.REQUESTED:
            self.launch(new, cs.config)

    def reclaim_stalled(self, req: SnapshotRequest | None) -> SnapshotRequest | None:
        """Fail a RUNNING snapshot whose worker went silent (it crashed); None if so."""
        if req is None or req.status is not SnapshotStatus.RUNNING:
            return req
        silent_since = time.time() - self.cfg.snapshot_stall_timeout
        if req.updated_at >= silent_since:
            return req
        reason = f"no heartbeat from its worker for {self.cfg.snapshot_stall_timeout:g}s"
        # Conditional on the silence, so a beat that came meanwhile keeps it.
        failed = self.store.snapshots.fail_stalled_snapshot(req.snapshot_id, silent_since, reason)
        self.wrote = time.monotonic()
        if failed:
            self._log.warning(
                "%s/%s: snapshot %s failed: %s",
                self.destination,
                req.client_name,
                req.snapshot_id,
                reason,
            )
        return self.open_snapshot(req.client_name)

    def launch(self, req: SnapshotRequest, config: ClientConfig) -> None:
        """Start the client's Spark job for ``req`` once (in-process providers pick it up).

        The sessions of the destinations sharing a snapshot each ask; the
        server's launcher (:func:`once_per_snapshot`) starts one job for them.
        """
        if config.snapshot != SnapshotProvider.SPARK or self.launcher is None:
            return  # an in-process provider of the application picks it up
        if req.snapshot_id in self._launched:
            return
        self._launched.add(req.snapshot_id)
        self._log.info(
            "%s/%s: launching snapshot job %s", self.destination, config.name, req.snapshot_id
        )
        self.launcher(req, config)


def spark_launcher(
    config: SiteConfig, children: list[subprocess.Popen[bytes]]
) -> Callable[[SnapshotRequest, ClientConfig], None]:
    """Start the PySpark snapshot job for a request, as a child process."""

    def launch(req: SnapshotRequest, client: ClientConfig) -> None:
        from spark_jobs.launch import launch_snapshot_job  # only a site that runs snapshots

        log_path = Path(tempfile.gettempdir()) / f"lr-snapshot-{req.snapshot_id}.log"
        proc = launch_snapshot_job(
            config.database_url,
            req.snapshot_id,
            source=client.spark_source,
            encoder=client.spark_encoder,
            key_column=client.spark_key_column,
            master=client.spark_master,
            spark_options=client.spark_options,
            log_path=log_path,
        )
        children.append(proc)
        logging.getLogger("lr.server").info(
            "launched snapshot job",
            extra={"snapshot_id": req.snapshot_id, "pid": proc.pid, "log": str(log_path)},
        )

    return launch


__all__ = ["SnapshotLauncher", "SnapshotRequests", "once_per_snapshot", "spark_launcher"]
