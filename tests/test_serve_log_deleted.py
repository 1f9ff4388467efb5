"""The run log's SQLite file deleted while ``chainrun serve`` serves: serve says so in one
warning line, ``/readyz``'s ``log`` says the file is gone and how many turns went with
it, and the stop ends with one error line naming them (exit 2).

Before: turns were answered on, ``/readyz``'s log said ``"state": "ok"``, and Ctrl-C
exited 0 without a word, while every turn of the live run was being written into a
deleted file that vanished with the process. A real serve process, a real lab, a real
SQLite file deleted from outside (``rm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from serve_helpers import kill_with_workers, workers_ready

from chainrun.lab import LabServer
from chainrun.serve.server import WorkersFailed


def _chat(url: str, message: str, conversation_id: str) -> str:
    """One ``POST /chat`` read to its end; the turn's status from its ``turn`` event."""
    with httpx.stream("POST", url + "chat", json={"message": message,
                      "conversation_id": conversation_id}, timeout=60) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        lines = list(r.iter_lines())
    found = [ln for ln in lines if ln.startswith("event: turn")]
    assert found, lines
    at = lines.index(found[-1])
    return str(json.loads(lines[at + 1].removeprefix("data: "))["status"])


@contextlib.contextmanager
def _serving(
    tmp_path: Path, db: Path, *args: str, workers: int = 1
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``chainrun serve --port 0 --db DB ARGS`` against a lab, ready (with ``workers``,
    /readyz answered 200 on 10 × ``workers`` new connections in a row: the kernel spreads
    them over the workers, so each has most likely answered); (process, base URL).
    Killed with its workers at the end if still running."""
    with LabServer("lognormal", median_ms=30, sigma=0.1, n_tokens=6) as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
             "--db", str(db), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            first = proc.stderr.readline()
            found = re.search(r"(http://\S+/)", first)
            assert found, first
            assert workers_ready(found.group(1), workers), "serve did not get ready in 60 s"
            yield proc, found.group(1)
        finally:
            if proc.poll() is None:
                kill_with_workers(proc.pid)
                proc.communicate()


def _rm_log(db: Path) -> None:
    """``rm log.db*``, as a user would."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def test_a_log_deleted_under_serve_is_said_on_stderr_in_readyz_and_at_the_stop(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    with _serving(tmp_path, db) as (proc, url):
        assert httpx.get(url + "readyz").json()["log"]["state"] == "ok"
        assert _chat(url, "Do you have rain jackets?", "d1") == "ok"
        _rm_log(db)
        assert _chat(url, "Which of those is cheapest?", "d1") == "ok"
        ready = httpx.get(url + "readyz")
        time.sleep(1.5)  # the periodic check had its chance to say it a second time
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert ready.status_code == 200  # answers still come: the backend is ready
    log = ready.json()["log"]
    assert log["state"] == "file_gone" and log["lost_turns"] == 2, log
    assert "deleted or replaced" in log["detail"]
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    warned = [ln for ln in lines if ln.startswith("chainrun: warning: ")]
    assert len(warned) == 1, stderr  # said once, not once a check
    assert warned[0].startswith(f"chainrun: warning: run log {db} was deleted or replaced "
                                "while run 1 was writing it")  # fmt: skip
    last = lines[-1]
    assert last.startswith(f"chainrun: error: run log {db} was deleted or replaced while "
                           "run 1 was writing it: its 2 turns so far")  # fmt: skip
    assert last.endswith("are lost with it"), last
    assert not db.exists()  # no new, empty log left where the deleted one was
    assert not os.path.exists(f"{db}-wal")


def test_serve_workers_exits_2_when_a_worker_said_an_error(tmp_path: Path) -> None:
    """``serve --workers 2`` with its SQLite log deleted: the worker that served says the
    error and exits 2, and the parent, which exited 0 whatever its workers did, says how
    many failed and exits 2."""
    db = tmp_path / "log.db"
    with _serving(tmp_path, db, "--workers", "2", workers=2) as (proc, url):
        assert _chat(url, "Do you have rain jackets?", "w1") == "ok"
        _rm_log(db)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    said = [ln for ln in lines if ln.startswith("chainrun: error: worker ")]
    assert len(said) == 1 and "was deleted or replaced" in said[0], stderr
    pid = said[0].split()[3].rstrip(":")
    assert f"chainrun serve: worker {pid} exited with 2" in lines, stderr
    assert lines[-1] == (f"chainrun: error: 1 of 2 worker processes ended with an error "
                         f"(worker {pid} exited 2); see each one's line above")  # fmt: skip


def test_the_parent_exits_2_for_a_workers_chainrun_error_else_with_the_worst() -> None:
    """The parent's exit code from its failed workers' codes (negative: killed by that
    signal, counted 128 + N as a shell does)."""
    assert WorkersFailed({11: 2, 12: -9}, 3).exit_code == 2
    assert WorkersFailed({11: 1, 12: -9}, 2).exit_code == 137
    assert WorkersFailed({11: 1}, 2).exit_code == 1
    said = str(WorkersFailed({11: 1, 12: -9}, 4))
    assert said.startswith("2 of 4 worker processes ended with an error (worker 11 exited 1, "
                           "worker 12 killed by signal 9)")  # fmt: skip
