"""Wake-ups for the sender sessions that relay what this site's receiver stores.

A branch relays a cascaded client from its own receive queue
(docs/cascading.md). Its receiver and its sender sessions run in one process:
the receiver rings :meth:`Arrivals.ring` once a log batch of a client is
stored (its transaction committed), and every session that relays that client
and has nothing in flight wakes at once to read it, instead of at its next
poll (``[replication] poll_interval``). A ring nobody listens for costs a dict
look-up; a ring a session misses (it was reading) leaves its bell set, so the
session reads again without waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Arrivals:
    """The bells of the sessions waiting for batches of given clients to be stored here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bells: dict[str, set[threading.Event]] = {}

    def bell(self, clients: Iterable[str]) -> threading.Event:
        """An event set whenever a log batch of one of ``clients`` is stored; give it
        back with :meth:`forget`."""
        bell = threading.Event()
        with self._lock:
            for client in clients:
                self._bells.setdefault(client, set()).add(bell)
        return bell

    def forget(self, bell: threading.Event) -> None:
        with self._lock:
            for client in list(self._bells):
                self._bells[client].discard(bell)
                if not self._bells[client]:
                    del self._bells[client]

    def ring(self, source_id: str, client: str) -> None:
        """A log batch of ``client`` from ``source_id`` (its origin) was stored."""
        with self._lock:
            bells = list(self._bells.get(client, ()))
        for bell in bells:
            bell.set()


__all__ = ["Arrivals"]
