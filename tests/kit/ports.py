"""Loopback ports from the OS, reserved so that no other process can take them.

A port is bound (never listened on) by a socket with ``SO_REUSEADDR`` and
``SO_REUSEPORT`` that stays open until the test process exits. The kernel
hands out neither a bound port to another ``bind(0)`` nor to an outgoing
connection, so the port stays free for the one server meant to use it: the
gRPC server (which sets both options) and the metrics endpoint (which sets
``SO_REUSEADDR``) may bind and listen on it while the reservation is held,
also when they are restarted after a kill. There is no window between
"found free" and "bound by the server" for another process to take it.
"""

from __future__ import annotations

import socket

_held: list[socket.socket] = []


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that stays reserved for this process's servers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    _held.append(sock)
    return int(sock.getsockname()[1])


def release_ports() -> None:
    """Close every reservation (at the end of the test session)."""
    while _held:
        _held.pop().close()
