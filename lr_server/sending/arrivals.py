"""Wake-ups for the sender sessions that relay what this site's receiver takes in.

A branch relays a cascaded client from its own receive queue
(docs/cascading.md). Its receiver and its sender sessions run in one process:

* the receiver calls :meth:`Arrivals.offer` with each log batch of a relayed
  client it accepts from the client's provider, *before* storing it: every
  session relaying that client keeps the batch (its
  :class:`~lr_server.sending.relay_inbox.RelayInbox`) and is woken to forward it at
  once, while the branch stores it (cut-through);
* it calls :meth:`Arrivals.ring` once a log batch is stored (its transaction
  committed): every session relaying that client is woken (its wait for
  acknowledgements ends: :meth:`BatchStream.interrupt
  <lr_server.transport.base.BatchStream.interrupt>`) to read what it has not
  sent at once, instead of at its next poll (``[replication] poll_interval``)
  or the next acknowledgement.

A call nobody listens for costs a dict look-up; a wake-up while the session
reads leaves its wait ended in advance, so nothing is left waiting for a poll.

It also remembers the last position stored of each (origin, client) and when:
a session whose stream is at or past it skips its read of the receive queue
(:meth:`Arrivals.nothing_stored_past`), as a forwarded batch's read would find
nothing. The memory holds for ``stored_ttl`` seconds (``STORED_TTL``) after the last store: a
batch stored by another member's receiver (another process) rings nothing
here, so without recent stores here every read goes to the queue as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lr_client.records import WireEntry

Wake = Callable[[], None]
#: Given (origin, client, previous position, entries) of a batch received, before it
#: is stored.
Forward = Callable[[str, str, int, Sequence[WireEntry]], None]
#: Seconds the last stored position of a client is trusted after it was stored here.
STORED_TTL = 1.0


class Arrivals:
    """Who to tell when a batch of a client is received, and stored, here."""

    def __init__(self, stored_ttl: float = STORED_TTL) -> None:
        self.stored_ttl = stored_ttl
        self._lock = threading.Lock()
        self._wakes: dict[str, list[Wake]] = {}
        self._forwards: dict[str, list[Forward]] = {}
        #: (origin, client) -> (the highest position stored here, time.monotonic() then).
        self._stored: dict[tuple[str, str], tuple[int, float]] = {}

    def listen(self, clients: Iterable[str], wake: Wake, forward: Forward | None = None) -> None:
        """Call ``wake`` whenever a log batch of one of ``clients`` is stored, and
        ``forward`` with each one received before it is stored, until :meth:`forget`."""
        with self._lock:
            for client in clients:
                self._wakes.setdefault(client, []).append(wake)
                if forward is not None:
                    self._forwards.setdefault(client, []).append(forward)

    def forget(self, wake: Wake, forward: Forward | None = None) -> None:
        with self._lock:
            _drop(self._wakes, wake)
            if forward is not None:
                _drop(self._forwards, forward)

    def nothing_stored_past(self, source_id: str, client: str, after: int) -> bool:
        """Whether this process stored a log batch of ``client`` from ``source_id`` less
        than ``stored_ttl`` seconds ago, and none past position ``after`` since."""
        with self._lock:
            held = self._stored.get((source_id, client))
        if held is None:
            return False
        return held[0] <= after and time.monotonic() - held[1] < self.stored_ttl

    def offer(
        self, source_id: str, client: str, previous: int, entries: Sequence[WireEntry]
    ) -> None:
        """A log batch of ``client`` from ``source_id`` (its origin) was received from its
        provider and checked: it holds every entry of the client after ``previous``.
        The sessions relaying it keep it and are woken; the receiver stores it
        meanwhile (a wait for them to send it on first was measured slower: it delays
        the acknowledgement to the provider, which then gathers larger batches)."""
        with self._lock:
            forwards = list(self._forwards.get(client, ()))
        for forward in forwards:
            forward(source_id, client, previous, entries)

    def ring(self, source_id: str, client: str, last: int | None = None) -> None:
        """A log batch of ``client`` from ``source_id`` (its origin) was stored, up to
        position ``last`` (None: not said)."""
        with self._lock:
            if last is not None:
                held = self._stored.get((source_id, client), (0, 0.0))[0]
                self._stored[(source_id, client)] = (max(held, last), time.monotonic())
            wakes = list(self._wakes.get(client, ()))
        for wake in wakes:
            wake()


def _drop(table: dict[str, list[Any]], fn: object) -> None:
    """Take ``fn`` out of every client's list of ``table`` (and a list left empty); equal
    is enough: a bound method is a new object each time it is named."""
    for client in list(table):
        kept = [f for f in table[client] if f != fn]
        if kept:
            table[client] = kept
        else:
            del table[client]


__all__ = ["Arrivals", "Forward", "Wake"]
