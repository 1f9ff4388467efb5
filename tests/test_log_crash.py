"""The log under a crash: kill -9 mid-replay, the next open marks the run interrupted,
``--resume`` runs only the missing requests into the same run; a reader while a replay
writes; a log from the previous schema upgraded in place."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chainrun.analysis.summary import latency_summary, run_detail
from chainrun.lab import LabServer
from chainrun.log.migrations import MIGRATIONS, migrate
from chainrun.log.store import Store

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "log-schema-002.db"
N_REQUESTS = 200


def _env() -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chainrun", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())  # fmt: skip


def _setup(tmp_path: Path, lab: LabServer) -> tuple[Path, Path, Path]:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(
        'order = ["answer"]\nanswer_step = "answer"\n'
        f'[providers.lab]\nbase_url = "{lab.base_url}"\n'
        '[steps.answer]\nprovider = "lab"\nprompt = "{message}"\nstream = true\n'
        "max_output_tokens = 8\ndeadline_s = 10\n",
        encoding="utf-8",
    )
    replay = tmp_path / "many.jsonl"
    replay.write_text(
        "".join(json.dumps({"id": f"r{i:03d}", "message": f"request {i}"}) + "\n"
                for i in range(N_REQUESTS)),
        encoding="utf-8",
    )  # fmt: skip
    return cfg, replay, tmp_path / "log.db"


def _count(db: Path, sql: str) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    except sqlite3.OperationalError:
        return 0  # not created yet
    try:
        return int(conn.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # tables not created yet
    finally:
        conn.close()


def test_kill_9_mid_replay_then_resume(tmp_path: Path) -> None:
    # 200 ms per turn: a 200-turn replay takes 20 s at concurrency 2, killed after 20 turns
    with LabServer("fast", n_tokens=10, per_token_ms=20) as lab:
        cfg, replay, db = _setup(tmp_path, lab)
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "replay", str(replay), "--config", str(cfg),
             "--db", str(db), "--json", "--concurrency", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        readers = 0
        shown: subprocess.Popen[str] | None = None
        try:
            while _count(db, "select count(*) from turns") < 20:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "replay too slow to start"
                if db.exists() and _count(db, "select count(*) from runs"):
                    # a concurrent reader while the replay writes: never "database is locked"
                    with Store.open(db, create=False) as store:
                        run_id = store.latest_run_id()
                        assert run_id is not None
                        latency_summary(store, run_id)
                        run_detail(store, run_id)
                    readers += 1
                    if shown is None:  # and a reader in another process
                        shown = subprocess.Popen(
                            [sys.executable, "-m", "chainrun", "show", "1", "--db", str(db),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())  # fmt: skip
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
            if proc.stderr:
                proc.stderr.close()
        assert readers > 0 and shown is not None
        out, err = shown.communicate(timeout=120)
        assert shown.returncode == 0 and "locked" not in err, err
        assert json.loads(out)["id"] == 1
        assert proc.returncode == -signal.SIGKILL

        # the next open tells the truth: interrupted, not running; committed turns intact
        with Store.open(db) as store:
            run = store.get_run(1)
            assert run.status == "interrupted" and run.ended_at is not None
            turns = store.turns(1)
            steps, calls = store.steps(1), store.calls(1)
            assert store.db.execute("pragma integrity_check").fetchone()[0] == "ok"
        committed = [t for t in turns if t.status != "cancelled"]
        assert 20 <= len(turns) < N_REQUESTS
        assert run.n_turns == len(turns)
        assert {t.status for t in turns} == {"ok"}  # a kill leaves no half-written turn
        assert sorted(s.turn_id for s in steps) == sorted(t.id for t in turns)
        assert sorted(c.turn_id for c in calls) == sorted(t.id for t in turns)

        lab.reset()
        resumed = _cli("replay", str(replay), "--db", str(db), "--resume", "1", "--json",
                       "--concurrency", "8")
        assert resumed.returncode == 0, resumed.stderr
        # only the missing requests were sent, into the same run
        assert len(lab.requests()) == N_REQUESTS - len(committed)
        with Store.open(db, create=False) as store:
            run = store.get_run(1)
            turns = store.turns(1)
            assert store.list_runs()[0].id == 1  # no new run
        ids = [t.request_id for t in turns if t.status != "cancelled"]
        assert sorted(ids) == [f"r{i:03d}" for i in range(N_REQUESTS)]
        assert run.status == "complete" and run.n_turns == len(turns)
        again = _cli("replay", str(replay), "--db", str(db), "--resume", "1", "--json")
        assert again.returncode == 0 and len(lab.requests()) == N_REQUESTS - len(committed)


def test_resume_refuses_a_run_still_running_and_a_config(tmp_path: Path) -> None:
    with LabServer("fast", n_tokens=2) as lab:
        cfg, replay, db = _setup(tmp_path, lab)
        replay.write_text('{"id": "a", "message": "hi"}\n', encoding="utf-8")
        with Store.open(db) as store:
            store.create_run("replay", "{}", source=str(replay))  # this process is alive
        r = _cli("replay", str(replay), "--db", str(db), "--resume", "1")
        assert r.returncode == 2 and "still running" in r.stderr
        r = _cli("replay", str(replay), "--db", str(db), "--resume", "1", "--config", str(cfg))
        assert r.returncode == 2 and "--resume uses the run's own config" in r.stderr


def test_a_dead_writers_run_is_marked_interrupted_on_open(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        run_id = store.create_run("replay", "{}")
        meta = dict(store.get_run(run_id).meta or {})
        meta["writer"]["pid"] = 2**22 + 12345  # beyond pid_max: no such process
        store.db.execute("update runs set meta = ? where id = ?", [json.dumps(meta), run_id])
        store.db.conn.commit()
        live = store.create_run("replay", "{}")  # this process: alive, left running
    with Store.open(db, create=False) as store:
        assert store.get_run(run_id).status == "interrupted"
        assert store.get_run(live).status == "running"


# -- migrations ------------------------------------------------------------------------


def _rows(db: sqlite3.Connection, table: str) -> list[tuple[Any, ...]]:
    return db.execute(f"select * from {table} order by id").fetchall()


def test_a_log_from_the_previous_schema_is_upgraded_in_place(tmp_path: Path) -> None:
    """tests/fixtures/log-schema-002.db was written by chainrun with migrations 001-002
    (and the catalogue's 010): 2 runs, 5 turns. Opening it upgrades it in place, keeps
    every row, and migrations run once."""
    db = tmp_path / "old.db"
    shutil.copy(FIXTURE, db)
    before = sqlite3.connect(db)
    old = {t: _rows(before, t) for t in ("runs", "turns", "steps", "calls")}
    before.close()
    assert [len(v) for v in old.values()] == [2, 5, 10, 10]
    with Store.open(db) as store:
        names = [r["name"] for r in store.db.table("_migrations").rows]
        assert sorted(names) == sorted(n for n, _ in MIGRATIONS)  # every known one, once
        assert names[:3] == ["001_initial", "002_fired_late", "010_catalog"]  # the old log's
        assert len(names) > 3  # and the newer ones were applied to it in place
        assert migrate(store.db) == []  # forward only, and only once
        for table, rows in old.items():
            new = store.db.execute(f"select * from {table} order by id").fetchall()
            assert len(new) == len(rows)
            # the old columns keep their values (new columns may follow)
            assert [r[: len(rows[0])] for r in new] == rows
        assert store.get_run(1).status == "complete"
    with Store.open(db) as store:  # a second open applies nothing more
        assert len(list(store.db.table("_migrations").rows)) == len(names)


@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture missing")
def test_fixture_is_a_chainrun_log() -> None:
    conn = sqlite3.connect(f"file:{FIXTURE}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("select name from _migrations order by name")]
    finally:
        conn.close()
    assert names[:2] == ["001_initial", "002_fired_late"]
