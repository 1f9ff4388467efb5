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
(:data:`~chainrun.log.opening.CATALOG_ENV`, default ``chainrun-catalog.db``), since the
catalogue's search runs on SQLite's FTS5 and sqlite-vec.

:class:`Store` is the one face; each concept behind it is a module of its own: opening
the databases (:mod:`chainrun.log.opening`), a run's lifecycle and its writer's liveness
(:mod:`chainrun.log.lifecycle`), a turn's writes (:mod:`chainrun.log.turn_writes`), the
typed reads (:mod:`chainrun.log.reads`), eval results (:mod:`chainrun.log.eval_results`)
and the log's time text (:mod:`chainrun.log.time_window`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from sqlite_utils.utils import sqlite3  # pysqlite3 when installed (sqlite-vec)

from chainrun.errors import LogWriteError, LostTurn, UserInputError
from chainrun.log.actions import LoggedActions
from chainrun.log.backend import LogDb, SqliteLogDb, is_postgres_url, shown_url
from chainrun.log.eval_results import EvalResults
from chainrun.log.lifecycle import end_run, end_running_run, insert_run, mark_resumed, new_run
from chainrun.log.migrations import migrate, utc_now
from chainrun.log.opening import (
    PG_BLOCK,
    catalog_path,
    file_id,
    open_catalog,
    open_postgres_log,
    open_read_only,
    open_sqlite_file,
)
from chainrun.log.reads import LogReads
from chainrun.log.redaction import Redactor, redact_calls, redact_turn
from chainrun.log.review_judgements import ReviewJudgements
from chainrun.log.rows import CallRow, RunKind, RunStatus, TurnLog
from chainrun.log.turn_ids import BLOCK, TurnIds, release
from chainrun.log.turn_writes import lost_turn, prepare_turn, write_step_calls
from chainrun.log.writer import LogWriter

__all__ = ["DEFAULT_DB", "Store"]

T = TypeVar("T")
DEFAULT_DB = "chainrun.db"


class Store(LogReads, EvalResults, ReviewJudgements, LoggedActions):
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
        #: a PostgreSQL log's catalogue file (None: :func:`~chainrun.log.opening.catalog_path`)
        self.catalog_file: Path | None = None
        if writer is None and path is not None:
            writer = LogWriter(path)
        self.writer: LogWriter | None = writer
        #: the (device, inode) of the SQLite file as opened (None: in memory, PostgreSQL)
        self._file_id = file_id(path) if path is not None else None
        self._ids = TurnIds(self._reserve_on_writer, self._reserve_here, block=block)

    @property
    def db(self) -> sqlite_utils.Database:
        """The SQLite database holding the product catalogue: the log itself for a SQLite
        log; for a PostgreSQL log the file :func:`~chainrun.log.opening.catalog_path`
        names (opened, created and migrated at first use)."""
        if self._catalog is None:
            self._catalog = open_catalog(self.catalog_file or catalog_path())
        return self._catalog

    def file_gone(self) -> bool:
        """Whether a SQLite log's file was deleted, or replaced by another file, since
        this store opened it (False in memory and on PostgreSQL). SQLite says nothing
        then: its connections go on writing to the deleted file, which disappears with
        them when they close, so whatever was written to it is lost (one ``stat``, a few
        µs: cheap enough to ask after every turn)."""
        if self._file_id is None or self.path is None:
            return False
        return file_id(self.path) != self._file_id

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
        see :func:`~chainrun.log.opening.open_read_only`. A write through it then fails with
        ``sqlite3.OperationalError`` (attempt to write a readonly database).

        Raises:
            UserInputError: the directory does not exist; ``create`` is False and the file
                does not exist; the file is not SQLite; or it is a SQLite database of
                something else (tables but no chainrun ``_migrations``), which is left as is;
                or it cannot be read read-only (see :func:`~chainrun.log.opening.open_read_only`).
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
                return cls(open_read_only(p, path), p)
            except sqlite3.DatabaseError as e:
                raise UserInputError(f"{path}: not a chainrun log database ({e})") from None
        return cls(open_sqlite_file(p, path), p)

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
        log, writer = open_postgres_log(url, create=create)
        return cls(log, url=url, writer=writer, block=PG_BLOCK)

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
        run = new_run(kind, config_snapshot, label, source, meta)
        with self.log.transaction():
            return insert_run(self.log, run)

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
        run = new_run(kind, config_snapshot, label, source, meta)
        run_id = await self.writer.submit(lambda db: insert_run(db, run))
        self._ids.prefetch()  # turn ids before the first turn needs them
        return run_id

    def resume_run(self, run_id: int) -> None:
        """Mark an ended run ``running`` again, written by this process (``--resume``)."""
        run = self.get_run(run_id)
        with self.log.transaction():
            mark_resumed(self.log, run)

    def finish_run(self, run_id: int, status: RunStatus) -> None:
        """Mark a run ended with ``status`` and store its turn count."""
        with self.log.transaction():
            end_run(self.log, run_id, status)

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
        return await self.writer.submit(lambda db: end_running_run(db, run_id, status, ended_at))

    # -- turns, steps, calls -------------------------------------------------------------
    def log_turn(self, run_id: int, log: TurnLog) -> int:
        """Write a turn with its steps and calls in one transaction (a process killed
        mid-write leaves all of it or none), on this thread; returns the turn id.
        ``redactor`` masks personal data in the texts first (``[log] redact``)."""
        if self.redactor:
            redact_turn(log, self.redactor)
        # an id reserved at the turn's start (areserve_turn_id), else the next one
        turn_id = log.turn.id if log.turn.id is not None else self._ids.take_sync()
        write = prepare_turn(run_id, log, turn_id, self.log.dialect)
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
            return prepare_turn(run_id, log, turn_id, dialect)

        if durable:
            return await self.writer.submit(build())
        label = {"turn_id": turn_id, "request_id": log.turn.request_id, "run_id": run_id}
        await self.writer.post_later(build, label)
        return turn_id

    def update_step_calls(
        self, turn_id: int, step: str, calls: list[CallRow], time_saved_ms: float | None,
        *, hedge_rounds: list[dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        """Rewrite a logged step's ``calls`` rows (matched by round and attempt), its
        ``time_saved_ms`` and, given, its ``detail["hedge_rounds"]``: how shadow losers
        that finished after the turn was logged reach the log."""
        if self.redactor:
            redact_calls(calls, self.redactor)
        with self.log.transaction():
            write_step_calls(self.log, turn_id, step, calls, time_saved_ms, hedge_rounds)

    async def aupdate_step_calls(
        self, turn_id: int, step: str, calls: list[CallRow], time_saved_ms: float | None,
        *, hedge_rounds: list[dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        """:meth:`update_step_calls` off the event loop (see :meth:`alog_turn`)."""
        if self.writer is None:
            self.update_step_calls(turn_id, step, calls, time_saved_ms, hedge_rounds=hedge_rounds)
            return
        if self.redactor:
            redact_calls(calls, self.redactor)
        await self.writer.submit(
            lambda db: write_step_calls(db, turn_id, step, calls, time_saved_ms, hedge_rounds)
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
            lost = [lost_turn(label, error) for label, error in self.writer.take_lost()
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
        return [lost_turn(label, error) for label, error in self.writer.lost
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

    def claim_turn_index(
        self, conversation_id: str, *, run_id: int | None = None, message: str | None = None,
        started_at: str | None = None, token: str | None = None,
        request_id: str | None = None,
    ) -> int:  # fmt: skip
        """The next turn index of live conversation ``conversation_id``, handed out once
        (an atomic upsert on ``conversation_index``: two processes serving turns of one
        conversation at once never get the same index). A conversation new to the
        counter starts after the highest turn index its live turns logged.

        ``run_id``, ``message`` (as it is to be logged), ``started_at`` (ISO-8601 UTC)
        and ``request_id`` are kept with the claim until the next one: should the run's
        process die before the turn's rows are written, the next open of the log logs the
        turn ``lost``
        (:func:`chainrun.log.lifecycle.mark_interrupted_runs`).

        ``token`` (any text unique to one claim, e.g. a random UUID) makes the claim safe
        to try again: a try that finds the conversation's last claim is its own (the same
        token: an earlier try committed but its answer was lost) gets that index again
        instead of the next one. None: every call takes a new index. A claim of another
        turn between the two tries overwrites the token; the retry then takes the next
        index and the first stays unused.

        Runs on the calling thread against the database (not through the writer): call
        it through :meth:`off_loop`.
        """
        row = self.log.execute(
            "insert into conversation_index (conversation_id, last_index, claimed_run_id, "
            "claimed_input, claimed_at, claim_token, claimed_request_id) values (?, "
            "1 + (select coalesce(max(turn_index), 0) from turns where conversation_id = ? "
            "and run_id in (select id from runs where kind = 'live')), ?, ?, ?, ?, ?) "
            "on conflict (conversation_id) do update set "
            "last_index = conversation_index.last_index + case when "
            "conversation_index.claim_token = excluded.claim_token then 0 else 1 end, "
            "claimed_run_id = excluded.claimed_run_id, claimed_input = excluded.claimed_input, "
            "claimed_at = excluded.claimed_at, claim_token = excluded.claim_token, "
            "claimed_request_id = excluded.claimed_request_id "
            "returning last_index",
            [conversation_id, conversation_id, run_id, message, started_at, token, request_id],
        ).fetchone()
        assert row is not None
        return int(row[0])

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (a read of this store) without the event loop waiting on
        the network: in a worker thread for a PostgreSQL log; inline for SQLite, whose
        connection belongs to this thread (a local read of a few ms at most)."""
        if isinstance(self.log, SqliteLogDb):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    @property
    def unreachable_errors(self) -> tuple[type[BaseException], ...]:
        """The errors of a read or write whose database did not answer: a timeout, a
        connection that failed, and the backend's own network errors (PostgreSQL:
        psycopg's ``OperationalError``, ``InterfaceError`` and the pool's ``PoolTimeout``)."""
        return (TimeoutError, ConnectionError, *self.log.network_errors)

    def log_status(self) -> dict[str, Any]:
        """The log writer's state for ``/readyz`` and metrics (see
        :meth:`chainrun.log.writer.LogWriter.status`); ``{"state": "ok"}`` without one."""
        status = self.writer.status() if self.writer is not None else {"state": "ok"}
        return {"log": self.name, "backend": self.dialect, **status}
