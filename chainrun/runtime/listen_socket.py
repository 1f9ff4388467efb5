"""A listening TCP socket for chainrun's HTTP servers (the latency lab, ``chainrun serve``)."""

from __future__ import annotations

import socket

from chainrun.errors import UserInputError

#: pending connections the kernel queues before the server accepts them
BACKLOG = 2048


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one) and already listening.

    Created with ``IPPROTO_TCP`` so that asyncio sets TCP_NODELAY on accepted
    connections (without it Nagle holds a response written in two sends until the
    delayed ACK, 40 ms). Listening at once means a client told the port can connect
    before the server's loop runs: its connection waits in the backlog.

    Raises:
        UserInputError: the address cannot be bound (in use, not local, bad name).
    """
    bind_host = "127.0.0.1" if host == "localhost" else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind_host, port))
    except OSError as e:
        sock.close()
        raise UserInputError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    sock.listen(BACKLOG)
    return sock
