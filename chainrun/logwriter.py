"""The run log's writer thread: log writes leave the event loop.

A :class:`LogWriter` owns one thread with its own SQLite connection (a connection is
bound to the thread that made it; in WAL mode readers on other connections go on
reading while it writes). The event loop hands it jobs (``fn(db) -> T``) and awaits
an ``asyncio`` future per job; the thread takes every job waiting in its queue (up to
``max_batch``), runs them in one transaction, one savepoint per job (a job that fails
rolls back alone and its future gets the exception), commits, and resolves the
futures on their loops. Nothing waits for a timer: a lone turn's write is committed
at once, and under load the turns that finished meanwhile share one commit.

Durability (see README "Run log writes"): a job's future resolves only after its
commit, so a turn whose ``TurnFinished`` was yielded is in the file. A process crash
loses only jobs still queued or in the open transaction: turns that had not finished
(their ``run_turn`` had not returned) and shadow-loser updates not yet committed.
With ``synchronous = NORMAL`` a power loss (not a process crash) can also lose the
last commits since the WAL was synced (SQLite docs, "WAL mode"); the file stays
consistent either way.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

__all__ = ["LogWriter", "open_connection"]

T = TypeVar("T")
Job = tuple[
    Callable[[sqlite_utils.Database], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"
]


def open_connection(path: Path) -> sqlite_utils.Database:
    """A connection to an existing WAL log with the store's pragmas (busy wait 10 s)."""
    db = sqlite_utils.Database(str(path))
    db.execute("pragma synchronous = normal")
    db.execute("pragma busy_timeout = 10000")
    return db


def _resolve(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class LogWriter:
    """One writer thread for the log file ``path``, started at the first job.

    Args:
        path: the SQLite file (already created and migrated by the store).
        max_batch: jobs committed together at most (64).
        max_queue: jobs waiting at most; a caller beyond it waits (in a worker thread,
            not on the loop) for room, so memory stays bounded (10,000).
    """

    def __init__(self, path: Path, *, max_batch: int = 64, max_queue: int = 10_000) -> None:
        self.path = path
        self.max_batch = max_batch
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.commits = 0  # transactions committed (for benchmarks: jobs / commits = batch size)
        self.jobs = 0

    def _start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the log writer is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"chainrun-log-writer:{self.path.name}", daemon=True
                )
                self._thread.start()

    async def submit(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run ``fn(db)`` on the writer's connection inside a transaction; its result.

        Raises:
            Whatever ``fn`` raised (its writes are rolled back, the batch's others kept).
            RuntimeError: the writer is closed.
        """
        if self._thread is None:
            self._start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        job: Job = (fn, loop, fut)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            await asyncio.to_thread(self._queue.put, job)
        # shielded: a cancelled caller does not undo a queued write, it just stops waiting
        return await asyncio.shield(fut)

    async def flush(self) -> None:
        """Wait until every job submitted before this call is committed."""
        if self._thread is not None and not self._closed:
            await self.submit(lambda db: None)

    def close(self) -> None:
        """Commit what is queued, then stop the thread and close its connection (blocks)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        db = open_connection(self.path)
        try:
            stop = False
            while not stop:
                first = self._queue.get()
                if first is None:
                    break
                batch = [first]
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
        finally:
            db.close()

    def _commit(self, db: sqlite_utils.Database, batch: list[Job]) -> None:
        outcomes: list[tuple[Any, BaseException | None]] = []
        try:
            # IMMEDIATE: take the write lock at the start, so a concurrent writer makes
            # this wait (busy timeout) rather than fail (as the store's own writes do)
            db.conn.execute("BEGIN IMMEDIATE")
            with db.atomic():  # inside the open transaction: a savepoint; COMMIT below
                for fn, _, _ in batch:
                    try:
                        with db.atomic():  # a savepoint: a failing job rolls back alone
                            outcomes.append((fn(db), None))
                    except Exception as e:
                        outcomes.append((None, e))
            db.conn.execute("COMMIT")
        except Exception as e:  # the commit itself failed: every job of the batch failed
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            outcomes = [(None, e)] * len(batch)
        else:
            self.commits += 1
        self.jobs += len(batch)
        for (_, loop, fut), (result, error) in zip(batch, outcomes, strict=True):
            try:
                loop.call_soon_threadsafe(_resolve, fut, result, error)
            except RuntimeError:  # that loop has closed; its caller is gone
                pass
