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


class PrivateBouncer:
    """Debian's ``pgbouncer`` in transaction mode in front of ``cluster`` (the many-processes
    guide's settings), on a free loopback port; as root it runs as ``postgres`` (it
    refuses root). Any database name is passed through to the cluster.

    Attributes:
        port: its port; :meth:`url` gives a DSN through it.
        ini, pidfile: its files (for :meth:`restart`, or a restart command of your own).

    Raises:
        RuntimeError: no ``pgbouncer`` binary, or it did not start.
    """

    def __init__(self, cluster: PrivateCluster) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("no pgbouncer binary (apt-get install pgbouncer)")
        self.binary = binary
        self.dir = cluster.dir
        self.port = free_port()
        self.ini = self.dir / "pgbouncer.ini"
        self.pidfile = self.dir / "pgbouncer.pid"
        self.ini.write_text(
            f"[databases]\n* = host=127.0.0.1 port={cluster.port} user=postgres\n\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.dir}\nauth_type = any\npool_mode = transaction\n"
            "max_client_conn = 1000\ndefault_pool_size = 20\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\npidfile = {self.pidfile}\n",
            encoding="utf-8",
        )
        self._as = cluster._as
        if self._as:
            shutil.chown(self.ini, "postgres")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        done = subprocess.run([*self._as, self.binary, "-d", str(self.ini)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pgbouncer failed ({done.returncode}): {done.stdout}{done.stderr}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("pgbouncer did not listen within 10 s")

    def stop(self) -> None:
        """SIGTERM to it (every client connection closed), and wait until it is gone."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, 15)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.02)

    def restart(self) -> None:
        """``kill $(cat PIDFILE); runuser -u postgres -- pgbouncer -d INI``."""
        self.stop()
        self.start()

    def __enter__(self) -> PrivateBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
