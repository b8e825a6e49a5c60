"""One reader of the send queue for every sender session of a site.

An entry addressed to eight destinations is stored once (I4), but eight
sessions reading it each on their own would fetch, convert and copy it eight
times. The fan-out keeps, per client, a *window* of its most recent entries in
memory: every entry of the client with a position in ``(lo, hi]``, in order,
with the destinations it was transmitted to. A session whose position lies in
the window is served from it, and the session that reaches its end reads the
next range once for all (:meth:`~lr_client.store.contract.Shipping.read_client_log`).

The window follows the sessions that keep up; it holds at most
``max_entries`` entries and ``max_bytes`` payload bytes, dropping the oldest,
and that includes the read that extends it: before each read the oldest
entries make room for it, and the read itself loads at most ``read_batch``
entries and a quarter of ``max_bytes`` (one larger entry alone exceeds it).
A session behind the window (a destination catching up a backlog) reads its
own entries from the database, as without the fan-out, until it reaches it.
A session's batch is cut to its byte limit as it is gathered, so it never
holds more than that either.

A cascaded client goes whole to each child of the node that originates it
(docs/cascading.md): its sessions read with no destination, every entry of
the client, from the same window.

It returns exactly what :meth:`~lr_client.store.contract.Shipping.read_log_entries`
would: a range ``(lo, hi]`` read once stays complete because positions follow
commit order (I1), the property per-destination reads rely on as well.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field

from lr_client.records import SendEntry
from lr_client.store import Shipping
from lr_client.store.byte_bounds import ByteCut


@dataclass
class _Window:
    lo: int = -1  # -1: not started
    hi: int = -1
    positions: list[int] = field(default_factory=list)
    entries: list[SendEntry] = field(default_factory=list)
    nbytes: int = 0
    refreshed_at: float = float("-inf")  # never: the first read refreshes
    read_end: float = float("-inf")  # when the last refresh's read returned
    at_end: bool = False  # the last refresh reached the end of the queue
    lock: threading.Lock = field(default_factory=threading.Lock)


class LogFanout:
    """Serves the sender sessions' log reads from a shared window per client."""

    def __init__(
        self,
        store: Shipping,
        max_entries: int = 20_000,
        max_bytes: int = 64 * 1024 * 1024,
        read_batch: int = 2_000,
        min_refresh_interval: float = 0.005,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or read_batch < 1:
            raise ValueError("max_entries, max_bytes and read_batch must be positive")
        self.store = store
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.read_batch = read_batch
        #: Payload bytes one read of the window loads (past its first entry).
        self.read_bytes = max(1, max_bytes // 4)
        self.min_refresh_interval = min_refresh_interval
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()
        #: Reads served from the window, and reads that went to the database directly.
        self.hits = 0
        self.misses = 0

    def _window(self, client_name: str) -> _Window:
        with self._lock:
            w = self._windows.get(client_name)
            if w is None:
                w = self._windows[client_name] = _Window()
            return w

    def read(
        self,
        destination: str | None,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
        asked: float | None = None,
    ) -> list[SendEntry]:
        """The next entries of one stream, as ``store.read_log_entries`` returns them;
        with no ``destination``, every entry of the client, as ``store.read_client_log``.
        ``asked``: when the reader needed them (now if None; ``time.monotonic()``): a
        refresh begun since then answers this read too."""
        return self.read_stated(destination, client_name, after, limit, max_bytes, asked)[0]

    def read_stated(
        self,
        destination: str | None,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None = None,
        asked: float | None = None,
    ) -> tuple[list[SendEntry], float]:
        """:meth:`read`, and when the database's state it returns was read, at the latest
        (``time.monotonic()``): a read begun since sees all that committed before it."""
        asked = time.monotonic() if asked is None else asked
        w = self._window(client_name)
        with w.lock:
            if w.lo < 0:
                w.lo = w.hi = after
            if after > w.hi:
                self._refresh(w, client_name, force=True)
                if after > w.hi:  # the window fell behind its readers: restart it here
                    self._restart(w, after)
            if after >= w.lo:
                self.hits += 1
                out, own = self._serve(w, destination, client_name, after, limit, max_bytes, asked)
                return out, time.monotonic() if own else w.read_end
        self.misses += 1
        out = self._read_own(destination, client_name, after, limit, max_bytes)
        return out, time.monotonic()

    def _read_own(
        self,
        destination: str | None,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None,
    ) -> list[SendEntry]:
        """One stream's read from the database, not through the window."""
        if destination is None:
            return list(self.store.read_client_log(client_name, after, limit, max_bytes=max_bytes))
        return self.store.read_log_entries(
            destination, client_name, after, limit, max_bytes=max_bytes
        )

    # -- inside the window's lock ---------------------------------------------------------------
    def _serve(
        self,
        w: _Window,
        destination: str | None,
        client_name: str,
        after: int,
        limit: int,
        max_bytes: int | None,
        asked: float,
    ) -> tuple[list[SendEntry], bool]:
        """The stream's entries from the window; whether some were read on its own."""
        out: list[SendEntry] = []
        cut = ByteCut(max_bytes)
        i = bisect.bisect_right(w.positions, after)
        refreshed = False
        while len(out) < limit:
            if i >= len(w.entries):
                # The end of the window: read the next range for every session, once.
                # A read that reached the end of the queue is not repeated at once.
                if (w.at_end and refreshed) or not self._refresh(
                    w, client_name, refreshed, None if refreshed else asked
                ):
                    break
                refreshed = True
                reached = out[-1].position if out else after
                if reached < w.lo:
                    # Making room evicted entries this stream still needs: read the
                    # rest, within what is left of the byte limit.
                    left = None if max_bytes is None else max(1, max_bytes - cut.total)
                    rest = self._read_own(destination, client_name, reached, limit - len(out), left)
                    for entry in rest:
                        if not cut.take(len(entry.payload)):
                            break
                        out.append(entry)
                    return out, True
                i = bisect.bisect_right(w.positions, reached)
                continue
            entry = w.entries[i]
            i += 1
            if destination is None or destination in entry.destinations:
                if not cut.take(len(entry.payload)):
                    break
                out.append(entry)
        return out, False

    def _refresh(
        self, w: _Window, client_name: str, force: bool = False, asked: float | None = None
    ) -> bool:
        """Append the entries after ``hi``; whether any came. Not when another refresh
        began within ``min_refresh_interval``, or after ``asked`` and reached the end of the
        queue (it read what committed before the reader asked: sessions woken at once share
        one read), unless ``force``."""
        now = time.monotonic()
        recent = now - w.refreshed_at < self.min_refresh_interval
        shared = asked is not None and w.refreshed_at >= asked and w.at_end
        if not force and (recent or shared):
            return False
        w.refreshed_at = now
        # Room first, so the window and the read together stay within the limits.
        self._evict(w, room_bytes=self.read_bytes)
        rows = self.store.read_client_log(
            client_name, w.hi, self.read_batch, max_bytes=self.read_bytes
        )
        w.read_end = time.monotonic()
        w.at_end = rows.complete
        if not rows:
            return False
        w.positions.extend(e.position for e in rows)
        w.entries.extend(rows)
        w.nbytes += sum(len(e.payload) for e in rows)
        w.hi = rows[-1].position
        self._evict(w)
        return True

    def _evict(self, w: _Window, room_bytes: int = 0) -> None:
        """Drop the oldest entries until the window, plus ``room_bytes``, fits the limits."""
        excess = len(w.entries) - self.max_entries
        limit = self.max_bytes - room_bytes
        n, freed = 0, 0
        while n < len(w.entries) and (n < excess or w.nbytes - freed > limit):
            freed += len(w.entries[n].payload)
            n += 1
        if n:
            w.lo = w.positions[n - 1]
            del w.positions[:n]
            del w.entries[:n]
            w.nbytes -= freed

    @staticmethod
    def _restart(w: _Window, at: int) -> None:
        w.lo = w.hi = at
        w.positions.clear()
        w.entries.clear()
        w.nbytes = 0


__all__ = ["LogFanout"]
