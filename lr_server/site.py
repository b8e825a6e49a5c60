"""A site run inside the application's own process: what ``lr server`` runs, embedded.

::

    from lr_server import Site

    with Site("site-a.toml") as site:   # start() then wait_serving()
        ...                             # sessions ship, the receiver accepts
    # stop(): sessions, trim and the receiver end as on SIGTERM to `lr server`

:class:`Site` starts the same components as ``lr server`` (the sender session
of every destination, the receiver, retention and trim, the metrics endpoint)
on background threads, and stops them the way ``lr server`` does when it is
told to stop. Unlike ``lr server`` it leaves logging and signals to the
application.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from lr_client.errors import LRError
from lr_client.store import QueueStore
from lr_server.config import SiteConfig, load_config

if TYPE_CHECKING:  # importing the server loads gRPC: only when a site starts
    from lr_server.server import SiteServer

#: Seconds :meth:`Site.wait_serving` (and ``with Site(...)``) waits by default.
DEFAULT_START_TIMEOUT = 30.0
#: Seconds :meth:`Site.stop` gives the site's threads to end, as ``lr server`` does.
DEFAULT_STOP_GRACE = 10.0
#: Seconds between checks of the receiver's port while waiting for it.
_PROBE_INTERVAL = 0.02


class SiteError(LRError):
    """The embedded site failed."""


class SiteStartError(SiteError):
    """The site could not start; ``__cause__`` holds why (config, database, port in use)."""


class SiteTimeoutError(SiteError, TimeoutError):
    """The site was not serving before the deadline."""


def _accepts(address: str, timeout: float) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds now."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::", "*"):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class Site:
    """One site's server, run in this process.

    ``config`` is a :class:`~lr_server.config.SiteConfig` or the path of a
    site config file (read at once: a bad file raises
    :class:`~lr_client.errors.ConfigError` here). ``store`` replaces the
    store the site would open from ``config.database_url``; the site closes
    it when it stops either way.

    :meth:`start` begins starting the site and returns at once;
    :meth:`wait_serving` waits until it serves and raises
    :class:`SiteStartError` (with the cause) if starting failed, or
    :class:`SiteTimeoutError`. Used as a context manager, the site is started
    and waited for on entry (up to ``start_timeout`` seconds) and stopped on
    exit. A site runs once: a stopped site cannot be started again (make a
    new one).
    """

    def __init__(
        self,
        config: SiteConfig | str | os.PathLike[str],
        *,
        store: QueueStore | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
    ) -> None:
        self.config: SiteConfig = (
            config if isinstance(config, SiteConfig) else load_config(Path(config))
        )
        self._given_store = store
        self._server: SiteServer | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()  # start finished, well or not
        self._error: BaseException | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self.start_timeout = start_timeout

    @property
    def id(self) -> str:
        """The site id (``site.id`` of the config)."""
        return self.config.id

    @property
    def store(self) -> QueueStore:
        """The site's queue store (opened by :meth:`start`)."""
        return self.server.store

    @property
    def server(self) -> SiteServer:
        """The running components (sessions, receiver, trim): for inspection, not control.

        Raises :class:`SiteError` before :meth:`start` has opened them.
        """
        if self._server is None:
            raise SiteError(f"site {self.id} is not started")
        return self._server

    @property
    def serving(self) -> bool:
        """Whether the site has started and is not stopped."""
        return self._started.is_set() and self._error is None and not self._stopped

    def start(self) -> None:
        """Start the site in background threads; return at once.

        Opens the store, creates or upgrades the schema, registers the
        destinations, starts the receiver (if ``listen`` is set), a sender
        session per destination, retention and trim, and the metrics endpoint.
        Failures are reported by :meth:`wait_serving`.
        """
        with self._lock:
            if self._stopped:
                raise SiteError(f"site {self.id} was stopped; make a new Site to run it again")
            if self._thread is not None:
                raise SiteError(f"site {self.id} is already started")
            self._thread = threading.Thread(
                target=self._start, name=f"lr-site-{self.id}-start", daemon=True
            )
            self._thread.start()

    def _start(self) -> None:
        try:
            from lr_server.server import SiteServer

            server = SiteServer(self.config, store=self._given_store)
            self._server = server
            try:
                server.start()
            except BaseException:
                server.stop(grace=1.0)  # end what did start, close the store
                raise
        except BaseException as exc:
            self._error = exc
        finally:
            with self._lock:
                self._started.set()
                stop_now = self._stopped and self._error is None and self._server is not None
            if stop_now:  # stop() came during the start and left the stopping to it
                assert self._server is not None
                self._server.stop(DEFAULT_STOP_GRACE)

    def wait_serving(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Wait until the site serves: started, and its receiver's port accepts connections.

        Raises :class:`SiteStartError` if starting failed (``__cause__``: why,
        such as :class:`~lr_client.errors.SchemaError`,
        :class:`~lr_client.errors.StoreUnavailableError` or an ``OSError`` for
        a port in use), :class:`SiteTimeoutError` if ``timeout`` seconds pass
        first, :class:`SiteError` if the site was never started or is stopped.
        """
        if self._thread is None:
            raise SiteError(f"site {self.id} is not started: call start() first")
        deadline = time.monotonic() + timeout
        if not self._started.wait(timeout):
            raise SiteTimeoutError(f"site {self.id} did not start within {timeout:g} s")
        if self._error is not None:
            raise SiteStartError(
                f"site {self.id} failed to start: {type(self._error).__name__}: {self._error}"
            ) from self._error
        if self._stopped:
            raise SiteError(f"site {self.id} is stopped")
        listen = self.config.listen
        if not listen:
            return
        while not _accepts(listen, max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise SiteTimeoutError(
                    f"site {self.id}: {listen} did not accept connections within {timeout:g} s"
                )
            time.sleep(_PROBE_INTERVAL)

    def stop(self, grace: float = DEFAULT_STOP_GRACE, call_grace: float = 2.0) -> None:
        """Stop the site as ``lr server`` stops: sessions and trim end (each
        thread joined for up to ``grace`` seconds), the receiver finishes its
        calls (an open one is cancelled after ``call_grace`` seconds), the store
        is closed. Idempotent.

        A start still in progress (a database that does not answer, a schema
        upgrade another process holds) is waited for up to ``grace`` seconds;
        if it finishes later, the site stops as soon as it has started (with
        the default grace).
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
            started = self._started.is_set()
        if thread is None:
            return
        if not started:  # the start stops the site itself when it ends
            thread.join(grace)
            return
        if self._error is None and self._server is not None:
            self._server.stop(grace, call_grace)

    def __enter__(self) -> Site:
        self.start()
        try:
            self.wait_serving(self.start_timeout)
        except BaseException:
            # A start still running (timed out) is not waited for: it stops itself.
            self.stop(DEFAULT_STOP_GRACE if self._started.is_set() else 0.0)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = [
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_STOP_GRACE",
    "Site",
    "SiteError",
    "SiteStartError",
    "SiteTimeoutError",
]
