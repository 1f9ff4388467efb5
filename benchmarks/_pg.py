"""A private PostgreSQL cluster for a benchmark or a test: Debian's ``postgresql`` package,
a fresh data directory, a free loopback port, stopped and removed at the end.

The server refuses to run as root, so as root it runs as the ``postgres`` user the
package creates (``runuser``); as another user, as that user. Its socket directory is
the data directory's parent, so it never touches /var/run/postgresql.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/N/bin`` that has ``initdb``, or None."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    found = sorted((p for p in root.iterdir() if (p / "bin" / "initdb").exists()),
                   key=lambda p: int(p.name) if p.name.isdigit() else 0)  # fmt: skip
    return found[-1] / "bin" if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """``initdb`` + ``pg_ctl start`` in a new temporary directory (trust auth, loopback).

    Attributes:
        url: ``postgresql://postgres@127.0.0.1:PORT/postgres``.

    Raises:
        RuntimeError: no PostgreSQL binaries, or initdb/pg_ctl failed (its output in the
            message).
    """

    def __init__(self, *, fsync: bool = True) -> None:
        binary = pg_bin()
        if binary is None:
            raise RuntimeError("no PostgreSQL server binaries (apt-get install postgresql)")
        self.bin = binary
        self.dir = Path(tempfile.mkdtemp(prefix="chainrun-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.fsync = fsync
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync")  # fmt: skip

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self._as, str(self.bin / tool), *args], capture_output=True,
                              text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=200")  # fmt: skip
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"),
                  "-w", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect every client, as a failover or a restart
        does to them)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def wait_down(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.05)

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
