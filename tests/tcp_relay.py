"""A TCP relay for tests: a loopback port that forwards every connection to a server, and
can be cut (every relayed connection closed, new ones refused) and opened again, as a
pooler's restart (PgBouncer killed and started again) does to its clients."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


class Relay:
    """Forwards connections on ``127.0.0.1:port`` to ``(host, target_port)``, one thread
    per direction; listening from construction until :meth:`close`.

    Attributes:
        port: the relay's own port (a free one, kept through :meth:`cut` and :meth:`open`).
        relayed: connections relayed so far.
    """

    def __init__(self, host: str, target_port: int) -> None:
        self.target = (host, target_port)
        self.relayed = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self.port = 0
        self.open()

    def open(self) -> None:
        """Listen (again) on the relay's port."""
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(64)
        lst.settimeout(0.05)
        self.port = lst.getsockname()[1]
        self._listener = lst
        self._accepting = threading.Thread(target=self._accept, args=(lst,), daemon=True)
        self._accepting.start()

    def cut(self) -> None:
        """Stop listening (a connection attempt is refused) and close every relayed
        connection (their clients see the server gone)."""
        lst, self._listener = self._listener, None
        if lst is not None:
            lst.close()
        if self._accepting is not None:
            self._accepting.join(timeout=5)
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def close(self) -> None:
        self.cut()

    def _accept(self, lst: socket.socket) -> None:
        while self._listener is lst:
            try:
                client, _ = lst.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._conns |= {client, upstream}
                self.relayed += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
