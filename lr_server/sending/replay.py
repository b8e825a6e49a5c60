"""Replays of one destination's streams: ``lr replay`` carried out by its sender session.

An operator's request (a row of ``lrq_replays``, :mod:`lr_client.store.recv.replays`)
is picked up by the session of its destination at its next check of requests:
it is refused (``refused``, with the reason) when the destination speaks a
protocol older than :data:`~lr_server.protocol.versions.REPLAY_VERSION`, when the
stream is shipped over lanes or is of a cascaded client, or when trim deleted an
entry of the range (a full sync is then the way: ``lr snapshot request``).
Otherwise it runs: its range ends at ``through_position``, the position the
destination had acknowledged when it was picked up, and the retained entries
from ``from_position`` on are shipped again in batches flagged ``replay``,
within the session's window, beside the stream's own batches. Their
acknowledgements move ``shipped_through``, never the stream's cursor; once the
last is acknowledged the request is ``done``. A connection lost meanwhile
resumes it after ``shipped_through``; so does a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from lr_client.errors import IncompatibleVersionError
from lr_client.store.recv.replay_contract import DONE, REFUSED, RUNNING, ReplayRequest
from lr_server import metrics
from lr_server.config import ReplicationConfig
from lr_server.protocol import versions as protocol
from lr_server.sending import wire
from lr_server.sending.request_board import Requests
from lr_server.sending.streams import ClientStream, Mode
from lr_server.sending.window import InFlight, Window
from lr_server.stores import ReplayStore
from lr_server.transport.base import BatchStream


def trimmed_message(destination: str, client: str, position: int, trimmed: int) -> str:
    """Why a replay from ``position`` cannot be: trim deleted entries up to ``trimmed``."""
    return (
        f"{destination}/{client}: position {position} is no longer held here (trimmed "
        f"through {trimmed}); a full sync is needed: lr snapshot request --destination "
        f"{destination} --client {client}"
    )


@dataclass
class ReplayRun:
    """A request being shipped on this connection."""

    request: ReplayRequest
    sent: int  # the last position shipped again
    through: int  # the last position of the range
    inflight: set[int] = field(default_factory=set)  # its batches not acknowledged yet


class Replayer:
    """Carries out the replay requests of one destination on the session's connection."""

    def __init__(
        self,
        store: ReplayStore,
        source_id: str,
        destination: str,
        cfg: ReplicationConfig,
        window: Window,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.store = store
        self.source_id = source_id
        self.destination = destination
        self.cfg = cfg
        self.window = window
        self._log = log
        self.version = 1  # the destination's protocol, as negotiated
        self.runs: dict[str, ReplayRun] = {}
        self.wrote = float("-inf")  # when it last changed a request (time.monotonic())

    def _update(self, replay_id: int, **values: object) -> None:
        """Change a request (``Replays.update_replay``), noting when: reads begun before
        miss it (:meth:`check`)."""
        self.store.replays.update_replay(replay_id, **values)
        self.wrote = time.monotonic()

    def connected(self, announced: int) -> None:
        """A new connection: the requests are picked up again, after what was acknowledged."""
        self.version = protocol.peer_version(announced)
        self.runs.clear()

    def check(
        self,
        streams: dict[str, ClientStream],
        cascaded: Collection[str],
        seen: Requests | None = None,
    ) -> None:
        """Pick up the destination's open requests (one at a time per client); ``seen``:
        them as a read begun since the check was asked found them (None, or begun before
        its own last change of them: read now)."""
        if seen is None or seen.began < self.wrote:
            opened = self.store.replays.list_replays(self.destination, open_only=True)
        else:
            opened = seen.replays_of(self.destination)
        for req in opened:
            if req.client_name in self.runs:
                continue
            error = self.refusal(req, streams, cascaded)
            if error:
                self.refuse(req, error)
                continue
            through = req.through_position
            if through is None:
                through = self.store.shipping.get_cursor(self.destination, req.client_name).position
                self._update(req.replay_id, status=RUNNING, through_position=through)
                self._log.info(
                    "%s/%s: replay %d of positions %d..%d",
                    self.destination,
                    req.client_name,
                    req.replay_id,
                    req.from_position,
                    through,
                )
            run = self.runs[req.client_name] = ReplayRun(req, req.shipped_through, through)
            self.finish(run)  # nothing left to ship (an empty range, or all acknowledged)

    def refusal(
        self, req: ReplayRequest, streams: dict[str, ClientStream], cascaded: Collection[str]
    ) -> str:
        """Why the request cannot run here ("" if it can)."""
        name = req.client_name
        if name not in streams:
            return f"{self.destination}/{name}: the client is not replicated to the destination"
        try:
            protocol.require("replay", self.version, repr(self.destination))
        except IncompatibleVersionError as exc:
            return str(exc)
        if self.cfg.streams_per_destination > 1:
            return "replay ships on one stream: set streams_per_destination = 1"
        if name in cascaded:
            return f"{name} is a cascaded client: its streams are not replayed"
        trimmed = self.store.retention.trimmed_through(self.destination, name)
        if trimmed > req.shipped_through:
            return trimmed_message(self.destination, name, req.shipped_through + 1, trimmed)
        return ""

    def refuse(self, req: ReplayRequest, error: str) -> None:
        self.runs.pop(req.client_name, None)
        self._update(req.replay_id, status=REFUSED, error=error)
        self._log.error("replay %d refused: %s", req.replay_id, error)

    def ship(self, stream: BatchStream, streams: dict[str, ClientStream]) -> bool:
        """Send the next batch of each running replay the window has room for."""
        sent_any = False
        for name, run in list(self.runs.items()):
            cs = streams.get(name)
            if cs is None or cs.mode is not Mode.LOG or cs.notice is not None:
                continue  # waits for the stream's full sync or stop to end
            if run.sent >= run.through or self.window.full():
                continue
            entries = self.store.shipping.read_log_entries(
                self.destination,
                name,
                run.sent,
                self.cfg.batch_max_entries,
                max_bytes=self.cfg.batch_max_bytes,
                up_to=run.through,
            )
            trimmed = self.store.retention.trimmed_through(self.destination, name)
            if trimmed > run.sent:  # trim went past the range meanwhile
                self.refuse(
                    run.request, trimmed_message(self.destination, name, run.sent + 1, trimmed)
                )
                continue
            if not entries:
                run.sent = run.through
                self.finish(run)
                continue
            batch = wire.log_batch(
                self.window.next_batch_id(), self.source_id, name, entries, run.sent
            )
            batch.replay = True
            nbytes = sum(len(e.payload) for e in entries)
            self.window.add(
                InFlight(
                    batch.batch_id,
                    name,
                    batch.kind,
                    batch.last_position,
                    len(entries),
                    nbytes,
                    time.monotonic(),
                    replay=True,
                )
            )
            stream.send(batch)
            run.sent = entries[-1].position
            run.inflight.add(batch.batch_id)
            sent_any = True
        return sent_any

    def acked(self, f: InFlight) -> None:
        """A replayed batch was acknowledged."""
        run = self.runs.get(f.client)
        if run is None or f.batch_id not in run.inflight:
            return
        run.inflight.discard(f.batch_id)
        metrics.REPLAYS_SHIPPED.labels(self.destination, f.client).inc(f.entries)
        self._update(run.request.replay_id, shipped_through=f.last_position)
        self.finish(run)

    def finish(self, run: ReplayRun) -> None:
        """End the request once its range was shipped and acknowledged."""
        if run.sent < run.through or run.inflight:
            return
        self._update(run.request.replay_id, status=DONE, shipped_through=run.through)
        self.runs.pop(run.request.client_name, None)
        self._log.info(
            "%s/%s: replay %d done (positions %d..%d)",
            self.destination,
            run.request.client_name,
            run.request.replay_id,
            run.request.from_position,
            run.through,
        )


__all__ = ["ReplayRun", "ReplayStore", "Replayer", "trimmed_message"]
