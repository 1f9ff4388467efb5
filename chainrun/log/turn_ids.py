"""Turn ids known before the turn's row is committed: blocks reserved in the log.

A turn returns to its caller (``TurnFinished.turn_id``) before the writer thread has
committed its row (:mod:`chainrun.log.writer`), so its id cannot come from SQLite's
``INTEGER PRIMARY KEY`` assignment at insert time. Instead each process reserves a
block of ids in the log's ``_turn_ids`` table (one row: the next id nobody holds) and
hands them out in order; every turn insert of chainrun carries its id. Two processes
writing one log reserve disjoint blocks under SQLite's write lock (``BEGIN
IMMEDIATE``), so their ids never collide; a block's unused tail is given back on close
when no other process has reserved after it, so one writer's ids stay contiguous. A
process that crashes leaves a gap (ids are keys, not counts: ``n_turns`` and every
count come from the rows).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from chainrun.log.backend import LogDb

__all__ = ["BLOCK", "TurnIds", "release", "reserve"]

#: ids reserved at once: one writer-thread round trip per 256 turns (the next block is
#: fetched when half of the current one is used, so a turn rarely waits for it)
BLOCK = 256

Block = tuple[int, int]  # [start, end)


def reserve(db: LogDb, n: int) -> Block:
    """Reserve ``n`` turn ids: ``[start, start + n)``, inside the caller's (write)
    transaction. ``start`` is past every id already in ``turns`` (rows written before
    the ``_turn_ids`` table existed, or by a writer that did not reserve)."""
    if db.dialect == "postgresql":
        floor = "(select coalesce(max(id), 0) + 1 from turns)"
        end = db.scalar(
            f"insert into _turn_ids (id, next_id) values (1, {floor} + ?) on conflict (id) "
            f"do update set next_id = greatest(_turn_ids.next_id, {floor}) + ? "
            "returning next_id",
            [n, n],
        )
        return int(end) - n, int(end)
    row = db.execute(
        "select max(coalesce((select next_id from _turn_ids where id = 1), 1), "
        "coalesce((select max(id) from turns), 0) + 1)"
    ).fetchone()
    start = int(row[0])
    db.execute(
        "insert into _turn_ids (id, next_id) values (1, ?) "
        "on conflict (id) do update set next_id = excluded.next_id",
        [start + n],
    )
    return start, start + n


def release(db: LogDb, newest_end: int, first_unused: int) -> bool:
    """Give back ``[first_unused, newest_end)`` if no one reserved after ``newest_end``
    (inside the caller's write transaction). Returns whether it was given back."""
    cur = db.execute(
        "update _turn_ids set next_id = ? where id = 1 and next_id = ?",
        [first_unused, newest_end],
    )
    return cur.rowcount == 1


Job = Callable[[LogDb], Block]


class TurnIds:
    """Hands out turn ids from blocks reserved in the log, in order.

    Args:
        on_writer: ``(job) -> awaitable``: run ``job(conn)`` in a write transaction off
            the event loop (the log writer thread) and give its result.
        here: ``(job) -> result``: the same on this thread (sync writes).
        block: ids per reservation (:data:`BLOCK`).
    """

    def __init__(
        self,
        on_writer: Callable[[Job], Awaitable[Block]],
        here: Callable[[Job], Block],
        *,
        block: int = BLOCK,
    ) -> None:
        self._on_writer = on_writer
        self._here = here
        self.block = block
        self._next = 0
        self._end = 0  # the current block is [.., _end); _next the next id to hand out
        self._pending: asyncio.Future[Block] | None = None
        #: every block reserved, in order (appended by the thread that reserved it)
        self.reserved: list[Block] = []
        self._lock = threading.Lock()

    def _job(self, db: LogDb) -> Block:
        got = reserve(db, self.block)
        with self._lock:
            self.reserved.append(got)
        return got

    def _prefetch(self) -> asyncio.Future[Block]:
        fut = asyncio.ensure_future(self._on_writer(self._job))
        self._pending = fut
        return fut

    def prefetch(self) -> None:
        """Start reserving a block now, off the loop, when none is held or coming (a
        writing process calls it as it creates its run, so that its turns find ids
        reserved even if the database goes away just after)."""
        if self._pending is None and self._next >= self._end:
            self._prefetch()

    async def take(self) -> int:
        """The next turn id (awaits a reservation only when no reserved id is left).

        Raises:
            Whatever the reservation raised (the log could not be written).
        """
        pending = self._pending
        if pending is not None and not pending.done():
            if pending.get_loop() is not asyncio.get_running_loop():
                # fetched ahead on an event loop that has ended (a store used by one
                # asyncio.run after another): that block is reserved anyway, a gap at most
                self._pending = None
        while self._next >= self._end:
            fut = self._pending or self._prefetch()
            try:
                start, end = await asyncio.shield(fut)
            except BaseException:
                if self._pending is fut and fut.done():
                    self._pending = None  # a failed reservation: the next take retries
                raise
            if self._pending is fut:  # the first waiter installs the block
                self._pending = None
                self._next, self._end = start, end
        turn_id = self._next
        self._next += 1
        if self._pending is None and self._end - self._next < self.block // 2:
            self._prefetch()
        return turn_id

    def take_sync(self) -> int:
        """The next turn id, reserving on this thread when none is left (sync writes)."""
        if self._next >= self._end:
            self._next, self._end = self._here(self._job)
        turn_id = self._next
        self._next += 1
        return turn_id

    def unused_tail(self) -> tuple[int, int] | None:
        """``(newest_end, first_unused)`` for :func:`release`: the ids reserved but not
        handed out at the end of the newest reservations, or None when there are none.
        Call once nothing else takes ids (the writer thread has stopped)."""
        with self._lock:
            blocks = list(self.reserved)
        if not blocks:
            return None
        newest_end = first_unused = blocks[-1][1]
        for start, end in reversed(blocks):  # contiguous blocks from the newest back
            if end != first_unused:
                break
            if end == self._end:  # the current block: used up to _next
                first_unused = self._next
                break
            first_unused = start  # fetched ahead, never used
        return (newest_end, first_unused) if first_unused < newest_end else None
