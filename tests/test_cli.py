"""The CLI as a user runs it (subprocesses), against the latency lab as the model server.

Checks the JSON interfaces, one-line errors with exit code 2, and that a failed
command leaves no run marked complete.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer.main

from chainrun.cli import app
from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


def chainrun(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def runs_in(db: Path) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    with Store.open(db) as store:
        return store.list_runs()


def test_every_command_has_help_text() -> None:
    group = typer.main.get_command(app)
    names: list[tuple[str, Any]] = []
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        names.append((name, cmd))
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            names.append((f"{name} {sub_name}", sub))
    assert {"run", "replay", "runs", "show", "eval", "compare", "hedge-stats", "local lab"} - {
        n for n, _ in names
    } == {"local lab"}
    for name, cmd in names:
        assert cmd.help and len(cmd.help.strip()) > 10, name


def test_replay_json_has_the_interface_keys(lab_config: Path, tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(lab_config), "--db", str(db),
                    "--json", "--concurrency", "4", "--label", "lab")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["n_turns"] == 12 and doc["turn"]["n"] == 12
    assert {"p50_ms", "p90_ms", "n"} <= set(doc["turn"])
    for name in ("classify", "retrieve", "policy", "compose", "validate", "critique"):
        assert {"n", "p50_ms", "p90_ms"} <= set(doc["steps"][name])
    for name in ("classify", "compose", "validate", "critique"):
        assert doc["steps"][name]["n"] == 12
    # each turn took a route: the catalogue search or the shop policy (an "other" turn:
    # both, the policy's general section beside its search)
    routed = doc["steps"]["retrieve"]["n"] + doc["steps"]["policy"]["n"]
    assert 12 <= routed <= 24 and doc["steps"]["retrieve"]["n"] <= 12
    run = runs_in(db)[0]
    assert run.id == doc["run_id"] and run.status == "complete" and run.label == "lab"
    # the other read commands on that run
    shown = json.loads(chainrun("show", str(doc["run_id"]), "--db", str(db), "--json").stdout)
    assert len(shown["turns"]) == 12 and shown["turns"][0]["calls"]
    listed = json.loads(chainrun("runs", "--db", str(db), "--json").stdout)
    assert listed["runs"][0]["id"] == doc["run_id"]
    hedge = json.loads(chainrun("hedge-stats", "--db", str(db), "--json").stdout)
    assert hedge["steps"]["compose"]["n"] == 12
    assert {"fire_rate", "win_rate", "time_saved_per_win_ms", "extra_calls_per_turn", "n"} <= set(
        hedge["steps"]["compose"]
    )


def test_bad_config_is_one_line_exit_2_and_no_run(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[steps.compose]\nreasoning_effort = "extreme"\n')
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "steps.compose.reasoning_effort" in lines[0]
    assert "extreme" in lines[0] and "Traceback" not in proc.stderr
    assert runs_in(db) == []


def test_bad_replay_line_names_file_and_line(lab_config: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "message": "hi"}\n{"id": "b", "message": }\n')
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(bad), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 2
    assert f"{bad}:2" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert runs_in(db) == []
    missing = tmp_path / "missing-message.jsonl"
    missing.write_text('{"id": "a"}\n')
    proc = chainrun("replay", str(missing), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 2 and "'message'" in proc.stderr and f"{missing}:1" in proc.stderr


def test_unreachable_provider_exit_2_and_run_not_complete(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\n')
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2
    assert "cannot reach provider 'local'" in proc.stderr
    # exactly one line: no blank line first (the progress bar's, on a non-terminal stderr)
    assert len(proc.stderr.splitlines()) == 1, repr(proc.stderr)
    assert all(r.status != "complete" for r in runs_in(db))
    # the log this failed first command created holds no run: it is not left behind
    assert not db.exists() and not (tmp_path / "log.db-wal").exists()
    # an existing log is never removed, even one without runs
    Store.open(db).close()
    proc = chainrun("run", "hi", "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2 and db.exists()


def test_run_streams_answer_and_prints_table(lab_config: Path, tmp_path: Path) -> None:
    proc = chainrun("run", "a rain jacket under 100?", "--config", str(lab_config),
                    "--db", str(tmp_path / "log.db"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "compose" in proc.stdout
    doc = json.loads(chainrun("run", "hello", "--config", str(lab_config),
                              "--db", str(tmp_path / "log.db"), "--json").stdout)  # fmt: skip
    assert [s["step"] for s in doc["steps"]] == [
        "classify", "retrieve", "policy", "compose", "validate", "critique"]  # fmt: skip


def test_unknown_run_and_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    proc = chainrun("show", "99", "--db", str(db))  # a read command does not create a log
    assert proc.returncode == 2 and "no such log" in proc.stderr and not db.exists()
    Store.open(db).close()
    for args in (["show", "99"], ["show", "99999999999999999999999"], ["hedge-stats", "7"]):
        proc = chainrun(*args, "--db", str(db))
        assert proc.returncode == 2 and "no such run" in proc.stderr, args
        assert "Traceback" not in proc.stderr
    other = tmp_path / "other.db"
    import sqlite3

    with sqlite3.connect(other) as conn:
        conn.execute("create table runs (x)")
    proc = chainrun("runs", "--db", str(other))
    assert proc.returncode == 2 and "something else" in proc.stderr
    with sqlite3.connect(other) as conn:  # left untouched
        names = {r[0] for r in conn.execute("select name from sqlite_master")}
    assert names == {"runs"}
    proc = chainrun("runs", "--db", str(tmp_path / "no-such-dir" / "x.db"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite " * 200)
    proc = chainrun("runs", "--db", str(junk))
    assert proc.returncode == 2 and "not a chainrun log" in proc.stderr


def test_eval_repeat_and_compare(lab_config: Path, tmp_path: Path) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        '{"id": "c1", "message": "a jacket please",'
        ' "assert": [{"type": "contains", "value": "a"}]}\n'
        '{"id": "c2", "message": "my order?", "assert": [{"type": "max-tokens", "step": "compose",'
        ' "threshold": 100}]}\n'
    )
    db = tmp_path / "log.db"
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db),
                    "--repeat", "2", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["n_cases"] == 2 and doc["n_turns"] == 4 and 0 <= doc["pass_rate"] <= 1
    assert doc["by_type"]["max-tokens"]["n"] == 2 and doc["by_type"]["contains"]["n"] == 2
    assert doc["flip"]["n_cases"] == 2
    assert len(doc["verdicts"]) == 4 and {"case_id", "passed", "grader"} <= set(doc["verdicts"][0])
    rid = str(doc["run_id"])
    same = json.loads(chainrun("compare", rid, rid, "--db", str(db), "--json").stdout)
    assert same["turn"]["verdict"] == "inconclusive"
    assert same["turn"]["a"]["n"] == 4 and same["turn"]["a"]["p90_ci"] is None
    proc = chainrun("compare", rid, rid, "--db", str(db), "--fail-on-regression", "any")
    assert proc.returncode == 0
    bad = tmp_path / "bad-cases.jsonl"
    bad.write_text('{"id": "x", "message": "m", "assert": [{"type": "no-such-type"}]}\n')
    proc = chainrun("eval", str(bad), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 2 and f"{bad}:1" in proc.stderr


def test_sigterm_marks_the_run_interrupted_and_logs_cancelled_turns(tmp_path: Path) -> None:
    import signal
    import time

    with LabServer("lognormal", median_ms=5000, sigma=0.01) as slow:
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{slow.base_url}"\n')
        db = tmp_path / "log.db"
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "replay", str(REPLAY), "--config", str(cfg),
             "--db", str(db), "--concurrency", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(slow.requests()) < 2:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "terminated" in stderr
    (run,) = runs_in(db)
    assert run.status == "interrupted" and run.n_turns == 2
    with Store.open(db) as store:
        assert {t.status for t in store.turns(run.id)} == {"cancelled"}
