"""The run log on both backends (SQLite files and PostgreSQL) and what only PostgreSQL
adds: many processes on one log, a server that goes away and comes back, hedge windows
seeded from the fleet's log, ``chainrun log copy`` and the live window of ``compare``.

PostgreSQL is the server ``.ci/run`` starts (``CHAINRUN_TEST_POSTGRES``); the restart
tests start a private cluster of their own (Debian's ``postgresql`` binaries) so that
stopping it disturbs no other test.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from log_backends import BACKENDS, log_target, need_pg, pg_schema
from serve_helpers import kill_with_workers, workers_ready

from chainrun.analysis.summary import hedge_stats, latency_summary
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.migrations import MIGRATIONS, migrate, utc_now
from chainrun.log.reads import SeedWindows
from chainrun.log.rows import CallRow, RunRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store
from chainrun.log.time_window import log_time
from chainrun.log.turn_writes import prepare_turn
from chainrun.log.writer import LogWriteLost
from chainrun.serve import DEFAULT_MODEL_ID

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty log on each backend."""
    with log_target(request.param, tmp_path) as t:
        yield t


def a_turn(i: int, *, step: str = "answer", ttft: float = 20.0, hedged: bool = False,
           started_at: str | None = None, server: str | None = None,
           model: str | None = None) -> TurnLog:  # fmt: skip
    return TurnLog(
        TurnRow(input=f"message {i}", output=f"answer {i}", request_id=f"r{i}",
                duration_ms=100.0 + i, started_at=started_at or utc_now()),
        [StepRow(step=step, duration_ms=90.0 + i, hedge_delay_ms=50.0 if hedged else None,
                 hedge_fired=hedged, n_attempts=1)],
        [CallRow(step=step, stream=True, ttft_ms=ttft + i, duration_ms=80.0 + i,
                 outcome="primary" if hedged else "not_fired", started_at=utc_now(),
                 chunk_gaps_ms=[1.0, 2.5], output_tokens=None, input_tokens=7,
                 server_address=server, model=model)],
    )  # fmt: skip


# -- the store, its migrations and the report on both backends ------------------------------
def test_migrations_apply_once_and_rows_match_tables(target: str) -> None:
    with Store.open(target) as s:
        names = {r["name"] for r in s.log.query("select name from _migrations")}
        assert names == {n for n, _ in MIGRATIONS}
        assert migrate(s.log) == []
        for model, table in ((RunRow, "runs"), (TurnRow, "turns"), (StepRow, "steps"),
                             (CallRow, "calls")):  # fmt: skip
            assert set(model.model_fields) == set(s.log.table(table).columns_dict), table
    with Store.open(target, create=False) as s:  # reopening applies nothing new
        assert migrate(s.log) == []


async def test_turns_round_trip_through_the_writer(target: str) -> None:
    """Unknown stays NULL, flags come back as booleans, gaps as written; a live run lists
    its turns while running; the turn ids are the ones the turns returned."""
    with Store.open(target) as s:
        run = await s.acreate_run("live", "{}", label="t")
        ids = [await s.alog_turn(run, a_turn(i, hedged=i % 2 == 0)) for i in range(6)]
        await s.flush()
        assert [(r.status, r.n_turns) for r in s.list_runs()] == [("running", 6)]
        assert [t.id for t in s.turns(run)] == ids and len(set(ids)) == 6
        calls = s.calls(run)
        assert calls[0].output_tokens is None and calls[0].input_tokens == 7
        assert calls[0].chunk_gaps_ms == [1.0, 2.5] and calls[0].stream is True
        steps = s.steps(run)
        assert [st.hedge_fired for st in steps] == [True, False] * 3
        logged = s.turn(ids[1])
        assert logged is not None and logged.turn.output == "answer 1"
        assert logged.calls[0].ttft_ms == 21.0
        assert s.find_turn_id(run, "r3") == ids[3]
        assert await s.afinish_run(run, "complete")
        assert s.get_run(run).n_turns == 6


def test_a_text_the_database_refuses_is_logged_scrubbed(target: str) -> None:
    """A lone surrogate (both) or a NUL character (PostgreSQL's text cannot hold one)."""
    with Store.open(target) as s:
        run = s.create_run("replay", "{}")
        turn = a_turn(0)
        turn.turn.output = "cut \ud83d and \x00 nul"
        tid = s.log_turn(run, turn)
        logged = s.turn(tid)
        assert logged is not None and logged.turn.output is not None
        assert "\ufffd" in logged.turn.output and "cut" in logged.turn.output


def test_report_and_hedge_stats_read_the_same_on_both(target: str) -> None:
    with Store.open(target) as s:
        run = s.create_run("replay", "{}")
        for i in range(12):
            s.log_turn(run, a_turn(i, hedged=i < 4))
        s.finish_run(run, "complete")
        summary = latency_summary(s, run)
        stats = hedge_stats(s, run)
    assert summary["turns"]["n_completed"] == 12
    assert summary["turn"]["n"] == 12 and summary["turn"]["p50_ms"] == pytest.approx(105.5, abs=1)
    assert stats["steps"]["answer"]["n_armed"] == 4 and stats["steps"]["answer"]["n_fired"] == 4


def test_processes_writing_one_log_get_distinct_turn_ids(target: str) -> None:
    """Four processes open the same log at once (a new one: migrations race too) and
    write 40 turns each through their writer threads: 160 turns, every id once."""
    code = (
        "import asyncio, sys\n"
        "from chainrun.log.store import Store\n"
        "from chainrun.log.rows import TurnLog, TurnRow\n"
        "async def main():\n"
        "    with Store.open(sys.argv[1]) as s:\n"
        "        run = await s.acreate_run('live', '{}')\n"
        "        ids = [await s.alog_turn(run, TurnLog(TurnRow(input=str(i)))) "
        "for i in range(40)]\n"
        "        await s.flush()\n"
        "        print(' '.join(map(str, ids)))\n"
        "asyncio.run(main())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, target], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT)
        for _ in range(4)
    ]
    returned: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        returned += [int(x) for x in out.split()]
    with Store.open(target, create=False) as s:
        runs = s.list_runs()
        logged = [t.id for t in s.turns([r.id for r in runs if r.id is not None])]
    assert len(runs) == 4 and sorted(logged) == sorted(returned) and len(set(logged)) == 160


def test_live_window_in_the_database(target: str) -> None:
    """``turns_between``: the live turns of every run whose start is in [since, until)."""
    t0 = datetime(2026, 12, 1, 15, 0, tzinfo=UTC)
    with Store.open(target) as s:
        runs = [s.create_run("live", "{}") for _ in range(2)]
        for i in range(10):
            when = log_time(t0 + timedelta(minutes=i))
            s.log_turn(runs[i % 2], a_turn(i, started_at=when))
        s.log_turn(s.create_run("replay", "{}"), a_turn(99, started_at=log_time(t0)))
        got = s.turns_between("live", log_time(t0 + timedelta(minutes=2)),
                              log_time(t0 + timedelta(minutes=5)))  # fmt: skip
    assert sorted(t.input for t in got) == ["message 2", "message 3", "message 4"]
    assert {t.run_id for t in got} == set(runs)


def test_log_copy_copies_each_run_once(tmp_path: Path, target: str) -> None:
    with Store.open(tmp_path / "shop-a.db") as src:
        run = src.create_run("live", "{}")
        for i in range(3):
            src.log_turn(run, a_turn(i))
        src.finish_run(run, "complete")
    with Store.open(target) as dst:
        dst.log_turn(dst.create_run("live", "{}"), a_turn(50))  # the target is not empty
    env = {**os.environ, "CHAINRUN_DB": target}
    cmd = [sys.executable, "-m", "chainrun", "log", "copy", str(tmp_path / "shop-a.db"),
           target, "--json"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["copied"]["turns"] == 3 and doc["process"] == "shop-a"
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert json.loads(again.stdout)["copied"]["turns"] == 0  # copied before: skipped
    # every command reads CHAINRUN_DB: the copied run is listed with the target's own
    listed = subprocess.run([sys.executable, "-m", "chainrun", "runs", "--json"],
                            capture_output=True, text=True, env=env, cwd=ROOT,
                            check=False)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)["runs"]
    assert len(runs) == 2
    with Store.open(target, create=False) as dst:
        copied = dst.get_run(doc["run_ids"][str(run)])
        assert copied.meta and copied.meta["process"] == "shop-a"
        assert [t.input for t in dst.turns(copied.id or 0)] == [f"message {i}" for i in range(3)]


def test_a_database_that_cannot_be_reached_is_one_line(tmp_path: Path) -> None:
    url = "postgresql://nobody@127.0.0.1:9/none"
    done = subprocess.run([sys.executable, "-m", "chainrun", "runs", "--db", url],
                          capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to the log database" in lines[0]


def start_serve(url: str, lab: LabServer, tmp_path: Path, workers: int = 2, extra: str = ""
                ) -> tuple[subprocess.Popen[str], str]:  # fmt: skip
    """``chainrun serve --workers N`` on log ``url`` against ``lab``, ready: its /readyz
    answered 200 on 10 × N new connections in a row (the kernel spreads them over the
    workers, so every worker has most likely answered); the process and its base URL.
    ``extra``: more of the config file (TOML tables)."""
    from benchmarks._pg import free_port

    config = tmp_path / "chainrun.toml"
    config.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n{extra}')
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "serve", "--workers", str(workers), "--port",
         str(port), "--config", str(config)],
        env={**os.environ, "CHAINRUN_DB": url,
             "CHAINRUN_CATALOG_DB": str(tmp_path / "catalog.db")}, cwd=ROOT,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    if not workers_ready(base, workers):
        kill_with_workers(proc.pid)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"serve did not get ready in 60 s: {err[-2000:]}")
    return proc, base


# -- PostgreSQL only -------------------------------------------------------------------------
def test_a_retried_batch_logs_each_turn_once() -> None:
    """The commit of a batch reached the server but its answer did not: the writer runs
    the batch again; its turns are found in place and skipped whole."""
    with pg_schema(need_pg()) as url, Store.open(url) as s:
        run = s.create_run("live", "{}")
        tid = s._ids.take_sync()

        write = prepare_turn(run, a_turn(1), tid, "postgresql")
        for _ in range(2):  # the first try committed; the retry must add nothing
            with s.log.transaction():
                assert write(s.log) == tid
        assert len(s.turns(run)) == 1 and len(s.steps(run)) == 1 and len(s.calls(run)) == 1


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A private PostgreSQL server this module may stop and start."""
    need_pg()
    from benchmarks._pg import PrivateCluster

    with PrivateCluster(fsync=False) as c:
        yield c


async def test_the_database_away_for_seconds_loses_nothing_and_says_so(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real server stop (``pg_ctl stop -m fast``: every connection closed) for about 3 s
    while turns keep coming: no turn waits for the log (each alog_turn returns its id with
    the server down, the turn queued, not committed), /readyz's state says retrying, and
    after the restart every turn is in the log once."""
    caplog.set_level(logging.WARNING, logger="chainrun.log.writer")
    with Store.open(cluster.url) as s:
        run = await s.acreate_run("live", "{}")
        ids: list[int] = []

        async def turns(n: int) -> None:
            for _ in range(n):
                ids.append(await s.alog_turn(run, a_turn(len(ids))))
                await asyncio.sleep(0.02)

        await turns(10)
        await asyncio.wait_for(s.flush(), 30)
        await asyncio.to_thread(cluster.stop, "fast")
        await turns(40)  # ~1 s of turns with the server down
        # each returned its id without the server: the 40 turns wait in the writer's queue
        queued_while_down = s.log_status()["queued"]
        states = {s.log_status()["state"]}
        await asyncio.sleep(2.0)
        states.add(s.log_status()["state"])
        assert "retrying" in states
        await asyncio.to_thread(cluster.start)
        await turns(10)
        await asyncio.wait_for(s.flush(), 30)
        status = s.log_status()
        logged = [t.id for t in s.turns(run)]
    # a turn waiting for its commit would leave nothing queued; here all of the outage's 40
    # but those in the batch the writer is retrying wait in the queue
    assert queued_while_down >= 30, queued_while_down
    assert sorted(logged) == sorted(ids) and len(logged) == 60
    assert status["state"] == "ok" and status["lost_writes"] == 0 and status["outages"] >= 1
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "cannot be reached" in said and "is back after" in said


async def test_the_writer_is_back_within_seconds_of_the_servers_return(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real stop of 9.5 s, longer than the writer's patience (5 s here): a flush that
    starts once the server is back does not give up (the outage is over, the writer is
    about to commit), and the queued turns are committed within seconds of the return,
    not when a connection pool's reconnection backoff (tries about 1, 2, 4, 8 s apart:
    the next one 4 to 6 s after a 9.5 s outage) would next try."""
    caplog.set_level(logging.WARNING, logger="chainrun.log.writer")
    with Store.open(cluster.url) as s:
        assert s.writer is not None
        s.writer.close_timeout_s = 5.0
        run = await s.acreate_run("replay", "{}")
        ids = [await s.alog_turn(run, a_turn(i)) for i in range(5)]
        await asyncio.wait_for(s.flush(), 30)
        await asyncio.to_thread(cluster.stop, "fast")
        down = time.monotonic()
        while time.monotonic() - down < 9.5:  # turns keep coming while it is away
            ids.append(await s.alog_turn(run, a_turn(len(ids))))
            await asyncio.sleep(0.1)
        assert s.log_status()["state"] == "retrying"
        await asyncio.to_thread(cluster.start)
        back = time.monotonic()
        await asyncio.wait_for(s.flush(), 30)  # raised LogWriteLost when the clock stuck
        lag = time.monotonic() - back
        status = s.log_status()
        logged = [t.id for t in s.turns(run)]
    assert lag < 2.5, f"the queued turns were committed {lag:.1f} s after the server's return"
    assert status["state"] == "ok" and status["lost_writes"] == 0
    assert sorted(logged) == sorted(ids)
    (back_line,) = [r.getMessage() for r in caplog.records if "is back after" in r.getMessage()]
    outage_s = float(back_line.split("is back after ")[1].split(" s")[0])
    # from the stop, not from noticing it; the server was down until pg_ctl's start returned
    # (at load 6 that start alone took over 3 s: "back after 13.1 s" after a 9.5 s stop)
    assert 9.0 <= outage_s <= (back - down) + lag + 1.0, back_line


def test_chats_are_answered_through_a_database_restart(cluster: Any, tmp_path: Path) -> None:
    """``chainrun serve --workers 2`` on PostgreSQL under steady chat load (8 chats at
    once, each turn a new conversation id the process must look up in the log) while
    the server is stopped for 5 s and started again: every chat is answered, turns keep
    being answered while it is down, /readyz answers and says ``retrying``, the warning
    lines say it, and afterwards every turn the clients saw is in the log exactly once.
    ``[log] outage_wait_s = 1``: a turn waits out the outage's first second (a pooler's
    restart would be over), then goes on from its process's memory."""
    with pg_schema(cluster.url) as url, LabServer("lognormal", median_ms=20, sigma=0.3,
                                                  n_tokens=4) as lab:  # fmt: skip
        proc, base = start_serve(url, lab, tmp_path, extra="[log]\noutage_wait_s = 1\n")
        seen: list[dict[str, Any]] = []  # one per chat: conversation, turn id, status, when
        window: dict[str, float] = {}
        states: set[str] = set()
        try:
            async def one(client: httpx.AsyncClient, cid: str) -> None:
                chat: dict[str, Any] = {"cid": cid, "turn_id": None, "status": None}
                seen.append(chat)
                body = {"message": "a rain jacket under 100?", "conversation_id": cid}
                try:
                    async with client.stream("POST", "/chat", json=body) as resp:
                        chat["status"] = f"http_{resp.status_code}"
                        event = None
                        async for line in resp.aiter_lines():
                            if line.startswith("event:"):
                                event = line[6:].strip()
                            elif line.startswith("data:") and event == "turn":
                                data = json.loads(line[5:])
                                chat["turn_id"], chat["status"] = data["turn_id"], data["status"]
                                chat["done"] = time.monotonic()
                except httpx.HTTPError as e:
                    chat["status"] = type(e).__name__

            async def outage() -> None:
                await asyncio.sleep(1.5)
                await asyncio.to_thread(cluster.stop, "fast")
                window["down"] = time.monotonic()
                async with httpx.AsyncClient(base_url=base, timeout=2) as probe:
                    while time.monotonic() - window["down"] < 5.0:
                        try:
                            states.add((await probe.get("/readyz")).json()["log"]["state"])
                        except (httpx.HTTPError, ValueError, KeyError, TypeError):
                            states.add("no answer")
                        await asyncio.sleep(0.25)
                await asyncio.to_thread(cluster.start)
                window["up"] = time.monotonic()

            async def load() -> None:
                async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                    stop = asyncio.ensure_future(outage())

                    async def loop(w: int) -> None:
                        k = 0
                        while not stop.done() or time.monotonic() - window["up"] < 1.5:
                            await one(client, f"w{w}-t{k}")
                            k += 1

                    await asyncio.gather(stop, *(loop(w) for w in range(8)))

            asyncio.run(load())
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        with Store.open(url, create=False) as s:
            runs = s.runs_of_kind("live")
            logged = s.turns([r.id for r in runs if r.id is not None])
    failed = [c for c in seen if c["status"] != "ok"]
    assert not failed, f"{len(failed)} of {len(seen)} chats not answered: {failed[:3]}"
    while_down = [c for c in seen if window["down"] <= c["done"] <= window["up"]]
    assert len(while_down) >= 10, f"only {len(while_down)} chats answered while it was down"
    # /readyz always answered; which worker a probe reaches is the kernel's choice (one
    # keep-alive connection, and all chats can land on the other worker), so its log
    # state is "retrying" only if that worker had writes queued: the writer's own lines
    # below are what shows the outage was noticed and ended
    assert "no answer" not in states and states <= {"ok", "retrying"}, states
    assert "cannot be reached" in err and "is back after" in err
    assert "could not be read" in err  # the conversations looked up while it was down
    by_id = {t.id: t for t in logged}
    assert len(by_id) == len(logged) == len(seen)  # each turn once, no other turn
    assert {(by_id[c["turn_id"]].conversation_id) for c in seen} == {c["cid"] for c in seen}


async def test_writes_past_the_bound_are_counted_and_said(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The queue's bound during an outage: writes past it are dropped (the turn is still
    answered), counted in the status (state losing) and said in a warning."""
    caplog.set_level(logging.WARNING, logger="chainrun.log.writer")
    with Store.open(cluster.url) as s:
        assert s.writer is not None
        s.writer._queue.maxsize = 20  # a small bound for the test
        run = await s.acreate_run("live", "{}")
        await asyncio.wait_for(s.flush(), 30)
        await asyncio.to_thread(cluster.stop, "fast")
        ids = []
        for i in range(60):
            ids.append(await s.alog_turn(run, a_turn(i)))
            await asyncio.sleep(0.005)
        await asyncio.sleep(2.5)  # the writer finds the server gone (a 2 s connection wait)
        during = s.log_status()
        await asyncio.to_thread(cluster.start)
        await asyncio.wait_for(s.flush(), 30)
        after = s.log_status()
        logged = len(s.turns(run))
    assert during["state"] == "losing" and during["lost_writes"] > 0
    assert logged + after["lost_writes"] == 60  # every turn logged or counted, none silent
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "writes are being dropped" in said


async def test_a_seeded_window_hedges_the_first_call_at_the_fleets_delay(
    tmp_path: Path, target: str
) -> None:
    """A new process seeds its hedged step's window from the log's recent calls of that
    step to the same server: its very first call is hedged at the p90 of what the fleet
    logged (not at the warm-up delay; calls to another server, a replay against another
    lab say, are left out), the step row says the delay was seeded, and hedge-stats
    counts it."""
    with LabServer("lognormal", median_ms=5, sigma=0.2, n_tokens=4) as lab:
        cfg = config_from_dict({
            "order": ["answer"], "answer_step": "answer",
            "providers": {"primary": {"base_url": lab.base_url},
                          "backup": {"base_url": lab.base_url}},
            "steps": {"answer": {"provider": "primary", "prompt": "{message}", "stream": True,
                                 "max_output_tokens": 8,
                                 "hedge": {"delay": "p90", "targets": ["backup"],
                                           "min_samples": 20}}},
        })  # fmt: skip
        with Store.open(target) as s:
            fleet = s.create_run("live", "{}")
            server, model = urlsplit(lab.base_url).netloc, cfg.steps["answer"].model
            for i in range(40):  # the fleet's recent calls: TTFT 100..139 ms
                s.log_turn(fleet, a_turn(i, ttft=100.0, server=server, model=model))
                # not these: another server, another model
                s.log_turn(fleet, a_turn(i, ttft=1.0, server="10.0.0.9:8000", model=model))
                s.log_turn(fleet, a_turn(i, ttft=1.0, server=server, model="other-model"))
            s.finish_run(fleet, "complete")
            async with Chain(cfg, store=s, kind="replay", seed_windows=SeedWindows()) as chain:
                first = await chain.run_turn("hello")
            run = first.run_id
            (step,) = s.steps(run)
            stats = hedge_stats(s, run)
            async with Chain(cfg, store=s, kind="replay") as unseeded:
                plain = await unseeded.run_turn("hello")
            (plain_step,) = s.steps(plain.run_id)
    # p90 of 100..139 by nearest rank: the 36th value, 135 ms (a neighbour by another rank rule)
    assert step.hedge_delay_ms is not None and 133.0 <= step.hedge_delay_ms <= 137.0
    assert (step.detail or {}).get("hedge_delay_seeded") is True
    assert stats["steps"]["answer"]["n_seeded_delay"] == 1
    assert not (plain_step.detail or {}).get("hedge_delay_seeded")
    assert plain_step.hedge_delay_ms != pytest.approx(135.0, abs=1.0)


def test_compare_a_replay_against_the_fleets_live_window(tmp_path: Path, target: str) -> None:
    """As a new user would: two processes' live runs in one log, a replay, then
    ``chainrun compare REPLAY live --since ... --until ...`` with CHAINRUN_DB set."""
    t0 = datetime(2026, 12, 1, 15, 0, tzinfo=UTC)
    with Store.open(target) as s:
        lives = [s.create_run("live", "{}") for _ in range(2)]
        for i in range(40):
            s.log_turn(lives[i % 2], a_turn(i, started_at=log_time(t0 + timedelta(seconds=i))))
        replay = s.create_run("replay", "{}")
        for i in range(20):
            s.log_turn(replay, a_turn(i))
        s.finish_run(replay, "complete")
    env = {**os.environ, "CHAINRUN_DB": target}
    done = subprocess.run(
        [sys.executable, "-m", "chainrun", "compare", str(replay), "live", "--since",
         "2026-12-01T15:00:10", "--until", "2026-12-01T15:00:30", "--json"],
        capture_output=True, text=True, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["b"]["kind"] == "live" and doc["b"]["n_turns"] == 20
    assert sorted(doc["b"]["run_ids"]) == sorted(lives)
    bad = subprocess.run(
        [sys.executable, "-m", "chainrun", "compare", str(replay), str(replay), "--since",
         "2026-12-01"], capture_output=True, text=True, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--since/--until select a window of live traffic" in bad.stderr


def test_serve_workers_log_every_turn_once(tmp_path: Path) -> None:
    """``chainrun serve --workers 2`` on one PostgreSQL log: 40 chats, each turn logged
    exactly once, one live run per worker process, both stopped by one SIGTERM."""
    with pg_schema(need_pg()) as url, LabServer("lognormal", median_ms=5, sigma=0.2,
                                                n_tokens=4) as lab:  # fmt: skip
        proc, base = start_serve(url, lab, tmp_path)
        try:
            async def chats() -> list[int]:
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:

                    async def one(i: int) -> int:
                        r = await client.post("/v1/chat/completions", json={
                            "model": DEFAULT_MODEL_ID, "messages": [
                                {"role": "user", "content": f"jacket {i}"}]})  # fmt: skip
                        assert r.status_code == 200, r.text
                        return int(r.json()["chainrun"]["turn_id"])

                    return await asyncio.gather(*(one(i) for i in range(40)))

            turn_ids = asyncio.run(chats())
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        with Store.open(url, create=False) as s:
            runs = s.runs_of_kind("live")
            turns = s.turns([r.id for r in runs if r.id is not None])
    # a worker's live run is created by its first turn, and the kernel hands the shared
    # socket's connections to whichever worker accepts first: all 40 chats can land on one
    # (seen at load ~2); what holds either way is one run per worker that served, each
    # ended by the one SIGTERM, and every turn logged once
    pids = [(r.meta or {})["writer"]["pid"] for r in runs]
    assert 1 <= len(runs) <= 2 and len(set(pids)) == len(runs), pids
    assert {r.status for r in runs} == {"complete"}
    assert sorted(t.id for t in turns) == sorted(turn_ids) and len(set(turn_ids)) == 40


def test_processes_opening_a_new_catalogue_file_take_turns(tmp_path: Path) -> None:
    """A PostgreSQL log's catalogue file is opened one opener at a time per directory (the
    lock a SQLite log's openers take). The workers of ``serve --workers N`` open a new
    one together; the one switching it to WAL while the other was creating it failed at
    once with "database is locked" (SQLite does not wait on its busy timeout there: about
    1 in 60 opens of a new file by two processes at the same moment), and that error
    ended the worker's chain opening for good: ``/readyz`` said "starting" forever."""
    with pg_schema(need_pg()) as url:
        Store.open(url).close()
        catalogue = tmp_path / "catalog.db"
        tables: list[str] = []

        def open_catalogue() -> None:
            with Store.open(url) as s:
                s.catalog_file = catalogue
                tables.extend(s.db.table_names())

        other = os.open(tmp_path, os.O_RDONLY)
        fcntl.flock(other, fcntl.LOCK_EX)  # another process's opener is at work there
        opener = threading.Thread(target=open_catalogue)
        try:
            opener.start()
            time.sleep(1.0)
            assert tables == [] and not catalogue.exists()  # it waits its turn
        finally:
            os.close(other)  # the other opener is done
            opener.join(30)
    assert "products" in tables and "_migrations" in tables


def test_a_dropped_id_reservation_fails_its_turn_loudly() -> None:
    """The only write a turn waits for, an id reservation, failing when dropped: it raises
    LogWriteLost rather than hanging (a 4,096-id block makes that rare: 2,048 turns of
    outage per process before any turn needs a new block)."""
    with pg_schema(need_pg()) as url, Store.open(url) as s:
        assert s.writer is not None
        s.writer._queue.maxsize = 1

        async def main() -> None:
            writer = s.writer
            assert writer is not None
            writer._start()
            taken = threading.Event()

            def slow(db: Any) -> None:
                taken.set()
                time.sleep(0.5)

            writer._queue.put_nowait((slow, None, None, None))
            await asyncio.to_thread(taken.wait, 10)  # the thread took the slow job
            writer._queue.put_nowait((lambda db: None, None, None, None))  # the queue is full
            fut = writer.future(lambda db: 1)
            with pytest.raises(LogWriteLost):
                await fut
            await s.flush()

        asyncio.run(main())
        assert s.writer.dropped == 1


def test_serve_seeds_its_windows_by_default(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:  # fmt: skip
    """``chainrun serve`` seeds (measured: benchmarks/seeded_windows.py); ``--no-seed-windows``
    does not."""
    from cli_runner import chainrun

    import chainrun.serve.server as server

    got: list[Any] = []
    monkeypatch.setattr(server, "serve", lambda *a, **kw: got.append(kw.get("seed_windows")))
    db = str(tmp_path / "log.db")
    assert chainrun("serve", "--db", db).returncode == 0
    assert chainrun("serve", "--db", db, "--no-seed-windows").returncode == 0
    assert isinstance(got[0], SeedWindows) and got[1] is None


def test_a_conversation_holds_whichever_worker_takes_its_turn(tmp_path: Path) -> None:
    """``serve --workers 2`` on one PostgreSQL log, one conversation of five ``/chat``
    turns, each on a new connection (the kernel hands each to either worker): every
    answer request holds all the earlier turns, and the turn indexes are 1 to 5; then
    six turns of another conversation at once get six different indexes."""
    with pg_schema(need_pg()) as url, LabServer("fast", n_tokens=4,
                                                record_bodies=True) as lab:  # fmt: skip
        proc, base = start_serve(url, lab, tmp_path)
        messages = [f"turn {k}: a jacket in colour {k} please" for k in range(1, 6)]
        try:
            async def chat(message: str, conversation: str) -> dict[str, Any]:
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:  # new TCP
                    async with client.stream("POST", "/chat", json={
                            "message": message, "conversation_id": conversation}) as r:
                        assert r.status_code == 200
                        body = (await r.aread()).decode()
                last = [line for line in body.splitlines() if line.startswith("data: ")][-1]
                return json.loads(last[len("data: "):])

            async def talk() -> list[dict[str, Any]]:
                return [await chat(m, "fleet-conv") for m in messages]

            turns = asyncio.run(talk())

            async def at_once() -> list[dict[str, Any]]:
                return list(await asyncio.gather(*(chat(f"burst {i}", "burst-conv")
                                                   for i in range(6))))  # fmt: skip

            burst = asyncio.run(at_once())
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert [t["turn_index"] for t in turns] == [1, 2, 3, 4, 5]
        assert sorted(t["turn_index"] for t in burst) == [1, 2, 3, 4, 5, 6]
        sent = [json.dumps(r.get("messages")) for r in lab.requests()]
        for k, message in enumerate(messages):
            asked = [s for s in sent if message in s]
            assert any(all(m in s for m in messages[:k]) for s in asked), (k, asked[:1])
        with Store.open(url, create=False) as s:
            runs = s.runs_of_kind("live")
            logged = s.turns([r.id for r in runs if r.id is not None])
        mine = sorted(t.turn_index or 0 for t in logged if t.conversation_id == "fleet-conv")
        assert mine == [1, 2, 3, 4, 5]
