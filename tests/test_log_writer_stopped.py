"""A log writer thread that stops on an error of its own, on both backends: nobody waits
for it. A flush, a waiting write, a turn id reservation and ``close`` return at once
with :class:`LogWriterStopped` (a chainrun error, type ``log_write``); the posted turns
it had not committed are counted and named as lost; ``/readyz``'s state says
``stopped``."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from log_backends import BACKENDS, log_target

from chainrun.errors import ChainrunError, LogWriteError
from chainrun.log.backend import LogDb
from chainrun.log.rows import TurnLog, TurnRow
from chainrun.log.store import Store
from chainrun.log.writer import LogWriter, LogWriterStopped

#: s a call may take before the test calls it a hang (a stopped writer answers at once)
PATIENCE_S = 10.0


class EscapedError(BaseException):
    """An error no job handler catches (it is no ``Exception``): it escapes the batch and
    stops the thread, as a bug in the writer's own code would."""


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with log_target(request.param, tmp_path) as t:
        yield t


async def test_a_thread_stopped_mid_batch_fails_every_waiter_at_once(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Turns queued behind the batch that stopped the thread are counted as lost and named
    by the flush; a write that was waiting gets the error; later writes fail at once."""
    caplog.set_level(logging.ERROR, logger="chainrun.log.writer")
    with Store.open(target) as s:
        writer = s.writer
        assert writer is not None
        run = await s.acreate_run("replay", "{}")
        kept = [await s.alog_turn(run, TurnLog(TurnRow(input=f"kept {i}"))) for i in range(3)]
        await asyncio.wait_for(s.flush(), PATIENCE_S)

        gate = threading.Event()

        def stuck_then_escape(db: LogDb) -> None:
            gate.wait(PATIENCE_S)
            raise EscapedError("the writer's own code failed")

        await writer.post(stuck_then_escape)
        lost = [await s.alog_turn(run, TurnLog(TurnRow(input=f"lost {i}", request_id=f"r{i}")))
                for i in range(4)]  # fmt: skip
        waiting = asyncio.ensure_future(writer.submit(lambda db: "never"))
        await asyncio.sleep(0.05)  # the turns' rows are built and queued behind the batch
        gate.set()
        with pytest.raises(LogWriterStopped) as stopped:
            await asyncio.wait_for(waiting, PATIENCE_S)
        assert isinstance(stopped.value, ChainrunError) and stopped.value.error_type == "log_write"
        assert "the log's writer thread stopped" in str(stopped.value)
        assert "EscapedError" in str(stopped.value)
        with pytest.raises(LogWriteError) as flushed:  # the lost turns, named
            await asyncio.wait_for(s.flush(), PATIENCE_S)
        assert sorted(t.turn_id for t in flushed.value.lost) == sorted(lost)
        assert isinstance(flushed.value.__cause__, LogWriterStopped)
        # later: a posted turn is counted lost, a waiting write and a flush raise at once
        late = await asyncio.wait_for(s.alog_turn(run, TurnLog(TurnRow(input="late"))),
                                      PATIENCE_S)  # fmt: skip
        with pytest.raises(LogWriterStopped):
            await asyncio.wait_for(writer.submit(lambda db: None), PATIENCE_S)
        with pytest.raises(LogWriteError):
            await asyncio.wait_for(s.flush(), PATIENCE_S)
        status = s.log_status()
        assert status["state"] == "stopped" and status["lost_writes"] == len(lost) + 2
        assert {t.turn_id for t in s.lost_turns(run)} == {*lost, late}
        assert sorted(t.id for t in s.turns(run)) == sorted(kept)  # committed ones stay
    said = [r.getMessage() for r in caplog.records]
    assert sum("writer thread stopped" in m for m in said) == 1, said  # said once


async def test_a_thread_that_cannot_open_its_connection_fails_flush_at_once(
    tmp_path: Path,
) -> None:
    """The writer thread's connection cannot be opened: the first flush raises instead
    of waiting, and close returns."""

    def cannot_connect() -> LogDb:
        raise OSError("unable to open database file")

    writer = LogWriter(None, connect=cannot_connect, name="log.db")
    await writer.post(lambda db: None, label={"turn_id": 1, "request_id": "a", "run_id": 1})
    with pytest.raises(LogWriterStopped, match="unable to open database file"):
        await asyncio.wait_for(writer.flush(), PATIENCE_S)
    with pytest.raises(LogWriterStopped):
        await asyncio.wait_for(writer.future(lambda db: 1), PATIENCE_S)
    assert [label for label, _ in writer.take_lost()] == [
        {"turn_id": 1, "request_id": "a", "run_id": 1}
    ]
    await asyncio.wait_for(asyncio.to_thread(writer.close), PATIENCE_S)
    assert writer.status()["state"] == "stopped"


async def test_every_failed_log_write_is_a_log_write_error(tmp_path: Path) -> None:
    """A write dropped with the database away (``LogWriteLost``) and a writer thread that
    stopped (``LogWriterStopped``) are caught as :class:`LogWriteError`, the one class
    for "a log write failed" (they were chainrun errors of their own, so code catching
    it let them through); they name no turn (``lost`` is empty) and keep their type."""
    Store.open(tmp_path / "log.db").close()  # a log file for the writer to write
    gate = threading.Event()
    # a network writer whose queue is full drops the write at once (a log on the network)
    full = LogWriter(tmp_path / "log.db", network=True, max_queue=1, name="log.db")
    try:
        await full.post(lambda db: gate.wait(PATIENCE_S))  # the thread holds this one
        await asyncio.sleep(0.2)
        await full.post(lambda db: None)  # fills the queue
        with pytest.raises(LogWriteError) as dropped:
            await asyncio.wait_for(full.future(lambda db: 1), PATIENCE_S)
    finally:
        gate.set()
        await asyncio.to_thread(full.close)

    def cannot_connect() -> LogDb:
        raise OSError("unable to open database file")

    stopped = LogWriter(None, connect=cannot_connect, name="log.db")
    await stopped.post(lambda db: None)
    with pytest.raises(LogWriteError) as gone:
        await asyncio.wait_for(stopped.flush(), PATIENCE_S)
    await asyncio.wait_for(asyncio.to_thread(stopped.close), PATIENCE_S)
    for error, kind in ((dropped.value, "log_write_lost"), (gone.value, "log_writer_stopped")):
        assert error.as_dict()["type"] == kind and error.error_type == "log_write"
        assert error.lost == [] and error.lines() == [] and error.log == "log.db"
    assert "queue full" in str(dropped.value) and "writer thread stopped" in str(gone.value)
