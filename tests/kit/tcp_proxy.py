"""A loopback TCP proxy with fault injection (cut, stall, slow, reset, added latency) for tests.

Pure stdlib: one accept thread plus two pump threads per connection. Every blocking
step polls with a short timeout, so faults take effect within ``_POLL`` seconds and
``stop()`` joins all threads promptly.

Typical use::

    with FaultProxy("127.0.0.1", server_port) as proxy:
        client = connect(port=proxy.port)
        proxy.stall()
        ...
        proxy.restore()
"""

from __future__ import annotations

import queue
import select
import socket
import struct
import threading
import time
from contextlib import suppress
from types import TracebackType

__all__ = ["FaultProxy"]

_POLL = 0.05
"""Seconds between checks of the fault state while waiting on a socket."""
_CHUNK = 65536
"""Largest read per recv() when not throttled."""
_CONNECT_TIMEOUT = 5.0
"""Timeout for connecting to the target."""
_JOIN_TIMEOUT = 2.0
"""Upper bound for stop() and for waiting on connection resets."""


def _ready(sock: socket.socket, event: int) -> bool:
    """Whether ``sock`` is ready for ``event`` within ``_POLL`` seconds. ``poll``, not
    ``select``: a process with many files open (a long test run) has descriptors past
    ``select``'s limit of 1,024."""
    poller = select.poll()
    poller.register(sock, event)
    return bool(poller.poll(_POLL * 1000))


def _abortive_close(sock: socket.socket) -> None:
    """Close ``sock`` so that the peer sees a TCP RST (SO_LINGER with timeout 0)."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Connection:
    """One proxied client connection: a client socket, an upstream socket, two pumps."""

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self._proxy = proxy
        self._client = client
        self._upstream: socket.socket | None = None
        self._live = 1  # pumps (or the setup step) still running
        self.aborted = False  # guarded by proxy._cond
        self.closed = False  # guarded by proxy._cond
        self.threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Connect upstream and start pumping, on a new thread."""
        thread = threading.Thread(target=self._run, name="fault-proxy-conn", daemon=True)
        self.threads.append(thread)
        thread.start()

    def request_reset(self) -> None:
        """Ask the pumps to stop and close both sides with RST. Caller holds no lock."""
        with self._proxy._cond:
            self.aborted = True
            self._proxy._cond.notify_all()

    def _exiting(self) -> bool:
        """True when the pumps must stop (caller holds proxy._cond)."""
        return self.aborted or self._proxy._stopping

    def _run(self) -> None:
        proxy = self._proxy
        try:
            upstream = socket.create_connection(proxy._target, timeout=_CONNECT_TIMEOUT)
        except OSError:
            with proxy._cond:
                self.aborted = True
            self._pump_exit()
            return
        with proxy._cond:
            self._upstream = upstream
            go_on = not self._exiting()
            if go_on:
                self._live = 2
        if not go_on:
            self._pump_exit()
            return
        for sock in (self._client, upstream):
            sock.setblocking(False)
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        back = threading.Thread(
            target=self._pump, args=(upstream, self._client), name="fault-proxy-down", daemon=True
        )
        self.threads.append(back)
        back.start()
        self._pump(self._client, upstream)

    def _pump_exit(self) -> None:
        """Called once per pump; the last one out closes both sockets."""
        proxy = self._proxy
        with proxy._cond:
            self._live -= 1
            if self._live > 0:
                return
            abort = self._exiting()
        for sock in (self._client, self._upstream):
            if sock is None:
                continue
            if abort:
                _abortive_close(sock)
            else:
                sock.close()
        with proxy._cond:
            self.closed = True
            proxy._conns.discard(self)
            proxy._cond.notify_all()

    # -- pumping ---------------------------------------------------------------------

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Forward ``src`` -> ``dst`` until EOF, error or abort."""
        if self._proxy._latency > 0:
            self._pump_delayed(src, dst)
            return
        pacer = _Pacer(self._proxy)
        try:
            while True:
                data = self._read(src)
                if data is None:
                    return
                if not data:  # EOF: propagate the half-close
                    with suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                if not self._write(dst, data) or not pacer.pace(self, len(data)):
                    return
        except OSError:  # reset or broken pipe on either side: reset the other side too
            self.request_reset()
        finally:
            self._pump_exit()

    def _pump_delayed(self, src: socket.socket, dst: socket.socket) -> None:
        """Forward as :meth:`_pump`, each chunk written ``latency`` seconds after it was read."""
        line: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        latency = self._proxy._latency

        def deliver() -> None:
            try:
                while (item := line.get()) is not None:
                    due, data = item
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    if not data:
                        with suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                        return
                    if not self._write(dst, data):
                        return
            except OSError:
                self.request_reset()

        writer = threading.Thread(target=deliver, name="fault-proxy-delay", daemon=True)
        writer.start()
        try:
            while True:
                data = self._read(src)
                if data is None:
                    return
                line.put((time.monotonic() + latency, data))
                if not data:
                    return
        except OSError:
            self.request_reset()
        finally:
            line.put(None)
            writer.join()
            self._pump_exit()

    def _wait_not_stalled(self) -> bool:
        """Block while stalled; False if the pump must exit. Caller holds proxy._cond."""
        proxy = self._proxy
        while proxy._stalled and not self._exiting():
            proxy._cond.wait(_POLL)
        return not self._exiting()

    def _read(self, src: socket.socket) -> bytes | None:
        """One chunk from ``src`` (b"" on EOF), or None if the pump must exit."""
        proxy = self._proxy
        while True:
            with proxy._cond:
                if not self._wait_not_stalled():
                    return None
            if not _ready(src, select.POLLIN):
                continue
            with proxy._cond:  # re-check under the lock: stall() must win any race
                if self._exiting():
                    return None
                if proxy._stalled:
                    continue
                size = _CHUNK if proxy._rate is None else max(1, min(_CHUNK, proxy._rate // 20))
                try:
                    return src.recv(size)
                except (BlockingIOError, InterruptedError):
                    continue

    def _write(self, dst: socket.socket, data: bytes) -> bool:
        """Send all of ``data`` to ``dst``; False if the pump must exit first."""
        proxy = self._proxy
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            with proxy._cond:
                if not self._wait_not_stalled():
                    return False
            if not _ready(dst, select.POLLOUT):
                continue
            with proxy._cond:
                if self._exiting():
                    return False
                if proxy._stalled:
                    continue
                try:
                    sent = dst.send(view[offset:])
                except (BlockingIOError, InterruptedError):
                    continue
                proxy._bytes_forwarded += sent
            offset += sent
        return True


class _Pacer:
    """Per-direction throttle: keeps the average rate at or below ``proxy._rate``."""

    def __init__(self, proxy: FaultProxy) -> None:
        self._proxy = proxy
        self._epoch = -1
        self._start = 0.0
        self._sent = 0

    def pace(self, conn: _Connection, nbytes: int) -> bool:
        """Account for ``nbytes`` just sent and wait as needed; False if the pump must exit."""
        proxy = self._proxy
        with proxy._cond:
            rate = proxy._rate
            if rate is None:
                return not conn._exiting()
            now = time.monotonic()
            # New rate, or idle/behind schedule for a while: restart the schedule now.
            if self._epoch != proxy._rate_epoch or now > self._start + self._sent / rate + 0.25:
                self._epoch = proxy._rate_epoch
                self._start = now
                self._sent = 0
            self._sent += nbytes
            due = self._start + self._sent / rate
            while not conn._exiting() and proxy._rate_epoch == self._epoch:
                remaining = due - time.monotonic()
                if remaining <= 0:
                    break
                proxy._cond.wait(min(remaining, _POLL))
            return not conn._exiting()


class FaultProxy:
    """TCP proxy from ``listen_host:port`` to ``target_host:target_port`` with fault controls.

    Connects to nothing but the given target. Fault controls may be called from any
    thread while traffic flows; ``restore()`` undoes all of them.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        latency: float = 0.0,
    ) -> None:
        self._target = (target_host, target_port)
        self._latency = latency  # seconds added to each direction (the round trip: twice)
        self._listen = (listen_host, listen_port)
        self._cond = threading.Condition()
        self._conns: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self._port: int | None = None
        self._accept_thread: threading.Thread | None = None
        self._started = False
        self._stopping = False
        self._cut = False
        self._stalled = False
        self._rate: int | None = None
        self._rate_epoch = 0
        self._connections_total = 0
        self._bytes_forwarded = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Bind the listening socket and start accepting. Returns ``self``."""
        with self._cond:
            if self._started:
                raise RuntimeError("FaultProxy already started")
            self._started = True
        listener = socket.create_server(self._listen, backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="fault-proxy-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Reset all connections, close the listener and join every thread (within ~2 s)."""
        deadline = time.monotonic() + _JOIN_TIMEOUT
        with self._cond:
            if not self._started or self._stopping:
                return
            self._stopping = True
            conns = list(self._conns)
            self._cond.notify_all()
        if self._accept_thread is not None:
            self._accept_thread.join(max(0.0, deadline - time.monotonic()))
        if self._listener is not None:
            self._listener.close()
        self._await_closed(conns, deadline)
        for conn in conns:
            for thread in list(conn.threads):
                thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (after ``start()``)."""
        if self._port is None:
            raise RuntimeError("FaultProxy not started")
        return self._port

    # -- fault controls --------------------------------------------------------------

    def cut(self) -> None:
        """Reset all current connections and refuse (accept, then reset) new ones."""
        with self._cond:
            self._cut = True
        self._reset_current()

    def stall(self) -> None:
        """Stop forwarding in both directions; connections stay open, no data is lost.

        Unread bytes stay in the kernel buffers (at most one chunk already read is held
        back); once this returns, nothing more is written to either side until ``restore()``.
        """
        with self._cond:
            self._stalled = True
            self._cond.notify_all()

    def slow(self, bytes_per_second: int) -> None:
        """Throttle forwarding to ``bytes_per_second`` in each direction of each connection."""
        if bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be positive")
        with self._cond:
            self._rate = bytes_per_second
            self._rate_epoch += 1
            self._cond.notify_all()

    def reset_all(self) -> None:
        """Reset the current connections once; new connections are served normally."""
        self._reset_current()

    def reset_one(self) -> bool:
        """Reset one current connection, the others going on; whether there was one."""
        deadline = time.monotonic() + _JOIN_TIMEOUT
        with self._cond:
            conns = [c for c in self._conns if not c.closed]
            if not conns:
                return False
            conns[0].aborted = True
            self._cond.notify_all()
        self._await_closed(conns[:1], deadline)
        return True

    def restore(self) -> None:
        """Undo ``cut``, ``stall`` and ``slow``: forward normally again."""
        with self._cond:
            self._cut = False
            self._stalled = False
            self._rate = None
            self._rate_epoch += 1
            self._cond.notify_all()

    # -- counters --------------------------------------------------------------------

    @property
    def connections_total(self) -> int:
        """Client connections accepted for forwarding (ones refused while cut are excluded)."""
        with self._cond:
            return self._connections_total

    @property
    def bytes_forwarded(self) -> int:
        """Bytes written to either side so far (both directions summed)."""
        with self._cond:
            return self._bytes_forwarded

    # -- internals -------------------------------------------------------------------

    def _reset_current(self) -> None:
        """Reset every current connection and wait until they are closed."""
        deadline = time.monotonic() + _JOIN_TIMEOUT
        with self._cond:
            conns = list(self._conns)
            for conn in conns:
                conn.aborted = True
            self._cond.notify_all()
        self._await_closed(conns, deadline)

    def _await_closed(self, conns: list[_Connection], deadline: float) -> None:
        with self._cond:
            while any(not conn.closed for conn in conns):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            with self._cond:
                if self._stopping:
                    return
            if not _ready(listener, select.POLLIN):
                continue
            try:
                client, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError:
                return
            conn: _Connection | None = None
            with self._cond:
                if not (self._cut or self._stopping):
                    conn = _Connection(self, client)
                    self._conns.add(conn)
                    self._connections_total += 1
            if conn is None:
                _abortive_close(client)
            else:
                conn.start()
