"""Wake-ups for the sender sessions that relay what this site's receiver stores.

A branch relays a cascaded client from its own receive queue
(docs/cascading.md). Its receiver and its sender sessions run in one process:
the receiver calls :meth:`Arrivals.ring` once a log batch of a client is
stored (its transaction committed), and every session that relays that client
is woken (its wait for acknowledgements ends: :meth:`BatchStream.interrupt
<lr_server.transport.base.BatchStream.interrupt>`) to read it at once, instead
of at its next poll (``[replication] poll_interval``) or the next
acknowledgement. A ring nobody listens for costs a dict look-up; a ring while
the session reads leaves its wait ended in advance, so nothing stored is left
waiting for a poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

Wake = Callable[[], None]


class Arrivals:
    """Who to wake when a batch of a client is stored here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakes: dict[str, list[Wake]] = {}

    def listen(self, clients: Iterable[str], wake: Wake) -> None:
        """Call ``wake`` whenever a log batch of one of ``clients`` is stored, until
        :meth:`forget`."""
        with self._lock:
            for client in clients:
                self._wakes.setdefault(client, []).append(wake)

    def forget(self, wake: Wake) -> None:
        with self._lock:
            for client in list(self._wakes):
                kept = [w for w in self._wakes[client] if w is not wake]
                if kept:
                    self._wakes[client] = kept
                else:
                    del self._wakes[client]

    def ring(self, source_id: str, client: str) -> None:
        """A log batch of ``client`` from ``source_id`` (its origin) was stored."""
        with self._lock:
            wakes = list(self._wakes.get(client, ()))
        for wake in wakes:
            wake()


__all__ = ["Arrivals", "Wake"]
