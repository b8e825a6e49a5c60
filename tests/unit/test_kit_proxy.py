"""Tests of the fault-injection TCP proxy against a tiny loopback echo server."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.kit.ports import reserve_port
from tests.kit.tcp_proxy import FaultProxy
from tests.kit.wait import scaled, wait_for

DEADLINE = scaled(10.0)  # generous: the suite must not flake on a loaded 2-core machine


class EchoServer:
    """Echoes every byte back; half-closes when the client does. Threads joined on stop."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.05)
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    with contextlib.suppress(OSError):  # the peer may be gone already
                        conn.shutdown(socket.SHUT_WR)
                    return
                try:
                    conn.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self._accept.join(5)
        self._listener.close()
        for thread in self._threads:
            thread.join(5)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as fault_proxy:
        yield fault_proxy


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, size: int, deadline: float = DEADLINE) -> bytes:
    """Read exactly ``size`` bytes or fail at the deadline."""
    end = time.monotonic() + deadline
    chunks: list[bytes] = []
    got = 0
    while got < size:
        remaining = end - time.monotonic()
        assert remaining > 0, f"timed out after {got} of {size} bytes"
        sock.settimeout(remaining)
        chunk = sock.recv(size - got)
        assert chunk, f"unexpected EOF after {got} of {size} bytes"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def assert_silent(sock: socket.socket, period: float = 0.5) -> None:
    """Nothing arrives on ``sock`` for ``period`` seconds."""
    poller = select.poll()  # not select(): a long run's descriptors pass 1,024
    poller.register(sock, select.POLLIN)
    assert not poller.poll(period * 1000), "data (or EOF) arrived while it should not"


def assert_dead(sock: socket.socket) -> None:
    """The proxy reset or closed ``sock``: talking to it yields a reset or EOF, not data."""
    sock.settimeout(DEADLINE)
    try:
        sock.sendall(b"anyone?")
        data = sock.recv(1024)
    except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
        return
    assert data == b"", f"connection still alive, got {data!r}"


def assert_refused(port: int) -> None:
    """A new connection to ``port`` fails: refused outright, or accepted and reset."""
    try:
        sock = connect(port)
    except OSError:
        return
    with sock:
        assert_dead(sock)


def roundtrip(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload


def test_bytes_pass_intact_and_are_counted(proxy: FaultProxy) -> None:
    payload = os.urandom(300_000)
    with connect(proxy.port) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        received = recv_exactly(sock, len(payload))
        sender.join(DEADLINE)
    assert received == payload
    assert proxy.connections_total == 1
    wait_for(lambda: proxy.bytes_forwarded == 2 * len(payload), 10, 0.01, what="bytes counted")


def test_cut_resets_existing_and_refuses_new_until_restore(proxy: FaultProxy) -> None:
    with connect(proxy.port) as sock:
        roundtrip(sock, b"before")
        proxy.cut()
        assert_dead(sock)
    assert_refused(proxy.port)
    assert proxy.connections_total == 1
    proxy.restore()
    with connect(proxy.port) as sock:
        roundtrip(sock, b"after")
    assert proxy.connections_total == 2


def test_stall_holds_data_and_restore_delivers_it_intact(proxy: FaultProxy) -> None:
    payload = os.urandom(2_000_000)  # more than the kernel buffers hold
    with connect(proxy.port) as sock:
        roundtrip(sock, b"warm-up")
        forwarded = proxy.bytes_forwarded
        proxy.stall()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert_silent(sock)
        assert proxy.bytes_forwarded == forwarded
        proxy.restore()
        received = recv_exactly(sock, len(payload))
        sender.join(DEADLINE)
        assert not sender.is_alive()
    assert received == payload


def test_stall_holds_each_direction_separately() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(DEADLINE)
        with FaultProxy("127.0.0.1", listener.getsockname()[1]) as proxy:
            client = connect(proxy.port)
            upstream, _ = listener.accept()
            with client, upstream:
                proxy.stall()
                upstream.sendall(b"push")  # server -> client
                client.sendall(b"pull")  # client -> server
                assert_silent(client)
                assert_silent(upstream, period=0.1)
                assert proxy.bytes_forwarded == 0
                proxy.restore()
                assert recv_exactly(client, 4) == b"push"
                assert recv_exactly(upstream, 4) == b"pull"


def test_slow_limits_the_rate(proxy: FaultProxy) -> None:
    rate = 20_000
    payload = os.urandom(40_000)  # ~2 s each way at this rate, pipelined through the echo
    with connect(proxy.port) as sock:
        roundtrip(sock, b"warm-up")
        proxy.slow(rate)
        started = time.monotonic()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        received = recv_exactly(sock, len(payload), deadline=30)
        elapsed = time.monotonic() - started
        sender.join(DEADLINE)
        assert received == payload
        assert elapsed >= 1.0, f"{len(payload)} bytes at {rate} B/s took only {elapsed:.2f}s"
        proxy.restore()
        started = time.monotonic()
        roundtrip(sock, payload)
        assert time.monotonic() - started < elapsed


def test_reset_all_resets_existing_but_new_connections_work(proxy: FaultProxy) -> None:
    first, second = connect(proxy.port), connect(proxy.port)
    with first, second:
        roundtrip(first, b"one")
        roundtrip(second, b"two")
        proxy.reset_all()
        assert_dead(first)
        assert_dead(second)
    with connect(proxy.port) as sock:
        roundtrip(sock, b"three")
    assert proxy.connections_total == 3


def test_half_close_is_propagated(proxy: FaultProxy) -> None:
    with connect(proxy.port) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert recv_exactly(sock, 10) == b"last words"
        sock.settimeout(DEADLINE)
        assert sock.recv(1) == b""


def test_unreachable_target_resets_the_client() -> None:
    dead_port = reserve_port()  # nobody listens there, and nobody else may take it
    with FaultProxy("127.0.0.1", dead_port) as proxy:
        try:
            sock = connect(proxy.port)
        except ConnectionResetError:
            pass  # reset before the handshake completed on this side: reset all the same
        else:
            with sock:
                assert_dead(sock)
        assert proxy.bytes_forwarded == 0


def proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fault-proxy")]


def test_stop_is_prompt_with_stalled_traffic(echo: EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port).start()
    socks = [connect(proxy.port) for _ in range(3)]
    try:
        for sock in socks:
            roundtrip(sock, b"hi")
        proxy.stall()
        for sock in socks:
            sock.sendall(b"stuck")
        assert proxy_threads()
        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < 2.5
        assert proxy_threads() == []
        for sock in socks:
            assert_dead(sock)
        assert_refused(proxy.port)
    finally:
        for sock in socks:
            sock.close()


def test_latency_delays_each_direction_and_keeps_the_bytes(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", echo.port, latency=0.1) as delayed:
        sock = connect(delayed.port)
        try:
            payload = os.urandom(200_000)
            start = time.monotonic()
            sock.sendall(b"x")
            assert recv_exactly(sock, 1) == b"x"
            assert time.monotonic() - start >= 0.2  # a round trip: twice the latency
            threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
            assert recv_exactly(sock, len(payload)) == payload
        finally:
            sock.close()


def test_reset_one_resets_one_connection_only(proxy: FaultProxy) -> None:
    a, b = connect(proxy.port), connect(proxy.port)
    try:
        for s in (a, b):
            s.sendall(b"hi")
            assert recv_exactly(s, 2) == b"hi"
        assert proxy.reset_one()
        wait_for(lambda: len([c for c in proxy._conns if not c.closed]) == 1, timeout=DEADLINE)
        alive = 0
        for s in (a, b):
            try:
                s.sendall(b"ok")
                alive += recv_exactly(s, 2, deadline=2.0) == b"ok"
            except (OSError, AssertionError):
                pass
        assert alive == 1
    finally:
        a.close()
        b.close()


def test_descriptors_past_select_s_limit_are_served() -> None:
    """A long test run holds many files open: the proxy's sockets then have descriptors
    past 1,024, which ``select()`` refuses (the proxy waits with ``poll``)."""
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        echo = EchoServer()
        try:
            with FaultProxy("127.0.0.1", echo.port) as high, connect(high.port) as sock:
                assert sock.fileno() > 1024
                sock.sendall(b"high descriptors")
                assert recv_exactly(sock, len(b"high descriptors")) == b"high descriptors"
        finally:
            echo.close()
    finally:
        for fd in filler:
            os.close(fd)
