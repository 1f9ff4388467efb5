"""Ctrl-C / SIGTERM of replay and eval print the partial summary and how to resume."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import Result, chainrun

from chainrun.lab import LabServer

ROOT = Path(__file__).resolve().parents[1]


REPLAY = ROOT / "replays" / "commerce-12.jsonl"





# -- 3. Ctrl-C prints the partial summary (one JSON document with --json) ----------------


def _ctrl_c_after(
    args: list[str], db: Path, tmp_path: Path, n_ok: int = 3,
    then: Callable[[Result], list[str]] | None = None,
) -> tuple[Result, Result | None]:  # fmt: skip
    """Run ``chainrun ARGS --config (a slow lab) --db DB`` as a real process and send it
    SIGINT (Ctrl-C) once ``n_ok`` turns are logged ok; then, while the lab still runs,
    ``chainrun THEN(result)`` in-process if given."""
    # slow enough that the run is far from done when n_ok turns are logged, also on a
    # loaded machine (at 150 ms a step the replay could end before the Ctrl-C)
    with LabServer("lognormal", median_ms=400, sigma=0.1, n_tokens=8) as slow:
        cfg = tmp_path / "slow.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{slow.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", *args, "--config", str(cfg), "--db", str(db),
             "--concurrency", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline, done = time.monotonic() + 60, 0
            while done < n_ok and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
                with contextlib.suppress(sqlite3.Error):  # read-only: never create the log
                    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                    try:
                        row = conn.execute("select count(*) from turns where status = 'ok'")
                        done = row.fetchone()[0]
                    finally:
                        conn.close()
            assert proc.poll() is None, f"ended before Ctrl-C: {proc.communicate()}"
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        after = chainrun(*then(Result(proc.returncode, stdout, stderr))) if then else None
    return Result(proc.returncode, stdout, stderr), after


def _printed_resume(res: Result) -> list[str]:
    """The resume command the interrupted replay printed, as a user would copy it (run
    from another folder, where no chainrun.db is: it must name the log), with
    ``--concurrency 4`` added for speed."""
    hint = re.search(r"; (chainrun replay .*) runs the rest", res.stderr)
    assert hint is not None, res.stderr
    args = shlex.split(hint.group(1))
    assert args[0] == "chainrun" and "--db" in args, args
    return [*args[1:], "--concurrency", "4"]


def test_ctrl_c_of_replay_prints_the_partial_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "log.db"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res, resumed = _ctrl_c_after(["replay", str(REPLAY), "--json"], db, tmp_path,
                                 then=_printed_resume)  # fmt: skip
    assert res.returncode == 130 and "interrupted" in res.stderr
    doc = json.loads(res.stdout)  # one JSON document, as every command prints
    assert doc["status"] == "interrupted" and doc["run_id"] == 1
    counts = doc["turns"]
    assert counts["n_completed"] >= 3 and doc["turn"]["n"] == counts["n_completed"]
    assert doc["n_turns"] < 12 and "hedging" in doc
    shown = json.loads(chainrun("show", "1", "--db", str(db), "--json").stdout)
    # after the resume every request is answered: the summary counts each request by
    # its latest turn; the log still holds the turns Ctrl-C cancelled
    assert shown["summary"]["turns"] == {**counts, "n_completed": 12, "n_cancelled": 0}
    with contextlib.closing(sqlite3.connect(db)) as con:
        (cancelled,) = con.execute("select count(*) from turns where status = 'cancelled'"
                                   ).fetchone()  # fmt: skip
    assert cancelled == counts["n_cancelled"]
    assert f"--resume {doc['run_id']} runs the rest" in res.stderr
    # text mode: the table of the turns so far, and the line saying where it stopped
    db2 = tmp_path / "log2.db"
    res, _ = _ctrl_c_after(["replay", str(REPLAY)], db2, tmp_path)
    assert res.returncode == 130
    assert "run 1 (replay, interrupted)" in res.stdout, res.stdout
    assert "completed turns" in res.stdout and "p90 of 3 values" not in res.stderr
    assert "chainrun: replay interrupted: run 1 has" in res.stderr
    # 4. after --resume: the turns Ctrl-C cancelled and the open failures inside ok turns
    # (the lab's answers are no JSON: validate fails open in every turn) are told apart
    assert resumed is not None and resumed.returncode == 0, resumed.stderr
    n_cancelled = counts["n_cancelled"]
    lines = [ln for ln in resumed.stderr.splitlines() if "warning" in ln]
    assert len(lines) == 2, resumed.stderr
    n_all = 12 + n_cancelled
    # (a turn cancelled after its validate failed open also names that failure)
    assert re.fullmatch(rf"chainrun: warning: {n_cancelled} of {n_all} turns not ok "
                        rf"\({n_cancelled} cancelled(; failed steps in them: [^)]*)?\); "
                        "see chainrun show 1", lines[0]), lines[0]  # fmt: skip
    # a turn whose whole answer had reached the caller when Ctrl-C came stays ok, its
    # validate logged cancelled (not failed open): such a turn is not run again
    with contextlib.closing(sqlite3.connect(db)) as con:
        (n_checked,) = con.execute(
            "select count(*) from steps s join turns t on t.id = s.turn_id "
            "where t.status = 'ok' and s.step = 'validate' and s.status = 'failed_open'"
        ).fetchone()  # fmt: skip
    assert n_checked >= 10, n_checked  # all but the turns in flight at the Ctrl-C (2)
    assert lines[1].startswith(f"chainrun: warning: {n_checked} of 12 ok turns answered "
                               f"with a step failed open (validate:invalid_answer "
                               f"×{n_checked}"), lines[1]  # fmt: skip


def test_ctrl_c_of_eval_prints_the_turns_so_far(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    cases = ROOT / "evals" / "regression.jsonl"
    res, _ = _ctrl_c_after(["eval", str(cases), "--json"], db, tmp_path)
    assert res.returncode == 130 and "interrupted" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "interrupted" and doc["scored"] is False
    n_cases = sum(1 for line in cases.read_text().splitlines() if line.strip())
    assert doc["turns"]["n_completed"] >= 3 and doc["n_cases"] == n_cases
    assert f"--run {doc['run_id']} scores the turns done" in doc["score_with"]


@pytest.mark.parametrize("command", ["replay", "eval"])
def test_ctrl_c_is_said_in_one_line(tmp_path: Path, command: str) -> None:
    """The line naming the run and how to go on is the whole of stderr: no bare
    ``chainrun: interrupted`` after it (before: two lines, the second saying less)."""
    source = REPLAY if command == "replay" else ROOT / "evals" / "regression.jsonl"
    res, _ = _ctrl_c_after([command, str(source)], tmp_path / "log.db", tmp_path)
    assert res.returncode == 130
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"chainrun: {command} interrupted: run 1 has "), res.stderr
    hint = "runs the rest" if command == "replay" else "scores the turns done"
    assert line.endswith(hint), line
