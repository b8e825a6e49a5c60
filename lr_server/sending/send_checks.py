"""What a pump round looks up before it sends the log entries it read: the clients'
open full syncs and the destination's drops, in one query.

A branch forwarding a relayed client's batches as received (its relay inbox)
checks them against its last look-up if that found them clear and is less
than ``RELAY_CHECKS_TTL`` old, and looks up again once a batch is sent when
that look-up is half as old: the look-up overlaps the child's round trip
instead of delaying a batch, and is made a few times a second, not per batch.
This is safe for a relayed stream only: a full sync or drop recorded since is
one recorded up to that much later, and a snapshot whose base is below what
the stream sent is asked for again (:meth:`SnapshotRequests.rebase
<lr_server.sending.snapshot_requests.SnapshotRequests.rebase>`), as for a batch
forwarded before the branch stored it (docs/cascading.md).

Entries served by the shared reader (:mod:`lr_server.sending.fanout`) are checked
against the server's request board (:mod:`lr_server.sending.request_board`), one read
of every destination's requests, when that read began after the entries' state was
read and after this destination's own last write of full syncs or drops: a request
it misses was made after that state, so its base lies at or after every entry
read, as with a look-up of its own. Sessions woken by one commit share one read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from lr_client.records import DropRecord, SnapshotRequest
from lr_server.sending.request_board import RequestBoard
from lr_server.stores import SendCheckStore

#: Seconds a look-up of relayed clients' full syncs and drops serves the batches
#: forwarded as received.
RELAY_CHECKS_TTL = 1.0


@dataclass(frozen=True, slots=True)
class _Clear:
    """The clients a look-up found with no open full sync and no drop, and when."""

    at: float  # the clock before the look-up
    clients: frozenset[str]


class SendChecks:
    """One destination's look-ups of full syncs and drops, and what the last found clear."""

    def __init__(
        self,
        store: SendCheckStore,
        destination: str,
        board: RequestBoard | None = None,
        wrote: Callable[[], float] = lambda: float("-inf"),
    ) -> None:
        self.store = store
        self.destination = destination
        #: The server's shared reads of requests (None: every look-up is its own).
        self.board = board
        #: When the session last wrote full syncs or drops (``time.monotonic()``).
        self.wrote = wrote
        #: Look-ups served by the board.
        self.shared = 0
        #: Seconds a look-up serves the batches forwarded as received.
        self.relay_checks_ttl = RELAY_CHECKS_TTL
        #: The relayed clients read from the inbox this round.
        self._forwarded: set[str] = set()
        #: What the last look-up of full syncs and drops found clear (None: none yet).
        self._clear: _Clear | None = None
        #: The clock a look-up's age is read on.
        self.clock: Callable[[], float] = time.monotonic

    def new_round(self) -> None:
        """A pump round starts: nothing forwarded in it yet."""
        self._forwarded = set()

    def forwarded(self, client: str) -> None:
        """This round read ``client``'s entries from the relay inbox (as received)."""
        self._forwarded.add(client)

    def checks(
        self, clients: Collection[str], read_at: float | None = None
    ) -> tuple[dict[str, SnapshotRequest], dict[str, DropRecord]]:
        """The open full syncs of ``clients`` and the destination's drops, for entries
        about to be sent: looked up now, or, when every one of them was forwarded as
        received and the last look-up, less than ``relay_checks_ttl`` old, found them
        all clear, none. Only a clear answer is kept: one that found a full sync or a
        drop could outlive it (a full sync ended meanwhile must not start again).
        ``read_at``: when the state the entries come from was read at the latest (None:
        not known); a read of the board begun since then serves."""
        clear = self._clear
        if (
            clear is not None
            and self._forwarded.issuperset(clients)
            and clear.clients.issuperset(clients)
            and self.clock() - clear.at < self.relay_checks_ttl
        ):
            return {}, {}
        if read_at is not None and self.board is not None:
            seen = self.board.read(max(read_at, self.wrote()))
            self.shared += 1
            requests = {c: r for c in clients if (r := seen.open_snapshot(self.destination, c))}
            return requests, seen.drops_of(self.destination)
        return self._look_up(frozenset(clients))

    def look_ahead(self) -> None:
        """After a round's forwards, while the batches travel: look up again if the
        look-up they went with found them clear and is half ``relay_checks_ttl`` old
        (one that did not is made again before the next batch)."""
        clear = self._clear
        if (
            self._forwarded
            and clear is not None
            and clear.clients.issuperset(self._forwarded)
            and self.clock() - clear.at >= self.relay_checks_ttl / 2
        ):
            self._look_up(frozenset(self._forwarded))

    def _look_up(
        self, clients: frozenset[str]
    ) -> tuple[dict[str, SnapshotRequest], dict[str, DropRecord]]:
        """Look up now; what it finds clear serves the batches forwarded next."""
        at = self.clock()
        requests, drops = self.store.snapshots.send_checks(self.destination, list(clients))
        clear = frozenset(c for c in clients if c not in requests and c not in drops)
        self._clear = _Clear(at, clear)
        return requests, drops


__all__ = ["RELAY_CHECKS_TTL", "SendChecks"]
