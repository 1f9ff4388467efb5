"""The run log's writer thread: turns are written off the event loop, once each, and
readers see a turn when ``run_turn`` returns (file logs; in-memory logs write inline)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import sqlite_utils
from conftest import reply_by_step, ticks_while

from chainrun.chain import Chain
from chainrun.config import ChainConfig, config_from_dict
from chainrun.events import TokenDelta
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.records import TurnLog, TurnRow
from chainrun.store import Store


@pytest.fixture
def file_store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "log.db")
    yield s
    s.close()


async def test_concurrent_turns_are_logged_once_each_and_visible_on_return(
    config, file_store, fake
) -> None:
    seen: list[bool] = []
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:

        async def one(i: int) -> int:
            done = await chain.run_turn(f"question {i}")
            # committed before run_turn returns: the loop's own connection reads it
            seen.append(file_store.turn(done.turn_id) is not None)
            return done.turn_id

        ids = await asyncio.gather(*(one(i) for i in range(30)))
        run_id = chain.run_id
    assert all(seen) and len(seen) == 30
    assert len(set(ids)) == 30
    turns = file_store.turns(run_id)
    assert sorted(t.input for t in turns) == sorted(f"question {i}" for i in range(30))
    assert len(file_store.calls(run_id)) == 30 * 4  # classify, compose, validate, critique
    assert file_store.get_run(run_id).n_turns == 30
    writer = file_store.writer
    assert writer is not None and writer.jobs >= 31  # 30 turns + the flush at aclose
    assert 1 <= writer.commits <= writer.jobs


async def test_a_slow_write_does_not_block_the_event_loop(file_store) -> None:
    """The write runs on the writer thread: the loop keeps ticking while it sleeps."""
    assert file_store.writer is not None
    loop_thread = threading.get_ident()
    where: list[int] = []

    def slow(db: sqlite_utils.Database) -> str:
        where.append(threading.get_ident())
        time.sleep(0.3)
        return "done"

    result, ticks = await ticks_while(file_store.writer.submit(slow), interval_s=0.01)
    assert result == "done"
    assert where and where[0] != loop_thread
    assert ticks >= 10  # a blocked loop would tick at most once in 0.3 s


async def test_a_failing_job_rolls_back_alone(file_store) -> None:
    run_id = file_store.create_run("live", "{}")
    writer = file_store.writer
    assert writer is not None

    def bad(db: sqlite_utils.Database) -> None:
        db.execute("insert into turns (run_id, input, status) values (?, 'half', 'ok')", [run_id])
        raise ValueError("boom")

    good = file_store.alog_turn(run_id, TurnLog(TurnRow(input="whole", started_at="t"), [], []))
    results = await asyncio.gather(writer.submit(bad), good, return_exceptions=True)
    assert isinstance(results[0], ValueError)
    assert isinstance(results[1], int)
    assert [t.input for t in file_store.turns(run_id)] == ["whole"]


def test_close_commits_what_is_queued(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    run_id = store.create_run("live", "{}")

    async def queue_without_waiting() -> None:
        for i in range(5):
            row = TurnLog(TurnRow(input=f"t{i}", started_at="t"), [], [])
            asyncio.get_running_loop().create_task(store.alog_turn(run_id, row))
        await asyncio.sleep(0)  # the tasks put their jobs on the queue
        store.close()  # drains the queue before the thread stops
        await asyncio.sleep(0.05)  # let the futures resolve before the loop closes

    asyncio.run(queue_without_waiting())
    with Store.open(tmp_path / "log.db") as again:
        assert sorted(t.input for t in again.turns(run_id)) == [f"t{i}" for i in range(5)]


async def test_cancelled_turns_are_still_logged_through_the_writer(config, file_store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(" ".join(["word"] * 200), ttft_s=0.001, gap_s=0.01),
    }))  # fmt: skip
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:
        it = chain.stream_turn("closed early")
        n = 0
        async for ev in it:
            if isinstance(ev, TokenDelta):
                n += 1
                if n == 3:
                    break
        await it.aclose()
        task = asyncio.create_task(chain.run_turn("task cancelled"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run_id = chain.run_id
    turns = {t.input: t for t in file_store.turns(run_id)}
    assert set(turns) == {"closed early", "task cancelled"}
    assert {t.status for t in turns.values()} == {"cancelled"}


async def test_shadow_loser_update_lands_through_the_writer(file_store) -> None:
    cfg: ChainConfig = config_from_dict({
        "providers": {"backup": {"base_url": "http://127.0.0.1:1/v1"}},
        "steps": {"classify": {"hedge": {"delay_ms": 20, "max_attempts": 2,
                                         "targets": ["backup"], "max_extra_load": 1.0,
                                         "shadow_fraction": 1.0}}},
    })  # fmt: skip
    slow = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("sizing", ttft_s=0.3),
    }))  # fmt: skip
    fast = FakeProvider(name="backup", script=FakeReply("styling", ttft_s=0.001))
    async with Chain(cfg, store=file_store, providers={"local": slow, "backup": fast}) as chain:
        done = await chain.run_turn("hello")
    calls = {c.attempt: c for c in file_store.calls(done.run_id) if c.step == "classify"}
    assert calls[1].outcome == "shadow_finished"  # rewritten after the turn was logged
    step = next(s for s in file_store.steps(done.run_id) if s.step == "classify")
    assert step.time_saved_ms is not None and step.time_saved_ms > 0
