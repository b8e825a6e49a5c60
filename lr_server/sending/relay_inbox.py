"""The batches a branch's session may forward before the branch has stored them.

A branch relays a cascaded client to the nodes below it (docs/cascading.md).
Its receiver hands every log batch of a relayed client that it accepts from
the client's provider (checked: the caller is the provider, positions
increase, log entries only) to the sessions relaying the client *before* it
stores it (:meth:`lr_server.sending.arrivals.Arrivals.offer`); a session keeps the
last few in its :class:`RelayInbox` and sends the next one on at once
(cut-through), while the branch's own transaction stores it. The hop then
costs the child a gRPC round trip, not the branch's receive transaction and a
read of its receive queue.

Why this is safe: a batch of a cascaded client holds *every* log entry of the
client after its ``previous_position`` up to its last, in origin positions,
whichever node sent it. So when a stream's child has everything up to ``after``
and a batch has ``previous <= after < last``, its entries past ``after`` are
exactly the child's next ones, stored here or not. If the branch then fails to
store the batch (it dies, its transaction fails), its provider sends the batch
again; the child already has those entries and skips them as duplicates (it
dedupes by origin position). A child may so hold entries its branch has not
stored yet: a relayed stream's sink past the branch's head is not a restored
database (the origin assigns the positions), and resumes where it is
(:meth:`lr_server.sending.session.SenderSession._head`).

Nothing else changes: the session still looks up the client's open full syncs
and drops before it sends (:meth:`lr_server.sending.shipping.Shipper.ship`), and with
nothing in the inbox that follows the stream it reads the receive queue, as
before. The inbox is bounded (batches and bytes): when full, the oldest batch
goes, and a stream that needs it reads it from the store.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from lr_client.records import ReplicationType, SendEntry, WireEntry
from lr_client.store.byte_bounds import ByteCut


@dataclass(frozen=True, slots=True, eq=False)  # one batch is itself only
class Received:
    """A log batch of a relayed client as the branch's provider sent it."""

    previous: int  # every entry of the client after it, up to the last, is in ``entries``
    entries: tuple[WireEntry, ...]
    nbytes: int

    @property
    def last(self) -> int:
        return self.entries[-1].position


class RelayInbox:
    """The last log batches received of the clients one session relays, oldest first;
    thread-safe (the receiver's threads put, the session's thread takes)."""

    def __init__(self, max_batches: int, max_bytes: int) -> None:
        self.max_batches = max(1, max_batches)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._held: deque[tuple[str, Received]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._held)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def put(self, client: str, previous: int, entries: Sequence[WireEntry]) -> bool:
        """Keep a batch of ``client`` received from its provider; whether it was kept
        (not: empty, not only log entries, or larger than the whole inbox)."""
        if not entries or any(e.type is not ReplicationType.LOG_ENTRY_SYNC for e in entries):
            return False
        nbytes = sum(len(e.payload) for e in entries)
        if nbytes > self.max_bytes:
            return False
        got = Received(previous, tuple(entries), nbytes)
        with self._lock:
            self._held.append((client, got))
            self._bytes += nbytes
            while len(self._held) > self.max_batches or self._bytes > self.max_bytes:
                self._let_go(self._held[0])
        return True

    def take(self, client: str, after: int, max_entries: int, max_bytes: int) -> list[SendEntry]:
        """The client's entries right after ``after`` from a batch held here (at most
        ``max_entries``, and ``max_bytes`` past the first); [] if no batch held follows
        ``after``. The client's batches wholly at or before ``after`` are let go, and
        the batch taken from once all of it is taken."""
        with self._lock:
            found: Received | None = None
            for item in list(self._held):
                name, got = item
                if name != client:
                    continue
                if got.last <= after:
                    self._let_go(item)
                elif found is None and got.previous <= after:
                    found = got
            if found is None:
                return []
            cut = ByteCut(max_bytes)
            out: list[SendEntry] = []
            for e in found.entries:
                if e.position <= after:
                    continue
                if len(out) >= max_entries or not cut.take(len(e.payload)):
                    break
                out.append(
                    SendEntry(
                        e.position,
                        client,
                        ReplicationType.LOG_ENTRY_SYNC,
                        e.payload,
                        created_at=e.origin_time,
                        key=e.key,
                        headers=e.headers,
                    )
                )
            if out and out[-1].position == found.last:
                self._held.remove((client, found))
                self._bytes -= found.nbytes
            return out

    def clear(self) -> None:
        """Let every batch go (the session stops or reconnects)."""
        with self._lock:
            self._held.clear()
            self._bytes = 0

    def _let_go(self, item: tuple[str, Received]) -> None:
        """(The lock is held.)"""
        self._held.remove(item)
        self._bytes -= item[1].nbytes


__all__ = ["Received", "RelayInbox"]
