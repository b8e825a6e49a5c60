"""One read of the operators' and retention's requests for every sender session of a site.

Each session checks, on a wake-up, a sweep or its safety poll, whether its streams have
an open full sync, a drop record or an open replay request. Twenty sessions checking
on their own cost twenty times three reads (and one read per client for the full
syncs); the board reads the requests of every destination at once and serves each
session from the last read that *began after the session asked*: everything committed
before it asked is in it, exactly as in a read of its own. Sessions woken together (a
sweep, a send queue's wake-up) share one read. A session's own writes of requests (a
full sync it completed, a replay it finished) are newer than a read begun before them:
the parts that write refuse such a read and make their own
(:meth:`~lr_server.sending.snapshot_requests.SnapshotRequests.check`). The board also
serves the look-ups before a send of entries from the shared reader
(:mod:`lr_server.sending.send_checks`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from lr_client.records import OPEN_SNAPSHOT_STATUSES, DropRecord, SnapshotRequest
from lr_client.store.recv.replay_contract import ReplayRequest
from lr_server.stores import BoardStore


@dataclass(frozen=True)
class Requests:
    """The open requests of every destination, as one read saw them."""

    #: The newest open (requested, running or ready) full sync of each (destination, client).
    snapshots: dict[tuple[str, str], SnapshotRequest] = field(default_factory=dict)
    #: The drop record of each (destination, client) that has one.
    drops: dict[tuple[str, str], DropRecord] = field(default_factory=dict)
    #: Each destination's pending or running replays, oldest first.
    replays: dict[str, list[ReplayRequest]] = field(default_factory=dict)
    #: When the read began (``time.monotonic()``): it holds what committed before.
    began: float = float("-inf")

    def open_snapshot(self, destination: str, client: str) -> SnapshotRequest | None:
        return self.snapshots.get((destination, client))

    def drops_of(self, destination: str) -> dict[str, DropRecord]:
        """The destination's drop records, by client."""
        return {c: d for (dest, c), d in self.drops.items() if dest == destination}

    def replays_of(self, destination: str) -> list[ReplayRequest]:
        return self.replays.get(destination, [])


def read_requests(store: BoardStore) -> Requests:
    """Every destination's open requests (three reads)."""
    began = time.monotonic()
    snapshots: dict[tuple[str, str], SnapshotRequest] = {}
    for req in store.snapshots.list_snapshots(statuses=OPEN_SNAPSHOT_STATUSES):
        snapshots.setdefault((req.destination, req.client_name), req)  # newest first
    drops = {(d.destination, d.client_name): d for d in store.retention.list_drops()}
    replays: dict[str, list[ReplayRequest]] = {}
    for r in store.replays.list_replays(open_only=True):
        replays.setdefault(r.destination, []).append(r)
    return Requests(snapshots, drops, replays, began)


class RequestBoard:
    """Serves the sessions' checks of requests from shared reads."""

    def __init__(self, store: BoardStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._view: Requests | None = None
        #: Checks served by a read another session began, and reads made.
        self.shared = 0
        self.reads = 0

    def read(self, asked: float | None = None) -> Requests:
        """The requests as committed when the session asked (``time.monotonic()``, now if
        None): a read begun since then serves it, else one is made now."""
        asked = time.monotonic() if asked is None else asked
        with self._lock:
            if self._view is not None and self._view.began >= asked:
                self.shared += 1
                return self._view
            self._view = read_requests(self.store)
            self.reads += 1
            return self._view


__all__ = ["RequestBoard", "Requests", "read_requests"]
