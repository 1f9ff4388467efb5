"""The run log's writer thread: turns are written off the event loop, once each; a turn
returns once its rows are queued (its id reserved in the log), readers see it after a
flush, or on return with ``[log] durable_turns`` (file logs; in-memory logs write
inline)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from conftest import reply_by_step, ticks_while

from chainrun.chain import Chain
from chainrun.config import LLM_CLASSIFY_STEP, ChainConfig, LogConfig, config_from_dict
from chainrun.events import TokenDelta
from chainrun.log.rows import TurnLog, TurnRow
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply, words_in_sentences


@pytest.fixture
def file_store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "log.db")
    yield s
    s.close()


async def test_concurrent_turns_are_logged_once_each_with_the_ids_they_returned(
    config, file_store, fake
) -> None:
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:
        dones = await asyncio.gather(*(chain.run_turn(f"question {i}") for i in range(30)))
        await chain.flush()  # turns return once queued: committed after the flush
        for done in dones:
            logged = file_store.turn(done.turn_id)
            assert logged is not None and logged.turn.output == done.output
        run_id = chain.run_id
    ids = [d.turn_id for d in dones]
    assert sorted(ids) == list(range(1, 31))  # one reserved block, handed out in order
    turns = file_store.turns(run_id)
    assert sorted(t.id for t in turns) == sorted(ids)
    assert {d.turn_id: d.run_id for d in dones} == {t.id: t.run_id for t in turns}
    assert sorted(t.input for t in turns) == sorted(f"question {i}" for i in range(30))
    assert len(file_store.calls(run_id)) == 30 * 3  # compose, validate, critique
    assert {c.turn_id for c in file_store.calls(run_id)} == set(ids)
    assert file_store.get_run(run_id).n_turns == 30
    writer = file_store.writer
    assert writer is not None and writer.jobs >= 32  # 30 turns + reservation + the flush
    assert 1 <= writer.commits <= writer.jobs


async def test_a_turn_returns_before_its_commit_unless_durable(config, file_store, fake) -> None:
    """A writer held busy does not hold up a turn; with ``durable_turns`` it does."""
    writer = file_store.writer
    assert writer is not None
    durable_cfg = config.model_copy(update={"log": LogConfig(durable_turns=True)})
    async with (
        Chain(config, store=file_store, providers={"local": fake}) as chain,
        Chain(durable_cfg, store=file_store, providers={"local": fake}) as durable,
    ):
        await chain.run_turn("warm up")  # the runs are created, the first ids reserved
        await durable.run_turn("warm up")
        gate = threading.Event()
        held = asyncio.ensure_future(writer.submit(lambda db: gate.wait(10)))
        done = await asyncio.wait_for(chain.run_turn("while the writer is busy"), 5)
        assert file_store.turn(done.turn_id) is None  # returned, not yet committed
        waiting = asyncio.ensure_future(durable.run_turn("durable"))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # waits for its commit
        gate.set()
        await held
        durable_done = await waiting
        assert file_store.turn(durable_done.turn_id) is not None  # committed on return
        assert file_store.turn(done.turn_id) is not None  # committed before it (FIFO)
        assert durable_done.turn_id == done.turn_id + 1


async def test_two_writers_on_one_file_reserve_disjoint_turn_ids(tmp_path: Path) -> None:
    """Two stores on one file (as two processes would): ids never collide; each one's
    unused reserved ids are given back on close when no one reserved after them."""
    path = tmp_path / "log.db"
    a, b = Store.open(path), Store.open(path)
    try:
        run_a, run_b = a.create_run("live", "{}"), b.create_run("live", "{}")

        def row(name: str) -> TurnLog:
            return TurnLog(TurnRow(input=name, started_at="t"), [], [])

        got: list[tuple[str, int]] = []
        for i in range(5):
            got.append(("a", await a.alog_turn(run_a, row(f"a{i}"))))
            got.append(("b", await b.alog_turn(run_b, row(f"b{i}"))))
        got.append(("a", a.log_turn(run_a, row("a-sync"))))  # the sync path takes ids too
        await a.flush()
        await b.flush()
    finally:
        a.close()
    ids = [i for _, i in got]
    assert len(set(ids)) == len(ids)
    assert [i for who, i in got if who == "a"] == list(range(1, 7))
    assert [i for who, i in got if who == "b"] == list(range(257, 262))  # b's own block
    b.close()  # b reserved last: its unused ids go back
    with Store.open(path) as c:
        run_c = c.create_run("live", "{}")
        assert c.log_turn(run_c, row("c")) == 262
        by_id = {t.id: t.input for t in c.turns([run_a, run_b, run_c])}
    assert by_id == {**{i: n for n, i in zip([f"a{k}" for k in range(5)] + ["a-sync"],
                                             range(1, 7), strict=True)},
                     **{257 + k: f"b{k}" for k in range(5)}, 262: "c"}  # fmt: skip


async def test_a_failed_posted_write_is_logged_and_raised_by_flush(file_store) -> None:
    run_id = file_store.create_run("live", "{}")
    writer = file_store.writer
    assert writer is not None

    def bad(db: sqlite_utils.Database) -> None:
        raise ValueError("disk full")

    def bad_build() -> Any:
        raise TypeError("a row that cannot be built")

    await writer.post(bad)
    kept = await file_store.alog_turn(run_id, TurnLog(TurnRow(input="kept", started_at="t")))
    with pytest.raises(ValueError, match="disk full"):
        await file_store.flush()
    await file_store.flush()  # raised once
    await writer.post_later(bad_build)
    with pytest.raises(TypeError, match="cannot be built"):
        await file_store.flush()
    assert writer.failed == 2
    assert [t.id for t in file_store.turns(run_id)] == [kept]


async def test_a_turns_rows_are_built_after_it_returns_in_order(file_store) -> None:
    """``alog_turn`` returns before the rows are built (the loop's next turn); anything
    queued later (here a flush) builds them first, so order is kept."""
    run_id = file_store.create_run("live", "{}")
    writer = file_store.writer
    assert writer is not None
    await file_store.alog_turn(run_id, TurnLog(TurnRow(input="first", started_at="t")))
    await file_store.flush()  # ids reserved
    log = TurnLog(TurnRow(input="second", started_at="t"))
    turn_id = await file_store.alog_turn(run_id, log)
    assert writer.jobs_pending_build == 1  # not built yet
    await file_store.flush()
    assert writer.jobs_pending_build == 0
    logged = file_store.turn(turn_id)
    assert logged is not None and logged.turn.input == "second"


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
    await file_store.flush()
    assert [t.input for t in file_store.turns(run_id)] == ["whole"]


async def test_a_failing_job_in_a_batch_rolls_back_alone(file_store) -> None:
    """Jobs queued behind a busy writer share one batch; one failing job makes the
    batch run again job by job: the others are committed, once each."""
    run_id = file_store.create_run("live", "{}")
    writer = file_store.writer
    assert writer is not None
    await file_store.alog_turn(run_id, TurnLog(TurnRow(input="t0", started_at="t")))
    await file_store.flush()  # ids reserved
    gate = threading.Event()
    held = writer.future(lambda db: gate.wait(10))

    def bad(db: sqlite_utils.Database) -> None:
        db.execute("insert into turns (run_id, input, status) values (?, 'half', 'ok')", [run_id])
        raise ValueError("boom")

    ids = [await file_store.alog_turn(run_id, TurnLog(TurnRow(input="t1", started_at="t")))]
    await writer.post(bad)
    ids.append(await file_store.alog_turn(run_id, TurnLog(TurnRow(input="t2", started_at="t"))))
    gate.set()
    await held
    with pytest.raises(ValueError, match="boom"):
        await file_store.flush()
    assert writer.retried == 1
    logged = [(t.id, t.input) for t in file_store.turns(run_id)]
    assert logged[1:] == [(ids[0], "t1"), (ids[1], "t2")]


def test_close_commits_what_is_queued(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    run_id = store.create_run("live", "{}")
    assert store.writer is not None
    writer = store.writer

    async def queue_without_waiting() -> None:
        await store.alog_turn(run_id, TurnLog(TurnRow(input="t0", started_at="t")))
        await store.flush()  # ids reserved, t0 committed
        gate = threading.Event()
        await writer.post(lambda db: gate.wait(10))  # the writer is busy
        for i in range(1, 5):  # each returns once its rows are queued
            await store.alog_turn(run_id, TurnLog(TurnRow(input=f"t{i}", started_at="t")))
        assert [t.input for t in store.turns(run_id)] == ["t0"]  # queued, not committed
        threading.Timer(0.1, gate.set).start()
        store.close()  # drains the queue before the thread stops

    asyncio.run(queue_without_waiting())
    with Store.open(tmp_path / "log.db") as again:
        assert sorted(t.input for t in again.turns(run_id)) == [f"t{i}" for i in range(5)]


async def test_cancelled_turns_are_still_logged_through_the_writer(config, file_store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(words_in_sentences(200), ttft_s=0.001, gap_s=0.01),
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
        "steps": {"classify": {**LLM_CLASSIFY_STEP,  # classified by the model, hedged
                               "hedge": {"delay_ms": 20, "max_attempts": 2,
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


def test_a_store_outlives_the_event_loop_that_fetched_ids_ahead(tmp_path: Path) -> None:
    """A reservation fetched ahead on one ``asyncio.run`` does not stall the next one."""
    store = Store.open(tmp_path / "log.db")
    run_id = store.create_run("live", "{}")

    gate = threading.Event()

    async def fill_half_a_block() -> None:
        for _ in range(128):
            await store.alog_turn(run_id, TurnLog(TurnRow(input="t", started_at="t")))
        assert store.writer is not None
        await store.writer.post(lambda db: gate.wait(10))  # the writer is busy
        # past half of the first block: the next one is fetched, and not delivered
        await store.alog_turn(run_id, TurnLog(TurnRow(input="t", started_at="t")))
        pending = store._ids._pending
        assert pending is not None and not pending.done()
        threading.Timer(0.2, gate.set).start()

    async def more() -> int:
        ids = [
            await store.alog_turn(run_id, TurnLog(TurnRow(input="t", started_at="t")))
            for _ in range(200)
        ]
        await store.flush()
        return len(set(ids))

    try:
        asyncio.run(fill_half_a_block())
        assert asyncio.run(asyncio.wait_for(more(), 10)) == 200
        assert len(store.turns(run_id)) == 329
    finally:
        store.close()


_HOLD_THE_WRITE_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def hold_the_write_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process that holds ``path``'s write lock for ``seconds`` (returns once it
    has it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_WRITE_LOCK, str(path), str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


async def test_the_run_is_created_off_the_event_loop(config, tmp_path: Path, fake) -> None:
    """Another process holding the log's write lock makes the run's creation wait (busy
    timeout) on the writer thread, not on the loop: the loop keeps ticking while the
    lock is held, and many first turns at once create one run, committed before any of
    them returns.

    What is checked is that the loop ran while the creation waited (ticks inside the
    time the lock was surely held: a loop blocked on the lock would tick there not at
    all), not how long its longest pause was: on a loaded machine a running loop can
    pause 0.3 s too."""
    path = tmp_path / "log.db"
    store = Store.open(path)
    holder: subprocess.Popen[str] | None = None
    hold_s = 1.5
    try:
        async with Chain(config, store=store, providers={"local": fake}) as chain:
            loop = asyncio.get_running_loop()
            holder = hold_the_write_lock(path, hold_s)
            stamps = [loop.time()]  # the lock is held from before this until hold_s after

            async def ticker() -> None:
                while True:
                    await asyncio.sleep(0.01)
                    stamps.append(loop.time())

            ticking = asyncio.create_task(ticker())
            dones = await asyncio.gather(*(chain.run_turn(f"q{i}") for i in range(5)))
            ticking.cancel()
            assert loop.time() - stamps[0] >= 0.5 * hold_s  # the run waited for the lock
            while_held = [t for t in stamps[1:] if t < stamps[0] + 0.5 * hold_s]
            assert len(while_held) >= 3, stamps[:10]  # the loop ran meanwhile
            assert {d.run_id for d in dones} == {chain.run_id}
            assert [r.id for r in store.list_runs()] == [chain.run_id]
            assert store.get_run(chain.run_id).status == "running"
        run = store.get_run(chain.run_id)
        assert run.status == "complete" and run.n_turns == 5
    finally:
        if holder is not None:
            holder.communicate(timeout=10)  # waits and closes its pipe
        store.close()


async def test_a_run_whose_first_turn_was_cancelled_is_created_and_ended(
    config, file_store, fake
) -> None:
    """A turn cancelled while its run is being created leaves the creation running: the
    next turn logs into that run (no second run), and closing the chain ends it."""
    writer = file_store.writer
    assert writer is not None
    gate = threading.Event()
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:
        held = asyncio.ensure_future(writer.submit(lambda db: gate.wait(10)))
        first = asyncio.ensure_future(chain.run_turn("cancelled while the run is created"))
        await asyncio.sleep(0.05)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        await held
        done = await chain.run_turn("second")
        assert done.run_id == chain.run_id
    runs = file_store.list_runs()
    assert [r.id for r in runs] == [done.run_id]
    assert runs[0].status == "complete" and runs[0].n_turns == 1
