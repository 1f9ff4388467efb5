"""The run log: a SQLite file (WAL mode) written through sqlite-utils.

Tables: ``runs`` → ``turns`` → ``steps`` and ``calls`` (one row per model call
attempt), each written and read as a typed row model of :mod:`chainrun.log.rows`.
Schema changes are the numbered migrations of :mod:`chainrun.log.migrations`, applied
once each on open and recorded in ``_migrations`` (the pattern of simonw/llm).
Prompts and outputs are stored; API keys never are (the config snapshot holds only
the *name* of the key's environment variable).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils
from sqlite_utils.utils import sqlite3  # pysqlite3 when installed (sqlite-vec)

from chainrun.errors import LogWriteError, LostTurn, UserInputError
from chainrun.log.migrations import MIGRATIONS, migrate, utc_now
from chainrun.log.redaction import Redactor, redact_calls, redact_turn
from chainrun.log.rows import (
    CallRow,
    RunKind,
    RunRow,
    RunStatus,
    StepRow,
    ToolCallRow,
    TurnLog,
    TurnRow,
)
from chainrun.log.transactions import write_transaction
from chainrun.log.turn_ids import TurnIds, release
from chainrun.log.writer import JOURNAL_SIZE_LIMIT_BYTES, LogWriter

__all__ = ["DEFAULT_DB", "Store", "migrate", "remove_unused_log", "utc_now"]

DEFAULT_DB = "chainrun.db"
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
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return writer.get("start") is None
    return writer.get("start") in (None, start)


def mark_interrupted_runs(db: sqlite_utils.Database) -> list[int]:
    """Mark ``interrupted`` every run still ``running`` whose writing process is gone
    (killed with SIGKILL, the machine lost power): the next open of the log tells the
    truth instead of leaving it ``running``. Its committed turns are kept as they are.
    Returns the ids marked."""
    marked: list[int] = []
    for run_id, raw in db.execute("select id, meta from runs where status = 'running'"):
        try:
            meta = json.loads(raw) if raw else {}
        except ValueError:
            meta = {}
        if writer_alive(meta.get("writer") if isinstance(meta, dict) else None):
            continue
        n = db.execute("select count(*) from turns where run_id = ?", [run_id]).fetchone()[0]
        with write_transaction(db):
            db.execute(
                "update runs set status = 'interrupted', ended_at = ?, n_turns = ? "
                "where id = ? and status = 'running'",
                [utc_now(), n, run_id],
            )
        marked.append(run_id)
    return marked


class Store:
    """The run log. Open with :meth:`open`; use as a context manager to close it.

    A file log writes turns from the event loop through :meth:`alog_turn` on a writer
    thread with its own connection (:mod:`chainrun.log.writer`), without waiting for the
    commit unless asked (``durable=True``); a turn's id is known at once, from a block
    of ids this process reserved in the log (:mod:`chainrun.log.turn_ids`). Readers in the
    same process :meth:`flush` first (``Chain.aclose`` does). An in-memory log (one
    connection, not shareable across threads) writes turns inline.

    Raises:
        UserInputError: the file exists but is not a SQLite database.
    """

    def __init__(self, db: sqlite_utils.Database, path: Path | None = None) -> None:
        self.db = db
        #: masks personal data in what is logged (the chain sets it from ``[log] redact``)
        self.redactor: Redactor | None = None
        self.path = path
        self.writer: LogWriter | None = LogWriter(path) if path is not None else None
        self._ids = TurnIds(self._reserve_on_writer, self._reserve_here)

    def _reserve_on_writer(self, job: Callable[[sqlite3.Connection], Any]) -> Any:
        assert self.writer is not None
        return self.writer.future(lambda db: job(db.conn))

    def _reserve_here(self, job: Callable[[sqlite3.Connection], Any]) -> Any:
        with write_transaction(self.db):
            return job(self.db.conn)

    @classmethod
    def open(cls, path: str | Path = DEFAULT_DB, *, create: bool = True) -> Store:
        """Open (creating and migrating if needed) the log at ``path``; ``":memory:"`` works.

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
        try:
            # One opener at a time per directory: two commands starting on a new log
            # would otherwise race to switch it to WAL and to apply the same migrations.
            # The lock is a flock on the *directory*, never an fd on the log: closing any
            # fd of the log file drops every POSIX lock this process holds on it, SQLite's
            # included, and another process's reader then thinks it is the last one,
            # checkpoints and deletes the WAL under our open connection (SQLite, "How To
            # Corrupt An SQLite Database File", 2.2), losing committed turns.
            dir_fd = os.open(p.parent, os.O_RDONLY)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                return cls(cls._open_file(p, path), p)
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
            raise UserInputError(f"{path}: not a chainrun log database ({e})") from None
        except sqlite3.DatabaseError as e:
            raise UserInputError(f"{path}: not a chainrun log database ({e})") from None

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
                self.db.execute("pragma busy_timeout = 200")  # a gap beats a slow close
                with write_transaction(self.db):
                    release(self.db.conn, *tail)
            except sqlite3.Error:  # another process holds the lock: a gap, no harm
                pass
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with write_transaction(self.db):
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
        with write_transaction(self.db):
            return _insert_run(self.db.conn, run)

    async def acreate_run(
        self,
        kind: RunKind,
        config_snapshot: str,
        label: str | None = None,
        source: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """:meth:`create_run` off the event loop: on the writer thread for a file log (in
        its queue order, so after every turn queued before it), inline for an in-memory
        log. Returns the run's id once the run is committed, as :meth:`create_run` does.
        A cancelled caller stops waiting; the run is created all the same.

        Raises:
            Whatever the insert raised (e.g. ``sqlite3.OperationalError`` once the
            busy timeout ran out), or ``RuntimeError`` when the writer is closed.
        """
        if self.writer is None:
            return self.create_run(kind, config_snapshot, label, source, meta)
        run = _new_run(kind, config_snapshot, label, source, meta)
        return await self.writer.submit(lambda db: _insert_run(db.conn, run))

    def resume_run(self, run_id: int) -> None:
        """Mark an ended run ``running`` again, written by this process (``--resume``)."""
        meta = dict(self.get_run(run_id).meta or {})
        meta["writer"] = writer_identity()
        meta["resumed"] = [*meta.get("resumed", []), utc_now()]
        with write_transaction(self.db):
            self.db.table("runs").update(
                run_id, {"status": "running", "ended_at": None, "meta": json.dumps(meta)}
            )

    def finish_run(self, run_id: int, status: RunStatus) -> None:
        """Mark a run ended with ``status`` and store its turn count."""
        n = self.db.execute("select count(*) from turns where run_id = ?", [run_id]).fetchone()[0]
        with write_transaction(self.db):
            self.db.table("runs").update(
                run_id, {"status": status, "ended_at": utc_now(), "n_turns": n}
            )

    async def afinish_run(self, run_id: int, status: RunStatus) -> bool:
        """:meth:`finish_run` off the event loop (on the writer thread for a file log,
        after every write queued before it, so the turn count holds them), only if the
        run is still ``running``; returns whether it was.

        Raises:
            Whatever the update raised, or ``RuntimeError`` when the writer is closed.
        """
        if self.writer is None:
            if self.get_run(run_id).status != "running":
                return False
            self.finish_run(run_id, status)
            return True
        ended_at = utc_now()
        return await self.writer.submit(lambda db: _finish_run(db.conn, run_id, status, ended_at))

    def get_run(self, run_id: int) -> RunRow:
        """The run ``run_id``.

        Raises:
            UserInputError: no such run.
        """
        if not 0 < run_id < 2**63:
            raise UserInputError(f"run {run_id}: no such run in this log")
        rows = list(self.db.table("runs").rows_where("id = ?", [run_id]))
        if not rows:
            raise UserInputError(f"run {run_id}: no such run in this log")
        return RunRow.from_db(rows[0])

    def latest_run_id(self, kind: str | None = None) -> int | None:
        """The newest run's id (of ``kind`` when given), or None in an empty log."""
        where = "where kind = ?" if kind else ""
        row = self.db.execute(
            f"select max(id) from runs {where}", [kind] if kind else []
        ).fetchone()
        return row[0] if row else None

    def list_runs(self, limit: int = 50) -> list[RunRow]:
        """The newest ``limit`` runs, newest first.

        ``n_turns`` of a run still running (a live ``chainrun serve`` run, a replay in
        progress) is the count of its turns logged so far; an ended run's is the count
        stored when it ended.
        """
        rows = [
            RunRow.from_db(r)
            for r in self.db.table("runs").rows_where(order_by="id desc", limit=limit)
        ]
        for row in rows:
            if row.status == "running":
                row.n_turns = self.db.execute(
                    "select count(*) from turns where run_id = ?", [row.id]
                ).fetchone()[0]
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
        write = _prepare_turn(run_id, log, turn_id)
        with write_transaction(self.db):
            return write(self.db.conn)

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
        """:meth:`log_turn` off the event loop (on the writer thread for a file log);
        returns the turn's id once its rows are queued (``durable``: once committed).

        The id comes from this process's reserved block (an await on the writer only
        when the block runs out, once per :data:`chainrun.log.turn_ids.BLOCK` turns at most).
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

        def build() -> Callable[[sqlite_utils.Database], int]:
            if redactor:
                redact_turn(log, redactor)
            write = _prepare_turn(run_id, log, turn_id)
            return lambda db: write(db.conn)

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
        with write_transaction(self.db):
            _write_step_calls(self.db, turn_id, step, calls, time_saved_ms)

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

    def _rows(self, table: str, run_ids: int | Sequence[int]) -> Iterator[dict[str, Any]]:
        ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
        if not ids:
            return iter(())
        marks = ",".join("?" for _ in ids)
        return self.db.table(table).rows_where(f"run_id in ({marks})", ids, order_by="id")

    def turns(self, run_ids: int | Sequence[int]) -> list[TurnRow]:
        """The turns of a run (or of several), in the order they were logged."""
        return [TurnRow.from_db(r) for r in self._rows("turns", run_ids)]

    def steps(self, run_ids: int | Sequence[int]) -> list[StepRow]:
        """The steps of a run (or of several), by turn, in the order they were logged."""
        return [StepRow.from_db(r) for r in self._rows("steps", run_ids)]

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
        top = self.db.execute(
            f"select coalesce(max(turn_index), 0) from turns where {where}", args
        ).fetchone()[0]
        if last <= 0:
            return [], int(top)
        rows = self.db.execute(
            f"select * from turns where {where} order by coalesce(turn_index, 0) desc, id desc "
            "limit ?",
            [*args, last],
        )
        cols = [d[0] for d in rows.description]
        turns = [TurnRow.from_db(dict(zip(cols, r, strict=True))) for r in rows.fetchall()]
        turns.reverse()
        return turns, int(top)

    def turn(self, turn_id: int) -> TurnLog | None:
        """One turn's row with its steps and calls, or None when there is no such turn."""
        rows = list(self.db.table("turns").rows_where("id = ?", [turn_id]))
        if not rows:
            return None
        steps = self.db.table("steps").rows_where("turn_id = ?", [turn_id], order_by="id")
        calls = self.db.table("calls").rows_where("turn_id = ?", [turn_id], order_by="id")
        tools = self.db.table("tool_calls").rows_where("turn_id = ?", [turn_id], order_by="id")
        return TurnLog(TurnRow.from_db(rows[0]), [StepRow.from_db(r) for r in steps],
                       [CallRow.from_db(r) for r in calls],
                       [ToolCallRow.from_db(r) for r in tools])  # fmt: skip

    def runs_of_kind(self, kind: RunKind) -> list[RunRow]:
        """Every run of ``kind``, oldest first."""
        rows = self.db.table("runs").rows_where("kind = ?", [kind], order_by="id")
        return [RunRow.from_db(r) for r in rows]


def _lost_turn(label: dict[str, Any], error: BaseException) -> LostTurn:
    return LostTurn(label.get("turn_id"), label.get("request_id"), str(error))


def _new_run(
    kind: RunKind, config_snapshot: str, label: str | None, source: str | None,
    meta: dict[str, Any] | None,
) -> RunRow:  # fmt: skip
    return RunRow(kind=kind, label=label, config=config_snapshot, source=source,
                  started_at=utc_now(),
                  meta={**(meta or {}), "writer": writer_identity()})  # fmt: skip


def _insert_run(conn: sqlite3.Connection, run: RunRow) -> int:
    """Insert ``run`` (inside the caller's transaction); its id."""
    row = run.to_db()
    rid = conn.execute(_insert_sql("runs", tuple(row)), tuple(row.values())).lastrowid
    assert rid is not None
    return int(rid)


def _finish_run(conn: sqlite3.Connection, run_id: int, status: str, ended_at: str) -> bool:
    """End a ``running`` run with ``status`` and its turn count (inside the caller's
    transaction); whether it was running."""
    n = conn.execute("select count(*) from turns where run_id = ?", [run_id]).fetchone()[0]
    cur = conn.execute(
        "update runs set status = ?, ended_at = ?, n_turns = ? where id = ? and status = 'running'",
        [status, ended_at, n, run_id],
    )
    return cur.rowcount > 0


_INSERTS: dict[tuple[str, tuple[str, ...]], str] = {}


def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    key = (table, columns)
    sql = _INSERTS.get(key)
    if sql is None:
        cols = ", ".join(f'"{c}"' for c in columns)
        sql = f'insert into "{table}" ({cols}) values ({", ".join("?" for _ in columns)})'
        _INSERTS[key] = sql
    return sql


def _prepare_turn(
    run_id: int, log: TurnLog, turn_id: int | None = None
) -> Callable[[sqlite3.Connection], int]:
    """The turn's rows as plain SQL and parameters, built by the caller (on the event
    loop) so that the writer thread only runs SQLite (which releases the GIL) instead of
    competing with the loop for it; returns the write, which returns the turn id.

    Plain ``insert`` statements instead of sqlite-utils' ``insert``/``insert_all``,
    which read the table's schema on every call (profiled: most of a turn's write).
    ``turn_id``: the reserved id to insert with (None: SQLite assigns one).
    """
    turn = {**log.turn.to_db(), "run_id": run_id}
    if turn_id is not None:
        turn["id"] = turn_id
    turn_sql = _insert_sql("turns", tuple(turn))
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

    def write(conn: sqlite3.Connection) -> int:
        tid = None
        try:
            tid = conn.execute(turn_sql, turn_params).lastrowid
            assert tid is not None
            for sql, params in children:
                conn.executemany(sql, [(*p, tid) for p in params])
            return tid
        except UnicodeEncodeError:
            return _write_scrubbed(conn, tid, (turn_sql, turn_params), children)

    return write


def _write_scrubbed(
    conn: sqlite3.Connection, partial_id: int | None, turn: tuple[str, tuple[Any, ...]],
    children: list[tuple[str, list[tuple[Any, ...]]]],
) -> int:  # fmt: skip
    """A turn's write again after SQLite refused one of its texts (``UnicodeEncodeError:
    surrogates not allowed``: a lone surrogate, e.g. a model that streamed a cut
    ``"\\ud83d"`` escape): undo its rows written so far (``partial_id``: the turn row,
    when it went in) and write them with the surrogates replaced by U+FFFD, rather than
    fail the commit and lose the turn. Only on this failure path: the hot path pays
    nothing for it."""
    if partial_id is not None:
        for table, col in (("tool_calls", "turn_id"), ("calls", "turn_id"), ("steps", "turn_id"),
                           ("turns", "id")):  # fmt: skip
            conn.execute(f"delete from {table} where {col} = ?", [partial_id])
    tid = conn.execute(turn[0], scrub_surrogates(turn[1])).lastrowid
    assert tid is not None
    for sql, params in children:
        conn.executemany(sql, [(*scrub_surrogates(p), tid) for p in params])
    logger.warning("turn %s: lone surrogates in its texts were logged as U+FFFD", tid)
    return tid


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """``params`` with every UTF-16 surrogate in its strings replaced by U+FFFD (the
    Unicode replacement character): what a log write does when SQLite refuses a text
    (``UnicodeEncodeError: surrogates not allowed``)."""
    return tuple(_SURROGATE.sub("\ufffd", p) if isinstance(p, str) else p for p in params)


def _write_step_calls(
    db: sqlite_utils.Database, turn_id: int, step: str, calls: list[CallRow],
    time_saved_ms: float | None,
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
        except UnicodeEncodeError:  # a lone surrogate in a loser's text (see _write_scrubbed)
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
