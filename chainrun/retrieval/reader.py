"""Catalogue reads off the event loop: worker threads with their own SQLite connections.

A search's SQL (FTS5 bm25, the filter scan, sqlite-vec's cosine scan) and the NumPy
scan of the vector index take from a fraction of a millisecond on the 285-product sample
catalogue to tens of milliseconds on 100,000 products; on the event loop every other
turn's stream, timer and hedge waits for them (40 turns at once raised the
retrieve step's p90 from 28 ms to 590 ms). :class:`CatalogReader` runs such a read as
``fn(db)`` in one of a few worker threads, each holding its own connection to the same
file (a SQLite connection belongs to the thread that opened it; in WAL mode readers do
not block the log writer or one another). SQLite and NumPy release the GIL while they
work, so the loop keeps running meanwhile.

A database with no file (``:memory:``, as in unit tests) cannot be opened twice: reads
of it run inline on the loop, as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
import sqlite_utils.utils

logger = logging.getLogger(__name__)

__all__ = ["CatalogReader", "database_file", "open_connection", "reader_for"]

T = TypeVar("T")

#: worker threads per database file: two keep a slow scan from holding up a quick query
#: while leaving the second core to the loop (this kind of machine has two)
MAX_WORKERS = 2

_READERS: weakref.WeakKeyDictionary[sqlite_utils.Database, CatalogReader] = (
    weakref.WeakKeyDictionary()
)
_READERS_LOCK = threading.Lock()

#: bytes of the file a connection maps into memory instead of copying pages through
#: SQLite's page cache (2 MB by default): a vec0 KNN over 100,000 384-dimension vectors
#: took 47 ms with it vs 77 ms without (measured 2026-11-30; SQLite docs,
#: "Memory-Mapped I/O"). Address space, not memory: pages are the OS's file cache.
MMAP_SIZE = 1 << 30


def load_sqlite_vec(db: sqlite_utils.Database) -> bool:
    """Load sqlite-vec into ``db``'s connection if possible; True when ``vec_*`` work.

    False (not an error) when the ``sqlite-vec`` package is missing or the connection
    cannot load extensions (CPython's sqlite3 built without ``enable_load_extension``).
    """
    try:
        db.execute("select vec_version()").fetchone()
        return True
    except Exception:  # "no such function": not loaded yet (the error class is the driver's)
        pass
    try:
        import sqlite_vec  # type: ignore[import-not-found,unused-ignore]

        conn: Any = db.conn
        conn.enable_load_extension(True)
        try:
            sqlite_vec.load(conn)
        finally:
            conn.enable_load_extension(False)
        db.execute("select vec_version()").fetchone()
        return True
    except Exception as e:  # ImportError, AttributeError (no enable_load_extension), SQL errors
        logger.debug("sqlite-vec not available (%s); vector search uses NumPy", e)
        return False


def open_connection(path: Path, *, read_only: bool = False) -> sqlite_utils.Database:
    """A new connection to ``path`` with sqlite-vec loaded when it can be.

    Pragmas: ``busy_timeout`` 10 s, ``mmap_size`` :data:`MMAP_SIZE`, and ``query_only``
    when ``read_only``. Uses sqlite-utils' driver (pysqlite3 when installed, so that
    sqlite-vec can load); ``check_same_thread`` is off only so that ``close()`` may run
    on another thread than the one that used it.
    """
    conn = sqlite_utils.Database(
        sqlite_utils.utils.sqlite3.connect(str(path), check_same_thread=False)
    )
    conn.execute("pragma busy_timeout = 10000")
    conn.execute(f"pragma mmap_size = {MMAP_SIZE}")
    if read_only:
        conn.execute("pragma query_only = 1")
    load_sqlite_vec(conn)
    return conn


def database_file(db: sqlite_utils.Database) -> Path | None:
    """The file behind ``db``'s main database, or None for an in-memory one."""
    for row in db.execute("pragma database_list").fetchall():
        if row[1] == "main":
            return Path(row[2]) if row[2] else None
    return None


class CatalogReader:
    """Runs read-only ``fn(db)`` calls on worker threads, each with its own connection.

    Args:
        db: the loop's connection; its file is opened again per worker thread
            (:func:`open_connection`, read-only, with sqlite-vec when it loads).
        max_workers: threads (and connections) at most.

    ``fn`` must only read: the worker connections are ``query_only``.
    """

    def __init__(self, db: sqlite_utils.Database, *, max_workers: int = MAX_WORKERS) -> None:
        self.db = db
        self.path = database_file(db)
        self.max_workers = max_workers
        self._local = threading.local()
        self._executor: ThreadPoolExecutor | None = None
        self._connections: list[tuple[threading.Thread, sqlite_utils.Database]] = []
        self._lock = threading.Lock()

    @property
    def off_loop(self) -> bool:
        """Whether reads leave the loop (False for an in-memory database)."""
        return self.path is not None

    def _connection(self) -> sqlite_utils.Database:
        conn: sqlite_utils.Database | None = getattr(self._local, "db", None)
        if conn is None:
            assert self.path is not None
            conn = open_connection(self.path, read_only=True)
            self._local.db = conn
            with self._lock:
                self._connections.append((threading.current_thread(), conn))
        return conn

    def _call(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        return fn(self._connection())

    async def run(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """``fn(connection)`` on a worker thread (inline on the loop for ``:memory:``).

        Raises:
            Whatever ``fn`` raises.
        """
        if self.path is None:
            return fn(self.db)
        loop = asyncio.get_running_loop()
        with self._lock:  # submitted under the lock: close() cannot shut it down between
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.max_workers, thread_name_prefix=f"chainrun-catalog:{self.path.name}"
                )
            fut = loop.run_in_executor(self._executor, self._call, fn)
        return await fut

    def close(self) -> None:
        """Finish the reads in progress, stop the threads and close their connections.

        Blocks (call it from a thread, or at shutdown). A later :meth:`run` starts new
        threads.
        """
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        with self._lock:
            done = [(t, c) for t, c in self._connections if not t.is_alive()]
            self._connections = [(t, c) for t, c in self._connections if t.is_alive()]
        for _, conn in done:
            conn.close()


def reader_for(db: sqlite_utils.Database) -> CatalogReader:
    """The shared :class:`CatalogReader` of ``db`` (one per connection object)."""
    with _READERS_LOCK:
        reader = _READERS.get(db)
        if reader is None:
            reader = _READERS[db] = CatalogReader(db)
        return reader
