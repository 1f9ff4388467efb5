"""The run log's SQLite file deleted while ``chainrun serve`` serves: serve says so in one
warning line, ``/readyz``'s ``log`` says the file is gone and how many turns went with
it, and the stop ends with one error line naming them (exit 2).

Before: turns were answered on, ``/readyz``'s log said ``"state": "ok"``, and Ctrl-C
exited 0 without a word, while every turn of the live run was being written into a
deleted file that vanished with the process. A real serve process, a real lab, a real
SQLite file deleted from outside (``rm``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from test_serve_stop import _wait_ready

from chainrun.lab import LabServer


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


def test_a_log_deleted_under_serve_is_said_on_stderr_in_readyz_and_at_the_stop(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    with LabServer("lognormal", median_ms=30, sigma=0.1, n_tokens=6) as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
             "--db", str(db)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            first = proc.stderr.readline()
            found = re.search(r"(http://\S+/)", first)
            assert found, first
            url = found.group(1)
            _wait_ready(url)
            assert httpx.get(url + "readyz").json()["log"]["state"] == "ok"
            assert _chat(url, "Do you have rain jackets?", "d1") == "ok"
            for suffix in ("", "-wal", "-shm"):  # rm log.db*
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            assert _chat(url, "Which of those is cheapest?", "d1") == "ok"
            ready = httpx.get(url + "readyz")
            time.sleep(1.5)  # the periodic check had its chance to say it a second time
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
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
