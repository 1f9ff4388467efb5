"""The run log: a SQLite file (WAL mode) or a PostgreSQL database, the same on both.

Tables: ``runs`` → ``turns`` → ``steps`` and ``calls`` (one row per model call
attempt), each written and read as a typed row model of :mod:`chainrun.log.rows`.
Schema changes are the numbered migrations of :mod:`chainrun.log.migrations`, applied
once each on open and recorded in ``_migrations`` (the pattern of simonw/llm), one list
for both databases. Prompts and outputs are stored; API keys never are (the config
snapshot holds only the *name* of the key's environment variable).

``Store.open(target)`` takes a file path (SQLite) or a ``postgresql://`` URL
(:mod:`chainrun.log.backend`); every query goes through the store's :class:`LogDb`
(``store.log``). ``store.db`` is the SQLite database that holds the product catalogue:
the log itself for a SQLite log; for a PostgreSQL log a SQLite file of its own
(:data:`CATALOG_ENV`, default ``chainrun-catalog.db``), since the catalogue's search
runs on SQLite's FTS5 and sqlite-vec.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from sqlite_utils.utils import sqlite3  # pysqlite3 when installed (sqlite-vec)

from chainrun.errors import LogWriteError, LostTurn, UserInputError
from chainrun.log.backend import (
    LogDb,
    PgLogDb,
    SqliteLogDb,
    is_postgres_url,
    open_pg_pool,
    shown_url,
)
from chainrun.log.migrations import MIGRATIONS, migrate, utc_now
from chainrun.log.redaction import Redactor, redact_calls, redact_turn
from chainrun.log.rows import (
    WINNER_OUTCOMES,
    CallRow,
    RunKind,
    RunRow,
    RunStatus,
    StepRow,
    ToolCallRow,
    TurnLog,
    TurnRow,
)
from chainrun.log.turn_ids import BLOCK, TurnIds, release
from chainrun.log.writer import JOURNAL_SIZE_LIMIT_BYTES, LogWriter
from chainrun.runtime.processes import pid_exists

__all__ = [
    "CATALOG_ENV",
    "DEFAULT_DB",
    "SeedWindows",
    "Store",
    "log_time",
    "log_window",
    "migrate",
    "remove_unused_log",
    "utc_now",
]

T = TypeVar("T")
DEFAULT_DB = "chainrun.db"
#: where the product catalogue of a PostgreSQL log is kept (a SQLite file)
CATALOG_ENV = "CHAINRUN_CATALOG_DB"
DEFAULT_CATALOG_DB = "chainrun-catalog.db"
#: turn ids one process reserves at once on PostgreSQL: the next block is fetched when
#: half is used, so a process keeps answering (and numbering) 2,048 turns while the
#: database is unreachable before a turn waits for an id
PG_BLOCK = 4096
#: connections a PostgreSQL log's pool holds at most (the writer thread, the readers)
PG_POOL_MAX = 4
logger = logging.getLogger("chainrun.log.store")


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


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: count fields after its closing ")"
    return stat[stat.rfind(")") + 2 :].split()[19]


def writer_identity() -> dict[str, Any]:
    """Who writes a run: host, pid and the process's start time (so that a reused pid is
    not mistaken for the writer). Stored in ``runs.meta["writer"]``."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def writer_alive(writer: dict[str, Any] | None) -> bool:
    """Whether the process that wrote a run may still be writing it. A writer on another
    host (a log on a shared disk) counts as alive: it cannot be checked from here."""
    if not writer or writer.get("host") != socket.gethostname():
        return True
    pid = writer.get("pid")
    if not isinstance(pid, int):
        return True
    start = _process_start(pid)
    if start is None:
        return pid_exists(pid) and writer.get("start") is None
    return writer.get("start") in (None, start)


def mark_interrupted_runs(db: LogDb | sqlite_utils.Database) -> list[int]:
    """Mark ``interrupted`` every run still ``running`` whose writing process is gone
    (killed with SIGKILL, the machine lost power): the next open of the log tells the
    truth instead of leaving it ``running``. Its committed turns are kept as they are.
    A writer on another host counts as alive (see :func:`writer_alive`). Returns the ids
    marked."""
    log = db if isinstance(db, LogDb) else SqliteLogDb(db)
    marked: list[int] = []
    for run_id, raw in log.execute("select id, meta from runs where status = 'running'"):
        try:
            meta = json.loads(raw) if raw else {}
        except ValueError:
            meta = {}
        if writer_alive(meta.get("writer") if isinstance(meta, dict) else None):
            continue
        with log.transaction():
            n = log.scalar("select count(*) from turns where run_id = ?", [run_id])
            log.execute(
                "update runs set status = 'interrupted', ended_at = ?, n_turns = ? "
                "where id = ? and status = 'running'",
                [utc_now(), n, run_id],
            )
        marked.append(run_id)
    return marked


def catalog_path() -> Path:
    """The SQLite file of a PostgreSQL log's product catalogue (:data:`CATALOG_ENV`)."""
    return Path(os.environ.get(CATALOG_ENV) or DEFAULT_CATALOG_DB)


class Store:
    """The run log. Open with :meth:`open`; use as a context manager to close it.

    A file or PostgreSQL log writes turns from the event loop through :meth:`alog_turn`
    on a writer thread (:mod:`chainrun.log.writer`), without waiting for the commit
    unless asked (``durable=True``); a turn's id is known at once, from a block of ids
    this process reserved in the log (:mod:`chainrun.log.turn_ids`). Readers in the
    same process :meth:`flush` first (``Chain.aclose`` does). An in-memory log (one
    connection, not shareable across threads) writes turns inline.

    Args:
        db: the log's database: a :class:`LogDb`, or a sqlite-utils ``Database``.
        path: the SQLite file (None: in memory, or PostgreSQL).
        url: the PostgreSQL URL (None: SQLite).
        writer: the writer thread (default: one on ``path`` for a SQLite file).
        block: turn ids reserved at once.
    """

    def __init__(
        self,
        db: LogDb | sqlite_utils.Database,
        path: Path | None = None,
        *,
        url: str | None = None,
        writer: LogWriter | None = None,
        block: int = BLOCK,
    ) -> None:
        self.log: LogDb = db if isinstance(db, LogDb) else SqliteLogDb(db)
        self._catalog: sqlite_utils.Database | None = (
            self.log.db if isinstance(self.log, SqliteLogDb) else None
        )
        #: masks personal data in what is logged (the chain sets it from ``[log] redact``)
        self.redactor: Redactor | None = None
        self.path = path
        self.url = url
        #: a PostgreSQL log's catalogue file (None: :func:`catalog_path`)
        self.catalog_file: Path | None = None
        if writer is None and path is not None:
            writer = LogWriter(path)
        self.writer: LogWriter | None = writer
        #: the (device, inode) of the SQLite file as opened (None: in memory, PostgreSQL)
        self._file_id = _file_id(path) if path is not None else None
        self._ids = TurnIds(self._reserve_on_writer, self._reserve_here, block=block)

    @property
    def db(self) -> sqlite_utils.Database:
        """The SQLite database holding the product catalogue: the log itself for a SQLite
        log; for a PostgreSQL log the file :func:`catalog_path` names (opened, created
        and migrated at first use)."""
        if self._catalog is None:
            path = self.catalog_file or catalog_path()
            if not path.parent.is_dir():
                raise UserInputError(
                    f"{CATALOG_ENV}={path}: directory {path.parent} does not exist"
                )
            if path.is_dir():
                raise UserInputError(f"{CATALOG_ENV}={path}: is a directory (expected a file)")
            self._catalog = Store._open_sqlite_file(path, f"{CATALOG_ENV}={path}")
        return self._catalog

    def file_gone(self) -> bool:
        """Whether a SQLite log's file was deleted, or replaced by another file, since
        this store opened it (False in memory and on PostgreSQL). SQLite says nothing
        then: its connections go on writing to the deleted file, which disappears with
        them when they close, so whatever was written to it is lost (one ``stat``, a few
        µs: cheap enough to ask after every turn)."""
        if self._file_id is None or self.path is None:
            return False
        return _file_id(self.path) != self._file_id

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.log.dialect

    @property
    def name(self) -> str:
        """The log as a user names it: its path, or its URL without a password."""
        if self.url is not None:
            return shown_url(self.url)
        return str(self.path) if self.path is not None else ":memory:"

    def _reserve_on_writer(self, job: Callable[[LogDb], Any]) -> Any:
        assert self.writer is not None
        return self.writer.future(job)

    def _reserve_here(self, job: Callable[[LogDb], Any]) -> Any:
        with self.log.transaction():
            return job(self.log)

    @classmethod
    def open(cls, path: str | Path = DEFAULT_DB, *, create: bool = True) -> Store:
        """Open (creating and migrating if needed) the log at ``path``; ``":memory:"`` works,
        and so does a ``postgresql://USER@HOST:PORT/DB`` URL (see :meth:`open_postgres`).

        Args:
            create: False for read-only commands: a missing file is an error, not a new log.

        A log that this process cannot write (``create`` False; the file, or its
        directory, not writable: a read-only mount, ``chattr +i``, another user's
        directory) is opened read-only, with no migration and no marking of dead runs;
        see :meth:`_open_read_only`. A write through it then fails with
        ``sqlite3.OperationalError`` (attempt to write a readonly database).

        Raises:
            UserInputError: the directory does not exist; ``create`` is False and the file
                does not exist; the file is not SQLite; or it is a SQLite database of
                something else (tables but no chainrun ``_migrations``), which is left as is;
                or it cannot be read read-only (see :meth:`_open_read_only`).
        """
        if is_postgres_url(path):
            return cls.open_postgres(str(path), create=create)
        if str(path) == ":memory:":
            db = sqlite_utils.Database(memory=True)
            migrate(db)
            return cls(db)
        p = Path(path)
        if not p.parent.is_dir():
            raise UserInputError(f"{path}: directory {p.parent} does not exist")
        if not create and not p.exists():
            raise UserInputError(f"{path}: no such log (run a replay or a turn first)")
        if p.is_dir():
            raise UserInputError(f"{path}: is a directory (expected a log file)")
        if not create and not (os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)):
            try:
                return cls(cls._open_read_only(p, path), p)
            except sqlite3.DatabaseError as e:
                raise UserInputError(f"{path}: not a chainrun log database ({e})") from None
        return cls(cls._open_sqlite_file(p, path), p)

    @classmethod
    def _open_sqlite_file(cls, p: Path, path: str | Path) -> sqlite_utils.Database:
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
                return cls._open_file(p, path)
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

    @classmethod
    def open_postgres(cls, url: str, *, create: bool = True) -> Store:
        """Open the log in the PostgreSQL database at ``url`` (a libpq URI; its
        ``options=-csearch_path=SCHEMA`` parameter picks a schema), migrating it if
        needed (one process at a time: an advisory lock), and mark dead runs.

        The role needs CONNECT on the database and USAGE and CREATE on the schema (the
        migrations create the tables), then SELECT, INSERT, UPDATE on the tables and
        USAGE on their sequences. Writes go through a writer thread whose batches are
        retried while the server cannot be reached (see :mod:`chainrun.log.writer`).

        Raises:
            UserInputError: psycopg is not installed; the server cannot be reached or
                refuses the role or database; ``create`` is False and the database holds
                no chainrun log; the role may not create the log's tables.
        """
        import psycopg  # only a PostgreSQL log loads the driver

        shown = shown_url(url)
        log = PgLogDb(url, open_pg_pool(url, max_size=PG_POOL_MAX))
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
        return cls(log, url=url, writer=writer, block=PG_BLOCK)

    @staticmethod
    def _open_read_only(p: Path, path: str | Path) -> sqlite_utils.Database:
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

    @staticmethod
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

    def close(self) -> None:
        """Commit queued writes, stop the writer thread, give back the turn ids reserved
        and not used (when no other process reserved after them), close the connections."""
        if self.writer is not None:
            self.writer.close()
        tail = self._ids.unused_tail()
        if tail is not None:
            try:
                if isinstance(self.log, SqliteLogDb):
                    self.log.execute("pragma busy_timeout = 200")  # a gap beats a slow close
                with self.log.transaction():
                    release(self.log, *tail)
            except Exception:  # another process holds the lock, the server is away: a gap
                pass
        if self._catalog is not None and not isinstance(self.log, SqliteLogDb):
            self._catalog.close()
        self.log.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction on the log (nested: a savepoint)."""
        with self.log.transaction():
            yield

    # -- runs -------------------------------------------------------------------------
    def create_run(
        self,
        kind: RunKind,
        config_snapshot: str,
        label: str | None = None,
        source: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Insert a run with status ``running``; returns its id (committed). Blocks the
        caller for the write (up to the 10 s busy timeout while another connection
        writes): from a coroutine use :meth:`acreate_run`."""
        run = _new_run(kind, config_snapshot, label, source, meta)
        with self.log.transaction():
            return _insert_run(self.log, run)

    async def acreate_run(
        self,
        kind: RunKind,
        config_snapshot: str,
        label: str | None = None,
        source: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """:meth:`create_run` off the event loop: on the writer thread for a file or
        PostgreSQL log (in its queue order, so after every turn queued before it), inline
        for an in-memory log. Returns the run's id once the run is committed, as
        :meth:`create_run` does. A cancelled caller stops waiting; the run is created all
        the same.

        Raises:
            Whatever the insert raised (e.g. ``sqlite3.OperationalError`` once the
            busy timeout ran out), or ``RuntimeError`` when the writer is closed.
        """
        if self.writer is None:
            return self.create_run(kind, config_snapshot, label, source, meta)
        run = _new_run(kind, config_snapshot, label, source, meta)
        run_id = await self.writer.submit(lambda db: _insert_run(db, run))
        self._ids.prefetch()  # turn ids before the first turn needs them
        return run_id

    def resume_run(self, run_id: int) -> None:
        """Mark an ended run ``running`` again, written by this process (``--resume``)."""
        meta = dict(self.get_run(run_id).meta or {})
        meta["writer"] = writer_identity()
        meta["resumed"] = [*meta.get("resumed", []), utc_now()]
        with self.log.transaction():
            self.log.execute(
                "update runs set status = 'running', ended_at = null, meta = ? where id = ?",
                [json.dumps(meta), run_id],
            )

    def finish_run(self, run_id: int, status: RunStatus) -> None:
        """Mark a run ended with ``status`` and store its turn count."""
        with self.log.transaction():
            n = self.log.scalar("select count(*) from turns where run_id = ?", [run_id])
            self.log.execute(
                "update runs set status = ?, ended_at = ?, n_turns = ? where id = ?",
                [status, utc_now(), n, run_id],
            )

    async def afinish_run(self, run_id: int, status: RunStatus) -> bool:
        """:meth:`finish_run` off the event loop (on the writer thread for a file or
        PostgreSQL log, after every write queued before it, so the turn count holds
        them), only if the run is still ``running``; returns whether it was.

        Raises:
            Whatever the update raised, or ``RuntimeError`` when the writer is closed.
        """
        if self.writer is None:
            if self.get_run(run_id).status != "running":
                return False
            self.finish_run(run_id, status)
            return True
        ended_at = utc_now()
        return await self.writer.submit(lambda db: _finish_run(db, run_id, status, ended_at))

    def get_run(self, run_id: int) -> RunRow:
        """The run ``run_id``.

        Raises:
            UserInputError: no such run.
        """
        if not 0 < run_id < 2**63:
            raise UserInputError(f"run {run_id}: no such run in this log")
        rows = self.log.query("select * from runs where id = ?", [run_id])
        if not rows:
            raise UserInputError(f"run {run_id}: no such run in this log")
        return RunRow.from_db(rows[0])

    def latest_run_id(self, kind: str | None = None) -> int | None:
        """The newest run's id (of ``kind`` when given), or None in an empty log."""
        where = "where kind = ?" if kind else ""
        return self.log.scalar(f"select max(id) from runs {where}", [kind] if kind else [])

    def count_runs(self) -> int:
        """How many runs the log holds."""
        return int(self.log.scalar("select count(*) from runs") or 0)

    def list_runs(
        self, limit: int = 50, *, since: str | None = None, until: str | None = None
    ) -> list[RunRow]:
        """The newest ``limit`` runs, newest first; with ``since``/``until`` (ISO-8601 UTC
        as the log writes it, see :func:`log_time`) only the runs that were running at
        some time in ``[since, until)``.

        ``n_turns`` of a run still running (a live ``chainrun serve`` run, a replay in
        progress) is the count of its turns logged so far; an ended run's is the count
        stored when it ended.
        """
        where, params = [], []
        if since is not None:
            where.append("(ended_at is null or ended_at >= ?)")
            params.append(since)
        if until is not None:
            where.append("started_at < ?")
            params.append(until)
        sql = "select * from runs"
        if where:
            sql += " where " + " and ".join(where)
        rows = [RunRow.from_db(r) for r in self.log.query(f"{sql} order by id desc limit ?",
                                                          [*params, limit])]  # fmt: skip
        for row in rows:
            if row.status == "running":
                row.n_turns = self.log.scalar(
                    "select count(*) from turns where run_id = ?", [row.id]
                )
        return rows

    # -- turns, steps, calls -------------------------------------------------------------
    def log_turn(self, run_id: int, log: TurnLog) -> int:
        """Write a turn with its steps and calls in one transaction (a process killed
        mid-write leaves all of it or none), on this thread; returns the turn id.
        ``redactor`` masks personal data in the texts first (``[log] redact``)."""
        if self.redactor:
            redact_turn(log, self.redactor)
        # an id reserved at the turn's start (areserve_turn_id), else the next one
        turn_id = log.turn.id if log.turn.id is not None else self._ids.take_sync()
        write = _prepare_turn(run_id, log, turn_id, self.log.dialect)
        with self.log.transaction():
            return write(self.log)

    async def areserve_turn_id(self) -> int:
        """A turn id for a turn about to run, known before its row is written (a turn with
        tools needs it for its idempotency keys); give it to :meth:`alog_turn`.

        Raises:
            Whatever the id reservation raised (the log could not be written).
        """
        if self.writer is None:
            return self._ids.take_sync()
        return await self._ids.take()

    async def alog_turn(self, run_id: int, log: TurnLog, *, durable: bool = False) -> int:
        """:meth:`log_turn` off the event loop (on the writer thread for a file or
        PostgreSQL log); returns the turn's id once its rows are queued (``durable``:
        once committed).

        The id comes from this process's reserved block (an await on the writer only
        when the block runs out, once per ``block`` turns at most).
        Without ``durable`` the rows are built and redacted on the loop's next turn,
        after this returns (:meth:`chainrun.log.writer.LogWriter.post_later`), so ``log``
        must not change afterwards; a reader sees the turn after :meth:`flush`; a failed
        write is logged and raised by the next :meth:`flush`. Cancelling the caller does
        not cancel the write.

        Raises:
            Whatever the write raised (``durable``), or the id reservation raised.
        """
        if self.writer is None:
            return self.log_turn(run_id, log)
        turn_id = log.turn.id if log.turn.id is not None else await self._ids.take()
        redactor = self.redactor
        dialect = self.log.dialect

        def build() -> Callable[[LogDb], int]:
            if redactor:
                redact_turn(log, redactor)
            return _prepare_turn(run_id, log, turn_id, dialect)

        if durable:
            return await self.writer.submit(build())
        label = {"turn_id": turn_id, "request_id": log.turn.request_id, "run_id": run_id}
        await self.writer.post_later(build, label)
        return turn_id

    def update_step_calls(
        self, turn_id: int, step: str, calls: list[CallRow], time_saved_ms: float | None
    ) -> None:
        """Rewrite a logged step's ``calls`` rows (matched by attempt) and its
        ``time_saved_ms``: how shadow losers that finished after the turn was logged
        reach the log."""
        if self.redactor:
            redact_calls(calls, self.redactor)
        with self.log.transaction():
            _write_step_calls(self.log, turn_id, step, calls, time_saved_ms)

    async def aupdate_step_calls(
        self, turn_id: int, step: str, calls: list[CallRow], time_saved_ms: float | None
    ) -> None:
        """:meth:`update_step_calls` off the event loop (see :meth:`alog_turn`)."""
        if self.writer is None:
            self.update_step_calls(turn_id, step, calls, time_saved_ms)
            return
        if self.redactor:
            redact_calls(calls, self.redactor)
        await self.writer.submit(
            lambda db: _write_step_calls(db, turn_id, step, calls, time_saved_ms)
        )

    async def flush(self) -> None:
        """Wait until every write submitted so far is committed.

        Raises:
            LogWriteError: turns that had returned were refused by the log (each named
                by its request id and turn id).
            Exception: any other first failure of a write since the last flush (see
                :meth:`chainrun.log.writer.LogWriter.flush`).
        """
        if self.writer is None:
            return
        try:
            await self.writer.flush()
        except Exception as e:
            lost = [_lost_turn(label, error) for label, error in self.writer.take_lost()
                    if isinstance(label, dict)]  # fmt: skip
            if lost:
                raise LogWriteError(lost, str(self.path) if self.path else None) from e
            raise

    def lost_turns(self, run_id: int | None = None) -> list[LostTurn]:
        """Every turn whose rows the log refused since this store was opened (of run
        ``run_id``; None: of every run), oldest first: the turn returned, its row is
        not in the log."""
        if self.writer is None:
            return []
        return [_lost_turn(label, error) for label, error in self.writer.lost
                if isinstance(label, dict) and run_id in (None, label.get("run_id"))]  # fmt: skip

    async def aread_turn(self, turn_id: int, *, flush_timeout_s: float = 2.0) -> TurnLog | None:
        """One turn read back once its write is committed, without the event loop waiting
        on the database: the flush waits at most ``flush_timeout_s`` seconds (the
        database may be unreachable: then None, and the turn is still queued, or was
        counted as lost; None too when the writer thread has stopped), and a PostgreSQL
        read runs in a worker thread.

        Raises:
            The first failure of a turn write since the last flush (see :meth:`flush`).
        """
        if self.writer is not None:
            try:
                await asyncio.wait_for(self.writer.flush(), flush_timeout_s)
            except (TimeoutError, LogWriteError):  # away too long, or the writer stopped
                return None
        unreachable: tuple[type[BaseException], ...] = (TimeoutError, *self.log.network_errors)
        try:
            return await asyncio.wait_for(self.off_loop(self.turn, turn_id), flush_timeout_s)
        except Exception as e:
            if isinstance(e, unreachable):
                return None
            raise

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (a read of this store) without the event loop waiting on
        the network: in a worker thread for a PostgreSQL log; inline for SQLite, whose
        connection belongs to this thread (a local read of a few ms at most)."""
        if isinstance(self.log, SqliteLogDb):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    def log_status(self) -> dict[str, Any]:
        """The log writer's state for ``/readyz`` and metrics (see
        :meth:`chainrun.log.writer.LogWriter.status`); ``{"state": "ok"}`` without one."""
        status = self.writer.status() if self.writer is not None else {"state": "ok"}
        return {"log": self.name, "backend": self.dialect, **status}

    def _rows(self, table: str, run_ids: int | Sequence[int]) -> list[dict[str, Any]]:
        ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
        if not ids:
            return []
        marks = ",".join("?" for _ in ids)
        return self.log.query(
            f'select * from "{table}" where run_id in ({marks}) order by id', ids
        )

    def turns(self, run_ids: int | Sequence[int]) -> list[TurnRow]:
        """The turns of a run (or of several), in the order they were logged."""
        return [TurnRow.from_db(r) for r in self._rows("turns", run_ids)]

    def steps(self, run_ids: int | Sequence[int]) -> list[StepRow]:
        """The steps of a run (or of several), by turn, in the order they were logged."""
        return [StepRow.from_db(r) for r in self._rows("steps", run_ids)]

    def steps_of_turns(self, turn_ids: Sequence[int], *, kind: str | None = None) -> list[StepRow]:
        """The steps of the turns ``turn_ids`` (only those of ``kind``, if given), in the
        order they were logged."""
        if not turn_ids:
            return []
        marks = ",".join("?" for _ in turn_ids)
        where = f"turn_id in ({marks})" + (" and kind = ?" if kind is not None else "")
        args: list[Any] = [*turn_ids, *([kind] if kind is not None else [])]
        rows = self.log.query(f"select * from steps where {where} order by id", args)
        return [StepRow.from_db(r) for r in rows]

    def calls(self, run_ids: int | Sequence[int]) -> list[CallRow]:
        """The model call attempts of a run (or of several), in the order they were logged."""
        return [CallRow.from_db(r) for r in self._rows("calls", run_ids)]

    def tool_calls(self, run_ids: int | Sequence[int]) -> list[ToolCallRow]:
        """The tool calls of a run (or of several), in the order they were logged."""
        return [ToolCallRow.from_db(r) for r in self._rows("tool_calls", run_ids)]

    def conversation(
        self, conversation_id: str, *, last: int, kinds: Sequence[RunKind] = ("live",)
    ) -> tuple[list[TurnRow], int]:
        """A conversation's latest turns in runs of ``kinds``: its ``last`` turns by turn
        index (then id), oldest first, and the highest turn index logged (0: none).

        Turns logged without a turn index (before migration 070) count as index 0.
        """
        marks = ",".join("?" for _ in kinds)
        where = (f"conversation_id = ? and run_id in (select id from runs where kind in "
                 f"({marks}))")  # fmt: skip
        args = [conversation_id, *kinds]
        top = self.log.scalar(f"select coalesce(max(turn_index), 0) from turns where {where}",
                              args)  # fmt: skip
        if last <= 0:
            return [], int(top)
        rows = self.log.query(
            f"select * from turns where {where} order by coalesce(turn_index, 0) desc, id desc "
            "limit ?",
            [*args, last],
        )
        turns = [TurnRow.from_db(r) for r in rows]
        turns.reverse()
        return turns, int(top)

    def turns_between(
        self, kind: RunKind, since: str | None = None, until: str | None = None
    ) -> list[TurnRow]:
        """The turns of every run of ``kind`` that started in ``[since, until)`` (ISO-8601
        UTC as the log writes it, :func:`log_time`; either bound optional), in log order;
        a turn without a start time is placed at its run's start. One query, filtered
        in the database (a fleet's live traffic may be millions of turns)."""
        sql = ("select t.* from turns t join runs r on r.id = t.run_id where r.kind = ?")
        params: list[Any] = [kind]
        stamp = "coalesce(t.started_at, r.started_at)"
        if since is not None:
            sql += f" and {stamp} >= ?"
            params.append(since)
        if until is not None:
            sql += f" and {stamp} < ?"
            params.append(until)
        return [TurnRow.from_db(r) for r in self.log.query(sql + " order by t.id", params)]

    def turn(self, turn_id: int) -> TurnLog | None:
        """One turn's row with its steps and calls, or None when there is no such turn."""
        rows = self.log.query("select * from turns where id = ?", [turn_id])
        if not rows:
            return None
        steps = self.log.query("select * from steps where turn_id = ? order by id", [turn_id])
        calls = self.log.query("select * from calls where turn_id = ? order by id", [turn_id])
        tools = self.log.query("select * from tool_calls where turn_id = ? order by id",
                               [turn_id])  # fmt: skip
        return TurnLog(TurnRow.from_db(rows[0]), [StepRow.from_db(r) for r in steps],
                       [CallRow.from_db(r) for r in calls],
                       [ToolCallRow.from_db(r) for r in tools])  # fmt: skip

    def find_turn_id(self, run_id: int, request_id: str) -> int | None:
        """The latest turn of run ``run_id`` logged with ``request_id``, or None."""
        got = self.log.scalar(
            "select max(id) from turns where run_id = ? and request_id = ?", [run_id, request_id]
        )
        return None if got is None else int(got)

    def runs_of_kind(self, kind: RunKind) -> list[RunRow]:
        """Every run of ``kind``, oldest first."""
        rows = self.log.query("select * from runs where kind = ? order by id", [kind])
        return [RunRow.from_db(r) for r in rows]

    def recent_latencies(
        self,
        step: str,
        *,
        max_calls: int = 200,
        within_s: float = 600.0,
        servers: Sequence[str] | None = None,
        model: str | None = None,
    ) -> list[float]:
        """The latencies (ms) the hedging window of ``step`` records, of the step's newest
        ``max_calls`` answered calls that started within the last ``within_s`` seconds,
        in any run of any process writing this log (newest first; a call's time is its
        turn's start), sent to one of ``servers`` (``host:port`` as logged in
        ``calls.server_address``; None: any) and asking for ``model`` (None: any).

        What the window records (:mod:`chainrun.hedging.engine`): a settled attempt's own
        latency, from its start to its first token for a streamed step (``ttft_ms``) or
        to its whole answer otherwise (``duration_ms``); of winners and of shadow losers
        that ran to the end. Errors never enter it.
        """
        since = log_time(datetime.now(UTC) - timedelta(seconds=within_s))
        outcomes = (*WINNER_OUTCOMES, "shadow_finished")
        marks = ",".join("?" for _ in outcomes)
        where, params = "", []
        if servers is not None:
            where += f" and c.server_address in ({','.join('?' for _ in servers) or 'null'})"
            params += list(servers)
        if model is not None:
            where += " and c.model = ?"
            params.append(model)
        rows = self.log.execute(
            "select case when c.stream = 1 then c.ttft_ms else c.duration_ms end "
            "from turns t join calls c on c.turn_id = t.id "
            f"where t.started_at >= ? and c.step = ? and c.outcome in ({marks}) "
            f"and c.error_type is null{where} order by t.started_at desc, c.id desc limit ?",
            [since, step, *outcomes, *params, max_calls],
        ).fetchall()
        return [float(r[0]) for r in rows if r[0] is not None]

    # -- eval results ----------------------------------------------------------------------
    def replace_eval_results(self, run_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace run ``run_id``'s ``eval_results`` rows with ``rows`` (one transaction)."""
        with self.log.transaction():
            self.log.execute("delete from eval_results where run_id = ?", [run_id])
            if rows:
                self.log.table("eval_results").insert_all(rows)

    def eval_results(self, run_ids: Sequence[int]) -> list[dict[str, Any]]:
        """The ``eval_results`` rows of some runs, in log order."""
        ids = list(run_ids)
        if not ids:
            return []
        marks = ",".join("?" for _ in ids)
        return self.log.query(
            f"select * from eval_results where run_id in ({marks}) order by id", ids
        )


def _file_id(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path`` (None: no file there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def log_time(when: datetime) -> str:
    """``when`` as the log's ``*_at`` columns hold it (ISO-8601 UTC with ms, as
    :func:`utc_now`): text that sorts in time order on both databases."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="milliseconds")


def _lost_turn(label: dict[str, Any], error: BaseException) -> LostTurn:
    return LostTurn(label.get("turn_id"), label.get("request_id"), str(error))


def _new_run(
    kind: RunKind, config_snapshot: str, label: str | None, source: str | None,
    meta: dict[str, Any] | None,
) -> RunRow:  # fmt: skip
    return RunRow(kind=kind, label=label, config=config_snapshot, source=source,
                  started_at=utc_now(),
                  meta={**(meta or {}), "writer": writer_identity()})  # fmt: skip


def _insert_run(db: LogDb, run: RunRow) -> int:
    """Insert ``run`` (inside the caller's transaction); its id."""
    return db.insert_returning_id("runs", run.to_db())


def _finish_run(db: LogDb, run_id: int, status: str, ended_at: str) -> bool:
    """End a ``running`` run with ``status`` and its turn count (inside the caller's
    transaction); whether it was running."""
    n = db.scalar("select count(*) from turns where run_id = ?", [run_id])
    cur = db.execute(
        "update runs set status = ?, ended_at = ?, n_turns = ? where id = ? and status = 'running'",
        [status, ended_at, n, run_id],
    )
    return cur.rowcount > 0


_INSERTS: dict[tuple[str, tuple[str, ...], str], str] = {}


def _insert_sql(table: str, columns: tuple[str, ...], tail: str = "") -> str:
    key = (table, columns, tail)
    sql = _INSERTS.get(key)
    if sql is None:
        cols = ", ".join(f'"{c}"' for c in columns)
        sql = f'insert into "{table}" ({cols}) values ({", ".join("?" for _ in columns)}){tail}'
        _INSERTS[key] = sql
    return sql


def _prepare_turn(
    run_id: int, log: TurnLog, turn_id: int | None = None, dialect: str = "sqlite"
) -> Callable[[LogDb], int]:
    """The turn's rows as plain SQL and parameters, built by the caller (on the event
    loop) so that the writer thread only runs the database calls (which release the
    GIL) instead of competing with the loop for it; returns the write, which returns
    the turn id.

    Plain ``insert`` statements instead of sqlite-utils' ``insert``/``insert_all``,
    which read the table's schema on every call (profiled: most of a turn's write).
    ``turn_id``: the reserved id to insert with (None: SQLite assigns one).

    On PostgreSQL the turn row is inserted ``on conflict (id) do nothing``: a batch the
    writer retries after a lost connection may have been committed already (the commit
    reached the server, its answer did not); its turns are then found in place and
    skipped whole (a turn is one transaction), so a turn is logged exactly once.
    """
    turn = {**log.turn.to_db(), "run_id": run_id}
    if turn_id is not None:
        turn["id"] = turn_id
    tail = " on conflict (id) do nothing" if dialect == "postgresql" and turn_id else ""
    turn_sql = _insert_sql("turns", tuple(turn), tail)
    turn_params = tuple(turn.values())
    children: list[tuple[str, list[tuple[Any, ...]]]] = []
    for table, rows in (("steps", [s.to_db() for s in log.steps]),
                        ("calls", [c.to_db() for c in log.calls]),
                        ("tool_calls", [t.to_db() for t in log.tool_calls])):  # fmt: skip
        by_cols: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        for row in rows:
            row["run_id"] = run_id
            row.pop("turn_id", None)
            by_cols.setdefault((*row, "turn_id"), []).append(tuple(row.values()))
        children += [(_insert_sql(table, cols), params) for cols, params in by_cols.items()]

    def write(db: LogDb) -> int:
        tid = turn_id
        try:
            cur = db.execute(turn_sql, turn_params)
            if tid is None:
                tid = cur.lastrowid
                assert tid is not None
            elif cur.rowcount == 0:
                return tid  # committed by an earlier try of this batch (PostgreSQL)
            for sql, params in children:
                db.executemany(sql, [(*p, tid) for p in params])
            return tid
        except db.text_errors:
            return _write_scrubbed(db, tid, (turn_sql, turn_params), children)

    return write


def _write_scrubbed(
    db: LogDb, partial_id: int | None, turn: tuple[str, tuple[Any, ...]],
    children: list[tuple[str, list[tuple[Any, ...]]]],
) -> int:  # fmt: skip
    """A turn's write again after the database refused one of its texts (a lone
    surrogate, ``UnicodeEncodeError: surrogates not allowed``, e.g. a model that streamed
    a cut ``"\\ud83d"`` escape; on PostgreSQL also a NUL character, which its text type
    cannot hold): undo its rows written so far (``partial_id``: the turn's id, when
    known) and write them with those characters replaced by U+FFFD, rather than fail
    the commit and lose the turn. Only on this failure path: the hot path pays nothing
    for it."""
    if partial_id is not None:
        for table, col in (("tool_calls", "turn_id"), ("calls", "turn_id"), ("steps", "turn_id"),
                           ("turns", "id")):  # fmt: skip
            db.execute(f"delete from {table} where {col} = ?", [partial_id])
    cur = db.execute(turn[0], scrub_surrogates(turn[1]))
    tid = partial_id if partial_id is not None else cur.lastrowid
    assert tid is not None
    for sql, params in children:
        db.executemany(sql, [(*scrub_surrogates(p), tid) for p in params])
    logger.warning("turn %s: lone surrogates or NUL characters in its texts were logged as "
                   "U+FFFD", tid)  # fmt: skip
    return int(tid)


_SURROGATE = re.compile("[\ud800-\udfff\x00]")


def scrub_surrogates(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """``params`` with every UTF-16 surrogate (and NUL character) in its strings replaced
    by U+FFFD (the Unicode replacement character): what a log write does when the
    database refuses a text (``UnicodeEncodeError: surrogates not allowed``; PostgreSQL:
    text cannot contain NUL)."""
    return tuple(_SURROGATE.sub("\ufffd", p) if isinstance(p, str) else p for p in params)


def _write_step_calls(
    db: LogDb, turn_id: int, step: str, calls: list[CallRow], time_saved_ms: float | None,
) -> None:  # fmt: skip
    """Rewrite a logged step's calls (by attempt) and time saved (inside the caller's
    transaction)."""
    for c in calls:
        row = c.to_db()
        for key in ("id", "run_id", "turn_id"):
            row.pop(key, None)
        sql = ("update calls set " + ", ".join(f"{k} = ?" for k in row)
               + " where turn_id = ? and step = ? and attempt = ?")  # fmt: skip
        params = (*row.values(), turn_id, step, c.attempt)
        try:
            db.execute(sql, params)
        except db.text_errors:  # a lone surrogate in a loser's text (see _write_scrubbed)
            db.execute(sql, scrub_surrogates(params))
    db.execute(
        "update steps set time_saved_ms = ? where turn_id = ? and step = ?",
        [time_saved_ms, turn_id, step],
    )


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


@dataclass(frozen=True)
class SeedWindows:
    """How a new process seeds its hedge windows from the log (see
    :meth:`Store.recent_latencies`): the newest ``max_calls`` answered calls of each
    hedged step that started within the last ``within_s`` seconds."""

    max_calls: int = 200
    within_s: float = 600.0


def log_window(since: str | None, until: str | None) -> tuple[str | None, str | None]:
    """``--since``/``--until`` (ISO-8601; UTC unless they say otherwise) as the log's time
    text (:func:`log_time`); a date alone as ``until`` includes that whole day.

    Raises:
        UserInputError: a value that is not ISO-8601, or a window that ends before it
            starts (naming the option).
    """
    bounds: list[str | None] = []
    for option, text in (("--since", since), ("--until", until)):
        if text is None:
            bounds.append(None)
            continue
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UserInputError(
                f"{option} {text!r}: expected an ISO-8601 time such as 2026-12-01T15:00 "
                "(UTC unless it says otherwise)"
            ) from None
        if option == "--until" and len(text.strip()) == 10:  # a date alone: the whole day
            when += timedelta(days=1)
        bounds.append(log_time(when))
    lo, hi = bounds
    if lo is not None and hi is not None and hi <= lo:
        raise UserInputError(f"--since {since} --until {until}: the window ends before it starts")
    return lo, hi
