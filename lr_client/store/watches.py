"""Wake-ups between processes: a waiting part learns of new work from a signal.

Two kinds of watch, each a thread of its own that calls ``wake()``:

* :class:`ChannelWatch` (PostgreSQL): ``LISTEN`` on a channel over a connection
  of its own; the writers ``NOTIFY`` in their transactions, which PostgreSQL
  delivers at commit and never for a transaction rolled back;
* :class:`DataVersionWatch` (SQLite): reads ``PRAGMA data_version`` every
  ``interval`` on a connection of its own; it changes whenever another
  connection (of any process) commits. A ``changed`` check can narrow the
  wake-up to the commits that matter (a new head of the send queue, say).

A signal only shortens a wait: every waiter still polls at a slow safety
interval, so a signal lost (a broken connection, a coalesced notification)
costs latency, never an entry. A watch whose connection breaks wakes its
waiter (what came meanwhile is found by a poll), then opens another with
back-off.
"""

from __future__ import annotations

import logging
import os
import select
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.engine import Engine

try:  # Linux: file changes told by the kernel
    import inotify_simple
except ImportError:  # pragma: no cover - elsewhere SQLite's watch polls
    inotify_simple = None

log = logging.getLogger(__name__)

Wake = Callable[[], None]
#: PostgreSQL's channel for the sender sessions: a transmit committed (see
#: :data:`NOTIFY_INTERVAL`).
SENDS_CHANNEL = "lrq_sends"
#: Seconds between a process's notifications on :data:`SENDS_CHANNEL`: PostgreSQL
#: serialises the commits of notifying transactions (a database-wide lock), so a
#: transmitting process notifies once in this interval, not once per transaction.
#: The transactions in between are found by the sessions' next poll, which a
#: session woken makes soon after (it polls fast after work, then backs off).
NOTIFY_INTERVAL = 0.005
#: Above this fraction of PostgreSQL's notification queue, writers send none: a
#: listener that stopped reading holds the queue's tail, and a full queue would
#: make the notifying transaction (the application's) fail.
QUEUE_USAGE_LIMIT = 0.5
#: Seconds a watch waits at most before it looks at its connection again (a slow safety
#: net: a notification or :meth:`Watch.close` ends the wait at once).
WAIT_SLICE = 60.0
#: Seconds between reads of SQLite's ``data_version`` where file changes are not told.
DATA_VERSION_INTERVAL = 0.01
#: Seconds after a write of the database file at which it is read again.
RECHECKS = (0.001, 0.005, 0.02)
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 5.0


class Watch:
    """A daemon thread that watches until closed, reconnecting with back-off."""

    def __init__(self, name: str, wake: Wake) -> None:
        self._wake = wake
        self._name = name
        self._closed = threading.Event()
        #: Connections that were watching so far (one more after each reconnection).
        self.connections = 0
        self._listening = False
        #: Written by :meth:`close`: a wait that polls this pipe too ends at once.
        self._wake_r, self._wake_w = os.pipe()
        self._pipe_open = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        """Whether a connection is watching now: every commit from here on wakes the
        waiter (one that breaks wakes it too, so a poll finds what came while it was
        down)."""
        return self._listening

    def close(self) -> None:
        """Stop watching and close the connection."""
        self._closed.set()
        if self._pipe_open:
            os.write(self._wake_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join()
            if self._pipe_open:
                self._pipe_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _poller(self, fd: int) -> select.poll:
        """A poll of ``fd`` and of the pipe :meth:`close` writes to."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        return poller

    def _run(self) -> None:
        backoff = _BACKOFF_MIN
        while not self._closed.is_set():
            try:
                self._watch()
                backoff = _BACKOFF_MIN
            except Exception as exc:  # the connection broke or could not be opened
                log.info("%s: %r; polling meanwhile", self._name, exc)
                self._wake()  # what came while it was down is found by a poll now
                self._closed.wait(backoff)
                backoff = min(_BACKOFF_MAX, backoff * 2)
            finally:
                self._listening = False

    def _started(self) -> None:
        self._listening = True
        self.connections += 1
        self._wake()  # what was committed before the watch began is found by a poll now

    def _watch(self) -> None:
        raise NotImplementedError


class ChannelWatch(Watch):
    """PostgreSQL: ``wake()`` for each notification on ``channel`` (whose payload is
    ``payload``, if given)."""

    def __init__(
        self, engine: Engine, channel: str, wake: Wake, payload: str | None = None
    ) -> None:
        if not channel.isidentifier():
            raise ValueError(f"not a channel name: {channel!r}")
        self._engine = engine
        self.channel = channel
        self._payload = payload
        super().__init__(f"lr-watch-{channel}" + (f"-{payload}" if payload else ""), wake)

    def _watch(self) -> None:
        # A connection of its own, out of the pool: it listens until closed, and
        # a pooled connection would carry the LISTEN to whoever checks it out next.
        fairy = self._engine.raw_connection()
        raw = fairy.driver_connection
        fairy.detach()
        try:
            assert raw is not None
            raw.rollback()
            raw.autocommit = True
            raw.execute(f"LISTEN {self.channel}")  # an identifier, checked above
            self._started()
            # Asleep until the socket has something (psycopg's own wait would wake ten
            # times a second to look for signals) or close() writes to the pipe.
            poller = self._poller(raw.fileno())
            while not self._closed.is_set():
                for n in raw.notifies(timeout=0):  # what came (or was read already)
                    if self._payload is None or n.payload == self._payload:
                        self._wake()
                poller.poll(WAIT_SLICE * 1000)
        finally:
            fairy.close()


class DataVersionWatch(Watch):
    """SQLite: ``wake()`` when another connection committed to the database file and
    ``changed()`` (read on the watch's connection) says it matters.

    Where the kernel tells of file changes (Linux inotify, through ``inotify_simple``)
    it reads ``data_version`` only when the database or its write-ahead log was
    written (those two files are watched, not the other files of their folder): an
    idle watch costs nothing. Elsewhere it reads it every ``interval``.
    """

    def __init__(
        self,
        path: str,
        wake: Wake,
        changed: Callable[[sqlite3.Connection], bool] | None = None,
        interval: float = DATA_VERSION_INTERVAL,
        name: str = "lr-watch-sqlite",
        use_inotify: bool = True,
    ) -> None:
        self.path = path
        self.interval = interval
        self._changed = changed
        self._inotify = use_inotify and inotify_simple is not None
        super().__init__(name, wake)

    def _watch(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if self._changed is not None:
                self._changed(conn)  # its baseline
            for _ in self._writes():
                now = conn.execute("PRAGMA data_version").fetchone()[0]
                if now == version:
                    continue
                version = now
                if self._changed is None or self._changed(conn):
                    self._wake()
        finally:
            conn.close()

    def _writes(self) -> Iterator[None]:
        """Yields whenever the database may have been written, until closed."""
        if not self._inotify:
            self._started()
            while not self._closed.wait(self.interval):
                yield
            return
        assert inotify_simple is not None
        flags = inotify_simple.flags
        folder, name = os.path.split(os.path.abspath(self.path))
        names = {name, name + "-wal"}
        with inotify_simple.INotify() as notify:
            # The database and its log, each watched for writes (not the folder's other
            # files); the folder only for the files of ours made anew (a new log).
            mine = {notify.add_watch(folder, flags.CREATE | flags.MOVED_TO)}
            files: set[int] = set()
            for n in names:
                files |= _watch_file(notify, os.path.join(folder, n))
            poller = self._poller(notify.fileno())
            self._started()
            yield  # what was written before the watch began
            # A commit's log is written before it is published (the WAL index): a read
            # right after the write may not see it, so the writes are read again a
            # little later, once each.
            again: list[float] = []
            while not self._closed.is_set():
                poller.poll(max(1, int(again[0] * 1000)) if again else None)
                if self._closed.is_set():
                    return
                written = False
                for e in notify.read(timeout=0):
                    if e.wd in mine and e.name in names:  # made anew: watch it
                        files |= _watch_file(notify, os.path.join(folder, e.name))
                    written = written or e.wd in files or e.name in names
                if written:
                    again = list(RECHECKS)
                    yield
                elif again:
                    again.pop(0)
                    yield


def _watch_file(notify: Any, path: str) -> set[int]:
    """Watch ``path`` for writes; its watch descriptor (none if it does not exist)."""
    assert inotify_simple is not None
    try:
        return {notify.add_watch(path, inotify_simple.flags.MODIFY)}
    except OSError:  # not there (yet): the folder's watch tells when it is made
        return set()


def sqlite_path(engine: Engine) -> str | None:
    """The database file of a SQLite engine (None: in memory, nothing to watch)."""
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    return database


class HeadChanged:
    """A ``changed`` check for :class:`DataVersionWatch`: whether a one-row query (the
    heads of some tables) answers differently than at its last call."""

    def __init__(self, query: str) -> None:
        self.query = query
        self._last: object = None

    def __call__(self, conn: sqlite3.Connection) -> bool:
        value: object = conn.execute(self.query).fetchone()
        changed = value != self._last
        self._last = value
        return changed


__all__ = [
    "DATA_VERSION_INTERVAL",
    "NOTIFY_INTERVAL",
    "QUEUE_USAGE_LIMIT",
    "SENDS_CHANNEL",
    "ChannelWatch",
    "DataVersionWatch",
    "HeadChanged",
    "Wake",
    "Watch",
    "sqlite_path",
]
