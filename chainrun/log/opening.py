"""Opening the log's databases: a SQLite file (WAL mode, one opener at a time, read-only
when this process cannot write it), a PostgreSQL database, and the SQLite file that holds
a PostgreSQL log's product catalogue (:data:`CATALOG_ENV`). :class:`chainrun.log.store.Store`
is the face that calls them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import sqlite_utils
from sqlite_utils.utils import sqlite3  # pysqlite3 when installed (sqlite-vec)

from chainrun.errors import UserInputError
from chainrun.log.backend import PgLogDb, is_postgres_url, open_pg_pool, shown_url
from chainrun.log.lifecycle import mark_interrupted_runs
from chainrun.log.migrations import MIGRATIONS, migrate
from chainrun.log.writer import JOURNAL_SIZE_LIMIT_BYTES, LogWriter

__all__ = [
    "CATALOG_ENV",
    "DEFAULT_CATALOG_DB",
    "PG_BLOCK",
    "PG_POOL_MAX",
    "catalog_path",
    "file_id",
    "open_catalog",
    "open_postgres_log",
    "open_read_only",
    "open_sqlite_file",
    "remove_unused_log",
]

CATALOG_ENV = "CHAINRUN_CATALOG_DB"
DEFAULT_CATALOG_DB = "chainrun-catalog.db"
#: turn ids one process reserves at once on PostgreSQL: the next block is fetched when
#: half is used, so a process keeps answering (and numbering) 2,048 turns while the
#: database is unreachable before a turn waits for an id
PG_BLOCK = 4096
#: connections a PostgreSQL log's pool holds at most (the writer thread, the readers)
PG_POOL_MAX = 4


def _bind_null(value: None) -> None:
    return None


# pysqlite3 (as CPython's sqlite3 before 3.11) adapts every parameter that is not exactly
# an int, float or str: for a None or a bool without a registered adapter it probes
# ``__adapt__`` and ``__conform__`` with getattr, each probe an AttributeError built and
# dropped while holding the GIL (callgrind: ~5,000 instructions per probe, a fifth of a
# turn's write; ~1 us per None or bool bound). A registered adapter ends the lookup at
# once; what is bound is unchanged: None is NULL (unknown stays NULL, never 0), a bool
# the integer 0 or 1 it was bound as before (bool is an int).
sqlite3.register_adapter(type(None), _bind_null)
sqlite3.register_adapter(bool, int)


def catalog_path() -> Path:
    """The SQLite file of a PostgreSQL log's product catalogue (:data:`CATALOG_ENV`)."""
    return Path(os.environ.get(CATALOG_ENV) or DEFAULT_CATALOG_DB)


def open_catalog(path: Path) -> sqlite_utils.Database:
    """The catalogue file of a PostgreSQL log at ``path`` (:func:`catalog_path`), opened,
    created and migrated as a SQLite log is (:func:`open_sqlite_file`).

    Raises:
        UserInputError: its directory does not exist; it is a directory; or as
            :func:`open_sqlite_file`.
    """
    if not path.parent.is_dir():
        raise UserInputError(f"{CATALOG_ENV}={path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise UserInputError(f"{CATALOG_ENV}={path}: is a directory (expected a file)")
    return open_sqlite_file(path, f"{CATALOG_ENV}={path}")


def open_sqlite_file(p: Path, path: str | Path) -> sqlite_utils.Database:
    """Open (creating, switching to WAL and migrating if needed) the SQLite file ``p``
    (``path`` as the user named it, for messages): a SQLite log, or a PostgreSQL log's
    catalogue file (:attr:`db`).

    One opener at a time per directory, across processes: two openers of a new file
    (two commands, or the workers of ``chainrun serve --workers N`` opening their
    catalogue together) would otherwise race to switch it to WAL, and the loser gets
    "database is locked" at once (SQLite does not wait on its busy timeout for a lock
    it would deadlock on), or both apply the same migrations. The lock is a flock on
    the *directory*, never an fd on the file: closing any fd of the log file drops
    every POSIX lock this process holds on it, SQLite's included, and another
    process's reader then thinks it is the last one, checkpoints and deletes the WAL
    under our open connection (SQLite, "How To Corrupt An SQLite Database File",
    2.2), losing committed turns.

    Raises:
        UserInputError: the file or its directory is not writable; another process
            holds the file locked past the busy timeout; the file is not SQLite, or
            is a SQLite database of something else.
    """
    try:
        dir_fd = os.open(p.parent, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            return _open_file(p, path)
        finally:
            os.close(dir_fd)  # releases the flock
    except sqlite3.OperationalError as e:
        if not os.access(p.parent, os.W_OK):
            raise UserInputError(
                f"{path}: cannot write the log: the directory {p.parent} is not writable "
                f"(a WAL log creates its -wal and -shm files there) ({e})"
            ) from None
        if "readonly" in str(e) or (p.exists() and not os.access(p, os.W_OK)):
            raise UserInputError(f"{path}: cannot write the log: the file is read-only "
                                 f"({e})") from None  # fmt: skip
        if "locked" in str(e):  # held by another process past the busy timeout
            raise UserInputError(f"{path}: cannot open: another process holds the file "
                                 f"locked ({e})") from None  # fmt: skip
        raise UserInputError(f"{path}: not a chainrun log database ({e})") from None
    except sqlite3.DatabaseError as e:
        raise UserInputError(f"{path}: not a chainrun log database ({e})") from None


def open_postgres_log(url: str, *, create: bool = True) -> tuple[PgLogDb, LogWriter]:
    """The PostgreSQL log at ``url`` migrated, its dead runs marked, and the writer thread
    on a connection of its own (:meth:`chainrun.log.store.Store.open_postgres` says what
    the role needs).

    Raises:
        UserInputError: as :meth:`chainrun.log.store.Store.open_postgres`.
    """
    shown = shown_url(url)
    # the pool first: without psycopg it is one line naming the extra to install
    log = PgLogDb(url, open_pg_pool(url, max_size=PG_POOL_MAX))
    import psycopg  # only a PostgreSQL log loads the driver
    try:
        if not create and "_migrations" not in log.table_names():
            raise UserInputError(f"{shown}: no chainrun log in this database (run a replay "
                                 "or a turn first)")  # fmt: skip
        migrate(log)
        mark_interrupted_runs(log)
    except psycopg.Error as e:
        log.close()
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserInputError(f"{shown}: cannot open the log ({first})") from None
    except BaseException:
        log.close()
        raise
    # the writer's own connection: after an outage it reconnects at its next retry
    writer = LogWriter(None, connect=log.dedicated, name=shown, network=True)
    return log, writer


def open_read_only(p: Path, path: str | Path) -> sqlite_utils.Database:
    """Open a log this process cannot write, for reading only.

    A WAL log needs its ``-shm`` index file beside it, created by the first reader.
    When the directory is writable (only the file is not), SQLite's ``mode=ro`` does
    that. When it is not, the file is opened with ``immutable=1`` (SQLite, "URI
    filenames", immutable): no locks, no ``-shm``, and SQLite then reads the main file
    only, so caveat: (a) a ``-wal`` or ``-journal`` file beside it holds changes that
    would be ignored, and the log is refused instead of shown stale; (b) a process
    writing the log at the same time would not be seen (one cannot: writing needs
    the directory writable for its ``-wal``).

    Raises:
        UserInputError: a ``-wal``/``-journal`` file with changes sits beside a log in
            a directory that is not writable; the log is not chainrun's; or it needs
            a migration (which writes) to be read by this version.
        sqlite3.DatabaseError: the file is not SQLite.
    """
    dir_writable = os.access(p.parent, os.W_OK)
    if not dir_writable:
        for suffix in ("-wal", "-journal"):
            side = p.with_name(p.name + suffix)
            if side.exists() and side.stat().st_size > 0:
                raise UserInputError(
                    f"{path}: cannot read: the directory {p.parent} is not writable, and "
                    f"{side.name} holds changes not yet in the log file (SQLite must "
                    f"create {p.name}-shm in that directory to read them); make the "
                    "directory writable, or copy the log with its -wal file elsewhere"
                )
    mode = "ro" if dir_writable else "ro&immutable=1"
    conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode={mode}", uri=True)
    db = sqlite_utils.Database(conn)
    try:
        tables = db.table_names()
        if "_migrations" not in tables:
            raise UserInputError(
                f"{path}: a SQLite database of something else (no chainrun _migrations "
                "table); use another --db"
            )
        done = {r[0] for r in db.execute("select name from _migrations")}
        missing = [name for name, _ in MIGRATIONS if name not in done]
        if missing:
            raise UserInputError(
                f"{path}: written by an older chainrun; reading it needs {len(missing)} "
                "migration(s), which write it, and it is not writable here"
            )
    except BaseException:
        db.close()
        raise
    return db


def _open_file(p: Path, path: str | Path) -> sqlite_utils.Database:
    db = sqlite_utils.Database(str(p))
    try:
        tables = db.table_names()
        if tables and "_migrations" not in tables:
            db.close()
            raise UserInputError(
                f"{path}: a SQLite database of something else (no chainrun _migrations "
                "table); use another --db"
            )
        db.enable_wal()
        # With WAL, NORMAL syncs at checkpoints instead of every commit: a commit
        # no longer waits for an fsync on the event loop (a power loss may drop
        # the last turns; the database stays consistent). SQLite docs, "WAL mode".
        db.execute("pragma synchronous = normal")
        db.execute("pragma busy_timeout = 10000")  # concurrent commands wait, not fail
        # a checkpointed WAL is truncated to this (SQLite keeps its size otherwise)
        db.execute(f"pragma journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")
        migrate(db)
        mark_interrupted_runs(db)
    except BaseException:
        db.close()
        raise
    return db


def file_id(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path`` (None: no file there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def remove_unused_log(path: str | Path) -> bool:
    """Delete a log file that holds no run, with its ``-wal`` and ``-shm`` files.

    For a command that created a new log and then failed before starting a run (a config
    error found while building the chain, an unreachable provider): "bad input loses
    nothing and leaves nothing half-written". A file with a run in it is kept (an
    interrupted replay is resumed from it). Returns True if the file was removed; a file
    that is not a readable log is left alone (False).
    """
    if is_postgres_url(path):
        return False  # a database on a server is never removed
    p = Path(path)
    if str(path) == ":memory:" or not p.is_file():
        return False
    try:
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            has_table = conn.execute(
                "select 1 from sqlite_master where type = 'table' and name = 'runs'"
            ).fetchone()
            n_runs = conn.execute("select count(*) from runs").fetchone()[0] if has_table else 0
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False
    if n_runs:
        return False
    for suffix in ("", "-wal", "-shm"):
        Path(f"{p}{suffix}").unlink(missing_ok=True)
    return True
