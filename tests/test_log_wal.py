"""The log's WAL file: bounded while a process keeps the log open.

Before: the -wal file grew without bound while a reader held a transaction (no
checkpoint can pass a reader's snapshot) and was never truncated afterwards while the
writing process kept the log open. Now the log sets a journal size limit, the writer
thread checkpoints (and truncates) the WAL when it is idle, and it warns once when a
reader has blocked checkpoints for long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from sqlite_utils.utils import sqlite3  # the log's own SQLite library: see reader below

from chainrun.log.store import Store
from chainrun.log.writer import JOURNAL_SIZE_LIMIT_BYTES, LogWriter

ROW = "x" * 4000  # about a page a row: 300 rows write over 0.5 MB of WAL


def _wal_size(db: Path) -> int:
    wal = db.with_name(db.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _write_rows(writer: LogWriter, n: int) -> None:
    for _ in range(n):
        await writer.post(lambda db: db.execute("insert into scratch (v) values (?)", [ROW]))
    await writer.flush()


async def _wait_for(cond: object, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.02)
    return False


def test_the_log_sets_a_journal_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    store = Store.open(path)
    try:
        limit = store.db.execute("pragma journal_size_limit").fetchone()[0]
        assert limit == JOURNAL_SIZE_LIMIT_BYTES > 0
    finally:
        store.close()


async def test_the_wal_is_truncated_when_the_writer_is_idle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log.db"
    store = Store.open(path)
    store.db.execute("create table scratch (v text)")
    # the log's own writer thread (one per store), with short timers for the test
    writer = store.writer
    assert writer is not None
    writer.idle_checkpoint_s, writer.blocked_warning_s = 0.2, 0.3
    # the same SQLite library as the log's (pysqlite3): two copies of SQLite in one process
    # do not see each other's locks, and a checkpoint would pass the reader
    reader = sqlite3.connect(path)
    try:
        # a reader holding a transaction: no checkpoint can pass its snapshot
        reader.execute("begin")
        reader.execute("select count(*) from scratch").fetchone()
        with caplog.at_level(logging.WARNING, logger="chainrun.log.writer"):
            await _write_rows(writer, 150)
            await asyncio.sleep(0.4)
            await _write_rows(writer, 150)
            grown = _wal_size(path)
            assert grown > 500_000  # the WAL grew past the reader's snapshot
            # the writer says who blocks it, once, with the WAL's size
            assert await _wait_for(lambda: any(
                "blocks checkpoints" in r.getMessage() for r in caplog.records))  # fmt: skip
        warnings = [r for r in caplog.records if "blocks checkpoints" in r.getMessage()]
        assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
        reader.execute("commit")
        # the reader is gone and the writer idle: the WAL is checkpointed and truncated,
        # with the writing process still holding the log open
        assert await _wait_for(lambda: _wal_size(path) == 0), _wal_size(path)
        assert await _wait_for(lambda: writer.checkpoints >= 1)  # counted after it returns
        n = store.db.execute("select count(*) from scratch").fetchone()[0]
        assert n == 300  # nothing lost
    finally:
        reader.close()
        store.close()
