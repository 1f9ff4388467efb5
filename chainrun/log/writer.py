"""The run log's writer thread: log writes leave the event loop, and a turn does not
wait for its commit.

A :class:`LogWriter` owns one thread with its own SQLite connection (a connection is
bound to the thread that made it; in WAL mode readers on other connections go on
reading while it writes). The event loop hands it jobs (``fn(db) -> T``) through a
bounded queue: :meth:`LogWriter.post` (fire and forget), :meth:`LogWriter.post_later`
(fire and forget, the job itself built on the loop's next turn: a finished turn's
rows, so the turn returns before they are even built), or :meth:`LogWriter.submit`
(awaits the job's commit and gives its result). The thread
takes every job waiting in the queue (up to ``max_batch``), runs them in one
transaction and commits; if a job fails, the batch is rolled back and each of its jobs
runs again in a transaction of its own, so the failing one rolls back alone.
Nothing waits for a timer: a lone job is committed at once when the thread is idle,
and under load the jobs queued meanwhile share one commit. :meth:`LogWriter.flush`
waits until everything posted before it is committed.

Durability (see the reliability guide, "Run log writes and what a crash can lose",
docs/guides/reliability.md): by default a turn returns (``TurnFinished``) once its rows
are *queued*, not committed. A process crash (SIGKILL, a segfault, power loss) loses the
jobs still in the queue or in the open transaction: turns that had finished but were not yet
committed (at most ``max_queue``; on an idle writer, the ones that finished during
the last commit, about 0.3 ms) and shadow-loser updates. A clean exit (``Chain``
closed, ``Store.close``, Ctrl-C through the chain's ``async with``) commits all of
them. With ``[log] durable_turns = true`` a turn waits for its commit before it
returns: then a crash loses only turns that had not returned. With ``synchronous =
NORMAL`` a power loss (not a process crash) can also lose the last commits since the
WAL was synced (SQLite docs, "WAL mode"). Whatever is lost, it is lost whole: a turn
is one transaction, so the file never holds half a turn.

A posted job that fails (disk full, a lock held past the 10 s busy timeout) rolls
back alone, is logged on the ``chainrun.log.writer`` logger at once, and its exception
is raised by the next :meth:`LogWriter.flush` (so ``Chain.aclose`` reports it).

The WAL file (SQLite docs, "Write-Ahead Logging", sections "Checkpointing" and
"Avoiding Excessively Large WAL Files"): SQLite checkpoints it after commits, but a
checkpoint cannot pass a reader's open transaction, and a checkpointed WAL keeps its
size on disk while a connection is open. So every connection sets ``journal_size_limit``
(:data:`JOURNAL_SIZE_LIMIT_BYTES`: a WAL reset by a checkpoint is truncated to it), the
writer thread, once idle for ``idle_checkpoint_s``, runs a ``TRUNCATE`` checkpoint
(waiting at most :data:`CHECKPOINT_BUSY_MS` for readers: the writer never stalls on
one), and when a reader has kept checkpoints from completing for ``blocked_warning_s``
it says so once on the ``chainrun.log.writer`` logger, with the WAL's size.

A log on the network (PostgreSQL; ``network=True``) may be unreachable for a while: a
restart, a failover, a reset connection. Then the batch in hand is kept and tried
again (backing off from 50 ms to 1 s, the thread's connection opened again at each
try) until the server answers, while turns go on being answered and their writes queue behind
it, up to ``max_queue`` jobs. Past that bound a new posted write is dropped instead of
making the turn wait: every drop is counted (:attr:`LogWriter.dropped`), a warning line
says when the outage starts, when writes start being dropped and how many, and when
the server is back; :meth:`LogWriter.status` gives the state (``ok``, ``retrying``,
``losing``; ``stopped``, below) to ``/readyz``. A caller waiting on a write stops
waiting once it has waited ``close_timeout_s`` with the database unreachable
(:class:`LogWriteLost`; only the part of its wait inside the outage counts); at close
the writer keeps trying for ``close_timeout_s`` seconds, then counts what is left as
dropped and says so. A batch
whose commit reached the server but whose answer did not is tried again; its turns
are found in place and skipped (the turn insert is ``on conflict do nothing``, a turn
one transaction), so each turn is logged once. No WAL checkpoints
there: those are SQLite's.

A writer thread that stops on an error of its own (its connection cannot be opened, an
error escapes a batch) says so once, fails every job it leaves (a waiter gets
:class:`LogWriterStopped`, a posted turn is counted as lost and named by the next
:meth:`LogWriter.flush`), and from then on every write fails at once the same way:
nothing waits for a thread that is gone.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from sqlite_utils.utils import sqlite3  # pysqlite3 when installed (as the store)

from chainrun.errors import LogWriteError
from chainrun.log.backend import LogDb, SqliteLogDb

__all__ = [
    "BLOCKED_WARNING_S",
    "CHECKPOINT_BUSY_MS",
    "IDLE_CHECKPOINT_S",
    "JOURNAL_SIZE_LIMIT_BYTES",
    "LogWriteLost",
    "LogWriter",
    "LogWriterStopped",
    "open_connection",
]

#: bytes a WAL file is truncated to after a checkpoint resets it (SQLite
#: ``journal_size_limit``; its default, -1, never truncates while a connection is open)
JOURNAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
#: s without a job after which the writer checkpoints and truncates the WAL
IDLE_CHECKPOINT_S = 1.0
#: ms an idle checkpoint waits for readers before it gives up (the writer must not stall)
CHECKPOINT_BUSY_MS = 50
#: s a reader may keep checkpoints from completing before the writer warns, once
BLOCKED_WARNING_S = 60.0

T = TypeVar("T")
#: fn, the loop and future to resolve (None, None for a posted job), and what the job
#: writes (a posted turn's ``{"turn_id", "request_id", "run_id"}``; None: nothing named)
Job = tuple[
    Callable[[LogDb], Any],
    "asyncio.AbstractEventLoop | None",
    "asyncio.Future[Any] | None",
    Any,
]
log = logging.getLogger(__name__)
#: seconds between two "still dropping" warning lines during one outage
WARN_EVERY_S = 5.0


class LogWriteLost(LogWriteError):
    """A write was dropped or given up: the log's database was unreachable and the queue
    was full, or the outage outlasted ``close_timeout_s``. A :class:`LogWriteError` that
    names no turn (``lost`` is empty: the turns a dropped write carried are counted, and
    named by the next :meth:`~chainrun.log.store.Store.flush`); error type ``log_write``
    (the CLI says it in one line and exits 2, as for any write the log could not take).

    Args:
        message: what was given up, and why.
        log: the log as the user names it (its file, or its URL without a password).
    """

    def __init__(self, message: str, *, log: str | None = None) -> None:
        super().__init__([], log, message=message)


class LogWriterStopped(LogWriteError):
    """The log's writer thread has stopped on an error of its own (its connection could
    not be opened, or an error escaped a batch): what it had not committed is lost (the
    posted turns are counted and named as lost), and every later write, flush or waiting
    caller gets this error at once instead of waiting for a thread that is gone. The
    message names the error that stopped it. A :class:`LogWriteError` that names no turn
    (``lost`` is empty); error type ``log_write``.

    Args:
        message: why the thread stopped.
        log: the log as the user names it.
    """

    def __init__(self, message: str, *, log: str | None = None) -> None:
        super().__init__([], log, message=message)


def open_connection(path: Path) -> sqlite_utils.Database:
    """A connection to an existing WAL log with the store's pragmas (busy wait 10 s)."""
    db = sqlite_utils.Database(str(path))
    db.execute("pragma synchronous = normal")
    db.execute("pragma busy_timeout = 10000")
    db.execute(f"pragma journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")
    return db


def _resolve(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():  # cancelled, or failed already by a stopping writer
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class LogWriter:
    """One writer thread for the log, started at the first job.

    Args:
        path: the SQLite file (already created and migrated by the store); None with
            ``connect``.
        connect: gives the thread's :class:`LogDb` (default: a new connection to
            ``path``), which the thread closes when it stops; a PostgreSQL log passes
            one with a connection of its own
            (:meth:`chainrun.log.backend.PgLogDb.dedicated`).
        name: the log as messages name it (default: ``path``).
        network: the database is on the network: retry a batch that failed for want of
            a connection, and drop (counted, said) rather than wait when the queue is
            full (see the module docstring).
        max_batch: jobs committed together at most (64).
        max_queue: jobs waiting at most; a caller beyond it waits (in a worker thread,
            not on the loop) for room, so memory stays bounded (10,000); with
            ``network``, a posted job beyond it is dropped.
        idle_checkpoint_s: s without a job before the WAL is checkpointed and truncated.
        blocked_warning_s: s a reader may block checkpoints before the warning.
        close_timeout_s: with ``network``, how long a waiting caller and :meth:`close`
            wait for an unreachable database (s).
    """

    def __init__(
        self,
        path: Path | None,
        *,
        connect: Callable[[], LogDb] | None = None,
        name: str | None = None,
        network: bool = False,
        max_batch: int = 64,
        max_queue: int = 10_000,
        idle_checkpoint_s: float = IDLE_CHECKPOINT_S,
        blocked_warning_s: float = BLOCKED_WARNING_S,
        close_timeout_s: float = 10.0,
    ) -> None:
        if path is None and connect is None:
            raise ValueError("LogWriter needs a path or a connect function")
        self.path = path
        self.name = name if name is not None else str(path)
        self._connect = connect
        self.network = network
        self.close_timeout_s = close_timeout_s
        #: writes dropped because the database was unreachable (queue full, or closed)
        self.dropped = 0
        #: times the database became unreachable, and when the current outage began
        #: (monotonic s; None: reachable)
        self.outages = 0
        self.outage_since: float | None = None
        #: the first time since the last commit that a reader of this log (a claim, a
        #: history read) found the database unreachable (monotonic s; None: none did)
        self._readers_failing_since: float | None = None
        self._dropped_in_outage = 0
        self._last_warning = 0.0
        self._closing = threading.Event()
        #: why the writer thread stopped on its own (None: running, or not stopped so)
        self.stopped: LogWriterStopped | None = None
        self._give_up_at = float("inf")
        self.max_batch = max_batch
        self.idle_checkpoint_s = idle_checkpoint_s
        self.blocked_warning_s = blocked_warning_s
        #: idle checkpoints that emptied the WAL (for tests and benchmarks)
        self.checkpoints = 0
        #: when checkpoints started to be blocked by a reader (monotonic s; None: not)
        self._blocked_since: float | None = None
        self._warned = False
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.commits = 0  # transactions committed (for benchmarks: jobs / commits = batch size)
        self.jobs = 0
        #: posted jobs that failed, and the first failure not yet raised by flush()
        self.failed = 0
        self._error: BaseException | None = None
        #: every failed posted job: (its label, the error), oldest first
        self.lost: list[tuple[Any, BaseException]] = []
        self._lost_unraised: list[tuple[Any, BaseException]] = []
        #: batches rolled back because one of their jobs failed (then run job by job)
        self.retried = 0
        #: jobs to build on the loop's next turn (:meth:`post_later`), in order
        self._builds: list[tuple[Callable[[], Callable[[LogDb], Any]], Any]] = []

    def _start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the log writer is closed")
            if self._thread is None:
                label = self.path.name if self.path is not None else "db"
                self._thread = threading.Thread(
                    target=self._run, name=f"chainrun-log-writer:{label}", daemon=True
                )
                self._thread.start()

    def future(self, fn: Callable[[LogDb], T]) -> asyncio.Future[T]:
        """Queue ``fn(db)`` and return a future of its result (resolved after its
        commit) without waiting; when the queue is full the job is put from a worker
        thread (no back-pressure: for small, rare jobs such as id reservations).

        Raises:
            RuntimeError: the writer is closed.
        """
        if self._thread is None:
            self._start()
        self._raise_if_stopped()
        self._drain_builds()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        job: Job = (fn, loop, fut, None)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            if self.network:
                self._drop(job)
            else:
                loop.run_in_executor(None, self._queue.put, job)
        self._fail_queued_if_stopped()
        return fut

    async def submit(self, fn: Callable[[LogDb], T]) -> T:
        """Run ``fn(db)`` on the writer's connection inside a transaction; its result,
        once committed.

        Raises:
            Whatever ``fn`` raised (its writes are rolled back, the batch's others kept).
            LogWriterStopped: the writer thread has stopped (before or while waiting).
            LogWriteLost: (``network``) the database could not be reached for
                ``close_timeout_s`` of this wait.
            RuntimeError: the writer is closed.
        """
        if self._thread is None:
            self._start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        await self._put((fn, loop, fut, None), drop=False)
        # shielded: a cancelled caller does not undo a queued write, it just stops waiting
        # (a stopping writer thread fails every job it leaves behind, this one included)
        if not self.network:
            return await asyncio.shield(fut)
        waiting_since = time.monotonic()
        while True:  # the database away for close_timeout_s of this wait: stop waiting
            try:
                return await asyncio.wait_for(asyncio.shield(fut), 0.5)
            except TimeoutError:
                self._check_outage("the write is still queued", waiting_since)

    async def post(self, fn: Callable[[LogDb], Any], label: Any = None) -> None:
        """Queue ``fn(db)`` to be committed, without waiting for it (a turn's rows).
        Returns at once unless the queue is full (then it waits, off the loop, for
        room: the queue's bound is the back-pressure). A failure is logged and raised
        by the next :meth:`flush`.

        Raises:
            RuntimeError: the writer is closed.
        """
        if self._thread is None:
            self._start()
        await self._put((fn, None, None, label), drop=True)

    async def post_later(
        self, build: Callable[[], Callable[[LogDb], Any]], label: Any = None
    ) -> None:
        """Like :meth:`post`, for a job built by ``build()`` on the loop's next turn:
        the caller (a finished turn) returns before its rows are even built, and the
        building runs while the loop would otherwise wait (measured: 61 µs per one-step
        turn). Jobs keep their order: anything queued later builds the pending ones
        first. When the queue is half full the job is built and queued now, with
        :meth:`post`'s back-pressure. A ``build`` that raises counts as a failed job.

        Raises:
            RuntimeError: the writer is closed.
        """
        if self._thread is None:
            self._start()
        if self._queue.qsize() * 2 >= self._queue.maxsize > 0:
            self._drain_builds()
            await self.post(build(), label)
            return
        self._builds.append((build, label))
        if len(self._builds) == 1:
            asyncio.get_running_loop().call_soon(self._drain_builds)

    @property
    def jobs_pending_build(self) -> int:
        """Jobs given to :meth:`post_later` and not yet built and queued."""
        return len(self._builds)

    def _drain_builds(self) -> None:
        """Build the pending :meth:`post_later` jobs and queue them, in order."""
        if not self._builds:
            return
        builds, self._builds = self._builds, []
        for build, label in builds:
            try:
                fn = build()
            except Exception as e:
                self._failed(e, label)
                continue
            if self.stopped is not None:
                self._failed(self.stopped, label)
                continue
            try:
                self._queue.put_nowait((fn, None, None, label))
            except queue.Full:  # only past post_later's half-full check: wait here
                if self.network:
                    self._drop((fn, None, None, label))
                else:
                    self._queue.put((fn, None, None, label))
        self._fail_queued_if_stopped()

    def _failed(self, error: BaseException, label: Any = None) -> None:
        self.failed += 1
        if self._error is None:
            self._error = error
        with self._lock:
            self.lost.append((label, error))
            self._lost_unraised.append((label, error))
        if isinstance(error, LogWriterStopped):
            return  # said once, when the thread stopped
        what = f" ({label})" if label is not None else ""
        log.error("run log %s: a write%s failed and was rolled back: %r", self.name, what, error)

    def take_lost(self) -> list[tuple[Any, BaseException]]:
        """The failed posted jobs (label, error) since the last call, oldest first."""
        with self._lock:
            out, self._lost_unraised = self._lost_unraised, []
        return out

    async def _put(self, job: Job, *, drop: bool) -> None:
        """Queue ``job``; when the queue is full, wait for room off the loop, or (a posted
        job of a log on the network) drop it.

        Raises:
            LogWriterStopped: the writer thread has stopped and ``job`` has a waiter
                (a posted job is counted as lost instead, raised by the next flush).
        """
        if self.stopped is not None:
            _, _, fut, label = job
            if fut is None:
                self._failed(self.stopped, label)
                return
            raise self.stopped
        self._drain_builds()  # earlier jobs first
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            if self.network and drop:
                self._drop(job)
            elif self.network:
                await asyncio.to_thread(self._put_while_reachable, job)
            else:
                await asyncio.to_thread(self._queue.put, job)
        self._fail_queued_if_stopped()

    def _raise_if_stopped(self) -> None:
        if self.stopped is not None:
            raise self.stopped

    def _fail_queued_if_stopped(self) -> None:
        """After a put: if the thread stopped meanwhile, fail what is queued (the job just
        put included). The thread sets :attr:`stopped` before it fails its queue, so a
        job put before that is failed by the thread and one put after it is failed here."""
        if self.stopped is not None:
            self._fail_queue(self.stopped)

    def _check_outage(self, what: str, waiting_since: float) -> None:
        """Raise :class:`LogWriteLost` once the caller, waiting since ``waiting_since``
        (monotonic s), has waited ``close_timeout_s`` while the database could not be
        reached: the part of its wait inside the current outage counts, so a caller that
        starts waiting just after a long outage ended (the writer about to commit) waits
        its full ``close_timeout_s``, not none of it."""
        since = self.outage_since
        if since is None:
            return
        now = time.monotonic()
        if now - max(since, waiting_since) > self.close_timeout_s:
            raise LogWriteLost(f"run log {self.name}: the database has been unreachable for "
                               f"{now - since:.0f} s; {what}", log=self.name)  # fmt: skip

    def _put_while_reachable(self, job: Job) -> None:
        """Wait for room in the queue (a worker thread), at most until the outage has
        lasted ``close_timeout_s`` of this wait; then the job is counted as dropped."""
        waiting_since = time.monotonic()
        while True:
            try:
                self._queue.put(job, timeout=0.5)
                return
            except queue.Full:
                try:
                    self._check_outage("the queue is full", waiting_since)
                except LogWriteLost:
                    self.dropped += 1
                    raise

    def _drop(self, job: Job) -> None:
        """Drop a job the full queue has no room for (a log on the network only): count
        it, say so (at most every :data:`WARN_EVERY_S` seconds), fail its future."""
        self.dropped += 1
        self._dropped_in_outage += 1
        now = time.monotonic()
        if self._dropped_in_outage == 1 or now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "run log %s: the write queue is full (%d) while the database cannot be "
                "reached: turns are still answered, their log writes are being dropped "
                "(%d so far)", self.name, self._queue.maxsize, self.dropped,
            )  # fmt: skip
        _, loop, fut, _ = job
        if fut is not None and loop is not None:
            error = LogWriteLost(f"run log {self.name}: the write was dropped (queue full while "
                                 "the database could not be reached)", log=self.name)  # fmt: skip
            try:
                loop.call_soon_threadsafe(_resolve, fut, None, error)
            except RuntimeError:
                pass

    def status(self) -> dict[str, Any]:
        """The writer's state: ``{"state", "queued", "max_queue", "lost_writes",
        "outages", "outage_s"}``. ``state`` is ``ok``; ``retrying`` while the database
        cannot be reached and nothing was dropped yet in this outage; ``losing`` once
        writes are being dropped; ``stopped`` once the writer thread has stopped on an
        error (:class:`LogWriterStopped`: nothing more is written). ``lost_writes`` counts
        the writes dropped since the writer started and the posted writes that failed;
        ``outage_s`` is how long the current outage has lasted (None: none)."""
        since = self.outage_since
        state = "losing" if self._dropped_in_outage else ("ok" if since is None else "retrying")
        if self.stopped is not None:
            state = "stopped"
        return {
            "state": state,
            "queued": self._queue.qsize() + len(self._builds),
            "max_queue": self._queue.maxsize,
            "lost_writes": self.dropped + len(self.lost),
            "outages": self.outages,
            "outage_s": None if since is None else round(time.monotonic() - since, 3),
        }

    async def flush(self) -> None:
        """Wait until every job queued before this call is committed.

        Raises:
            The first failure of a posted job since the last flush (its turn is not in
            the log; the other jobs of its batch are).
            LogWriterStopped: the writer thread has stopped (at once, or as soon as it
                stops while this waits); the posted turns it did not commit are lost.
        """
        if self._thread is not None and not self._closed:
            try:
                await self.submit(lambda db: None)  # builds pending jobs first (_put)
            except LogWriterStopped:
                self._error = None  # the same stop, said once
                raise
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Commit what is queued, then stop the thread and close its connection (blocks).
        With ``network``, at most ``close_timeout_s`` seconds of retrying an unreachable
        database; what is still queued then is counted as dropped, with a warning line."""
        self._drain_builds()
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._give_up_at = time.monotonic() + self.close_timeout_s
            self._closing.set()
            while thread.is_alive():  # a stopped thread takes no sentinel
                try:
                    self._queue.put(None, timeout=0.5)
                    break
                except queue.Full:
                    continue
            thread.join()
            self._fail_queued_if_stopped()
        if self.dropped:
            log.warning("run log %s: %d log writes were lost in all while the database could "
                        "not be reached (%d outages)", self.name, self.dropped,
                        self.outages)  # fmt: skip

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        batch: list[Job] = []
        try:
            self._serve(batch)
        except BaseException as e:  # the thread stops: nobody may wait for it any more
            self._stop_on(e, batch)

    def _stop_on(self, error: BaseException, batch: list[Job]) -> None:
        """The thread is stopping on ``error``: say it, fail the batch in hand and every
        queued job (a waiter gets :class:`LogWriterStopped`, a posted turn is counted as
        lost and raised by the next flush)."""
        self.stopped = LogWriterStopped(
            f"run log {self.name}: the log's writer thread stopped ({error!r}); writes "
            "not yet committed are lost and no more can be written by this process",
            log=self.name,
        )
        self.stopped.__cause__ = error
        log.error("%s", self.stopped, exc_info=error)
        self._fail_jobs(batch, self.stopped)
        self._fail_queue(self.stopped)

    def _fail_queue(self, error: LogWriterStopped) -> None:
        jobs: list[Job] = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                jobs.append(job)
        self._fail_jobs(jobs, error)

    def _fail_jobs(self, jobs: list[Job], error: LogWriterStopped) -> None:
        for _, loop, fut, label in jobs:
            if fut is None or loop is None:
                self._failed(error, label)
                continue
            try:
                loop.call_soon_threadsafe(_resolve, fut, None, error)
            except RuntimeError:  # that loop has closed; its caller is gone
                pass

    def _serve(self, batch: list[Job]) -> None:
        """The thread's loop: take batches from the queue and commit them until the
        sentinel; ``batch`` holds the batch in hand (for :meth:`_stop_on`)."""
        db: LogDb
        if self._connect is not None:
            db = self._connect()
        else:
            assert self.path is not None
            db = SqliteLogDb(open_connection(self.path))
        wal = isinstance(db, SqliteLogDb) and self.path is not None  # checkpoints: SQLite's
        try:
            stop = False
            dirty = False  # committed since the WAL was last emptied
            while not stop:
                try:
                    first = self._queue.get(timeout=self.idle_checkpoint_s if dirty else None)
                except queue.Empty:  # idle: empty the WAL while nobody writes
                    assert isinstance(db, SqliteLogDb)
                    dirty = not self._checkpoint(db.db)
                    continue
                if first is None:
                    break
                dirty = wal
                batch[:] = [first]
                while len(batch) < self.max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    batch.append(nxt)
                self._commit(db, batch)
                batch.clear()
        finally:
            db.close()

    def _checkpoint(self, db: sqlite_utils.Database) -> bool:
        """Checkpoint the WAL and truncate it (``TRUNCATE`` mode), waiting at most
        :data:`CHECKPOINT_BUSY_MS` for readers; True when the WAL is empty. Warns once
        when a reader has kept it from completing for ``blocked_warning_s``."""
        conn = db.conn
        try:
            conn.execute(f"pragma busy_timeout = {CHECKPOINT_BUSY_MS}")
            busy, frames, done = conn.execute("pragma wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as e:  # the log must not fail over housekeeping
            log.debug("run log %s: checkpoint failed: %r", self.path, e)
            return False
        finally:
            conn.execute("pragma busy_timeout = 10000")
        if not busy:
            self.checkpoints += 1
            self._blocked_since, self._warned = None, False
            return True
        now = time.monotonic()
        if self._blocked_since is None:
            self._blocked_since = now
        held = now - self._blocked_since
        if held >= self.blocked_warning_s and not self._warned:
            self._warned = True
            assert self.path is not None
            wal = self.path.with_name(self.path.name + "-wal")
            size = wal.stat().st_size if wal.exists() else 0
            log.warning(
                "run log %s: a reader blocks checkpoints (a transaction open for %.0f s or "
                "more); the WAL file is %.1f MB (%d frames, %d checkpointed) and grows until "
                "that reader ends its transaction",
                self.path, held, size / 1e6, frames, done,
            )  # fmt: skip
        return False

    def _commit(self, db: LogDb, batch: list[Job]) -> None:
        """Run ``batch`` in one transaction; if a job fails, roll back and run each job
        in a transaction of its own, so that the failing one rolls back alone. With
        ``network``, a batch that failed for want of a connection is tried again until
        it goes through (or the writer gives up at close).

        Optimistic: no savepoint per job (each is two more database calls, and every
        call hands the GIL to the event loop and back); jobs are SQL writes, so
        running one again after a rollback is safe.
        """
        outcomes = self._retrying(db, batch) if self.network else self._attempt(db, batch)
        self.jobs += len(batch)
        self._deliver(batch, outcomes)

    def _attempt(self, db: LogDb, batch: list[Job]) -> list[tuple[Any, BaseException | None]]:
        """One try of ``batch``: its outcomes (a failed job's is its exception). A network
        error is raised (with ``network``) instead of failing the job."""
        unreachable = db.network_errors if self.network else ()
        try:
            return self._transaction(db, batch)
        except unreachable:
            raise
        except Exception as e:
            if len(batch) == 1:
                return [(None, e)]
            self.retried += 1
            outcomes: list[tuple[Any, BaseException | None]] = []
            for job in batch:
                try:
                    outcomes += self._transaction(db, [job])
                except unreachable:
                    raise
                except Exception as one:
                    outcomes.append((None, one))
            return outcomes

    def _retrying(self, db: LogDb, batch: list[Job]) -> list[tuple[Any, BaseException | None]]:
        delay = 0.05
        while True:
            tried_at = time.monotonic()
            try:
                outcomes = self._attempt(db, batch)
            except db.network_errors as e:
                if self.outage_since is None:  # from the try that failed, not its timeout
                    self.outage_since = tried_at
                    self.outages += 1
                    log.warning(
                        "run log %s: the database cannot be reached (%s); turns are still "
                        "answered, their writes queue (at most %d) and are retried",
                        self.name, _first_line(e), self._queue.maxsize,
                    )  # fmt: skip
                if time.monotonic() >= self._give_up_at:
                    self.dropped += len(batch)
                    error = LogWriteLost(f"run log {self.name}: the database could not be "
                                         "reached before the writer closed",
                                         log=self.name)  # fmt: skip
                    return [(None, error)] * len(batch)
                time.sleep(delay)
                delay = min(delay * 2, 0.5 if self._closing.is_set() else 1.0)
                continue
            if self.outage_since is not None:
                began = min(self.outage_since, self._readers_failing_since or float("inf"))
                log.warning(
                    "run log %s: the database is back after %.1f s; the queued writes are "
                    "being committed%s", self.name, time.monotonic() - began,
                    f" ({self._dropped_in_outage} were dropped)" if self._dropped_in_outage
                    else "",
                )  # fmt: skip
                self.outage_since = None
                self._dropped_in_outage = 0
            self._readers_failing_since = None  # the database answered the writer
            return outcomes

    def note_unreachable(self, at: float) -> None:
        """A reader of this log (a conversation's claim or history read) found the
        database unreachable at ``at`` (monotonic s). The outage the writer says is over
        (``the database is back after N s``) is counted from the first such failure since
        its last commit when that came before its own first failed try: a writer with
        nothing to write while the server was away (the turns waiting out the outage, ``[log]
        outage_wait_s``) finds its connection broken only once the server is back, and
        its own count is then a retry's 0.1 s. Safe to call from any thread."""
        if self._readers_failing_since is None:
            self._readers_failing_since = at

    def _transaction(self, db: LogDb, batch: list[Job]) -> list[tuple[Any, BaseException | None]]:
        """``batch`` in one transaction: its outcomes, or raises (rolled back) when a job
        (or the commit) fails. On SQLite the write lock is taken at the start (``BEGIN
        IMMEDIATE``), so a concurrent writer makes this wait (busy timeout) rather than
        fail (as the store's own writes do)."""
        with db.transaction():
            results = [fn(db) for fn, _, _, _ in batch]
        self.commits += 1
        return [(r, None) for r in results]

    def _deliver(self, batch: list[Job], outcomes: list[tuple[Any, BaseException | None]]) -> None:
        for (_, loop, fut, label), (result, error) in zip(batch, outcomes, strict=True):
            if fut is None or loop is None:  # posted: nobody waits, a failure is kept
                if error is not None and not isinstance(error, LogWriteLost):
                    self._failed(error, label)  # (a dropped write is counted and said apart)
                continue
            try:
                loop.call_soon_threadsafe(_resolve, fut, result, error)
            except RuntimeError:  # that loop has closed; its caller is gone
                pass


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
