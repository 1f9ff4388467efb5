"""Repro: back-to-back requests on one keep-alive connection to the lab took ~44 ms.

Before commit abe3a47 ``chainrun/lab/server.py`` created its listening socket with
``socket.socket(family, socket.SOCK_STREAM)`` (proto 0). asyncio sets TCP_NODELAY on an
accepted socket only when ``sock.proto == IPPROTO_TCP``, so the lab's connections kept
Nagle on: a response written in two sends (headers, body) waited for the client's
delayed ACK (40 ms on Linux). This compares the lab as shipped with the same server
forced back to proto 0.

Run: ``python benchmarks/repro/lab_nodelay.py``.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time

from chainrun.lab import LabServer

OLD_SERVER = """
import socket, sys
import chainrun.lab.server as server

class TCPSocket(socket.socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and type == socket.SOCK_STREAM:
            proto = 0  # as before abe3a47
        super().__init__(family, type, proto, fileno)

class Shim:
    def __getattr__(self, name):
        return TCPSocket if name == "socket" else getattr(socket, name)

server.socket = Shim()
server.serve("fast", "127.0.0.1", int(sys.argv[1]))
"""


def back_to_back_ms(port: int, n: int = 20) -> float:
    """Median time of ``n`` GET /health sent one after another on one connection."""
    times = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(b"GET /health HTTP/1.1\r\nHost: lab\r\n\r\n")
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += s.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += s.recv(65536)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    with LabServer("fast") as lab:
        print(f"lab as shipped:                 median {back_to_back_ms(lab.port):6.1f} ms")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", OLD_SERVER, str(port)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        print(f"listening socket proto 0 (old): median {back_to_back_ms(port):6.1f} ms")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
